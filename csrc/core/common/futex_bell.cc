#include "core/common/futex_bell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace ringx {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the futex word must be a plain 32-bit word");

namespace {

// Not FUTEX_PRIVATE: the word lives in memory that other processes map.
long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

// The add and the load are sequentially consistent, as is the sleeper's
// registration: either this ring sees the sleeper, or the sleeper's kernel
// compare sees the new sequence number.
void FutexBell::ring() {
  word_->seq.fetch_add(1, std::memory_order_seq_cst);
  if (word_->sleepers.load(std::memory_order_seq_cst) != 0) futex(&word_->seq, FUTEX_WAKE, INT_MAX, nullptr);
}

void FutexBell::sleep(uint32_t seen, std::chrono::microseconds max) {
  if (max.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = time_t(max.count() / 1000000);
  ts.tv_nsec = long(max.count() % 1000000) * 1000;
  word_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  futex(&word_->seq, FUTEX_WAIT, seen, &ts);
  word_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace ringx
