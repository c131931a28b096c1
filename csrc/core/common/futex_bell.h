// Doorbells in shared memory, one per rank of an area, each in its owner's
// control block. A thread whose only work is waiting for peers to move
// shared-memory counters sleeps on its own rank's bell, having said which
// ranks it waits for; a rank that moves a counter rings the bells of the
// sleepers that wait for it, and no others. With one bell for the whole area
// every counter move woke every sleeper of every rank, and on a host with
// more ranks than cores those wake-ups took the cores the ranks that could
// move needed.
//
// Sleeping misses no ring: the sleeper registers (arm), then looks at the
// counters again, then sleeps unless its bell's sequence word moved since
// arm; the ringer stores its counter, then reads the registrations. Both
// sides put a sequentially consistent fence between their write and their
// read, so either the ringer sees the registration and bumps the word (which
// the kernel compares before it sleeps), or the sleeper's second look sees
// the counter.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

namespace ringx {

struct BellWord {
  std::atomic<uint32_t> seq{0};       // the futex word
  std::atomic<uint32_t> sleepers{0};  // this rank's threads armed or asleep
  // Bit p % 64: a sleeper waits for area rank p. Above 64 ranks two ranks
  // share a bit, which costs a sleeper a spurious wake-up, never a lost one.
  std::atomic<uint64_t> waitsFor{0};
  // Times the bell was rung (a futex wake, whether or not the sleeper had
  // reached the kernel yet): what a call costs the sleepers, for tests.
  std::atomic<uint64_t> rung{0};
};

class FutexBell {
 public:
  static constexpr uint64_t kAnyone = ~uint64_t{0};

  // `words[p]` is area rank p's bell; `me` is this rank's.
  FutexBell(std::vector<BellWord*> words, int me);

  // Group rank of each area rank, when the area serves part of a group.
  void setGroupRanks(const std::vector<int>& groupRanks);
  // The waitsFor bits of these group ranks; kAnyone when the list is empty
  // or names a rank outside the area (nobody knows who will ring).
  uint64_t maskOf(const std::vector<int>& groupRanks) const;

  // After this rank moved a counter: wakes the sleepers that wait for it.
  void ring();
  // Wakes this rank's own sleepers: work handed over inside the process.
  void wakeOwn();

  // arm(), look at the counters again, then sleep(seen) unless they moved;
  // disarm() after either. Returns the `seen` for sleep.
  uint32_t arm(uint64_t waitsFor);
  void sleep(uint32_t seen, std::chrono::microseconds max);
  void disarm();

  // What peers and tests can see of area rank p's bell.
  const BellWord& word(int areaRank) const { return *words_[size_t(areaRank)]; }

 private:
  std::vector<BellWord*> words_;
  int me_;
  std::vector<int> areaOf_;  // group rank -> area rank, -1 outside; empty: the same
  // Arming and disarming by two threads of this rank must not lose one's
  // waitsFor bits when the other clears them.
  std::mutex armMu_;
};

}  // namespace ringx
