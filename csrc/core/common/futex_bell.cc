#include "core/common/futex_bell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <ctime>
#include <utility>

namespace ringx {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the futex word must be a plain 32-bit word");
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "peers read the waitsFor bits in shared memory");

namespace {

// Not FUTEX_PRIVATE: the word lives in memory that other processes map.
long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

uint64_t bitOf(int areaRank) { return uint64_t{1} << (unsigned(areaRank) % 64); }

void bump(BellWord& w) {
  w.seq.fetch_add(1, std::memory_order_seq_cst);
  w.rung.fetch_add(1, std::memory_order_relaxed);
  futex(&w.seq, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace

FutexBell::FutexBell(std::vector<BellWord*> words, int me) : words_(std::move(words)), me_(me) {}

void FutexBell::setGroupRanks(const std::vector<int>& groupRanks) {
  int most = -1;
  for (int g : groupRanks) most = std::max(most, g);
  areaOf_.assign(size_t(most + 1), -1);
  for (size_t p = 0; p < groupRanks.size(); ++p) areaOf_[size_t(groupRanks[p])] = int(p);
}

uint64_t FutexBell::maskOf(const std::vector<int>& groupRanks) const {
  if (groupRanks.empty()) return kAnyone;
  uint64_t mask = 0;
  for (int g : groupRanks) {
    const int p =
        areaOf_.empty() ? g : (g >= 0 && size_t(g) < areaOf_.size() ? areaOf_[size_t(g)] : -1);
    if (p < 0 || p >= int(words_.size())) return kAnyone;
    mask |= bitOf(p);
  }
  return mask;
}

// Every rank's registration is read, including this rank's own (a poll of
// one op may wait for a move made by another op's step on this rank). The
// loads cost little while nobody sleeps: the lines stay shared in the cache.
void FutexBell::ring() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint64_t mine = bitOf(me_);
  for (BellWord* w : words_) {
    if (w->sleepers.load(std::memory_order_relaxed) != 0 &&
        (w->waitsFor.load(std::memory_order_relaxed) & mine)) {
      bump(*w);
    }
  }
}

void FutexBell::wakeOwn() { bump(*words_[size_t(me_)]); }

uint32_t FutexBell::arm(uint64_t waitsFor) {
  BellWord& own = *words_[size_t(me_)];
  {
    std::lock_guard<std::mutex> lock(armMu_);
    own.waitsFor.fetch_or(waitsFor, std::memory_order_seq_cst);
    own.sleepers.fetch_add(1, std::memory_order_seq_cst);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return own.seq.load(std::memory_order_seq_cst);
}

void FutexBell::sleep(uint32_t seen, std::chrono::microseconds max) {
  if (max.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = time_t(max.count() / 1000000);
  ts.tv_nsec = long(max.count() % 1000000) * 1000;
  futex(&words_[size_t(me_)]->seq, FUTEX_WAIT, seen, &ts);
}

void FutexBell::disarm() {
  BellWord& own = *words_[size_t(me_)];
  std::lock_guard<std::mutex> lock(armMu_);
  if (own.sleepers.fetch_sub(1, std::memory_order_seq_cst) == 1)
    own.waitsFor.store(0, std::memory_order_relaxed);
}

}  // namespace ringx
