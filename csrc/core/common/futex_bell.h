// A doorbell in shared memory: a thread whose only work is waiting for peers
// to move a shared-memory counter sleeps on it instead of spinning, and a
// rank that moves a counter rings it. Ringing costs one atomic add unless a
// thread sleeps; sleeping misses no ring that happened after `seen()` was
// read, because the kernel compares the sequence word before it sleeps.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ringx {

struct BellWord {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
};

class FutexBell {
 public:
  explicit FutexBell(BellWord* word) : word_(word) {}

  // Read before looking at the counters; sleep(seen) returns at once if the
  // bell rang since.
  uint32_t seen() const { return word_->seq.load(std::memory_order_seq_cst); }
  void ring();
  void sleep(uint32_t seen, std::chrono::microseconds max);

 private:
  BellWord* word_;
};

}  // namespace ringx
