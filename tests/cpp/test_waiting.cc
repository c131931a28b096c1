// Waiting that yields the core: the per-rank doorbells a sleeper is woken
// through only by the ranks it waits for, and the spin decision that leaves
// the CPUs to ranks that can move when they are fewer than the ranks.
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "core/common/futex_bell.h"
#include "core/common/spin_policy.h"
#include "core/engine/spin_gauge.h"

using namespace ringx;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// Three ranks' bells in plain memory (the futex works on any mapping).
struct Bells {
  std::array<BellWord, 3> words;
  std::array<std::atomic<uint64_t>, 3> counters{};
  FutexBell bell(int r) { return FutexBell({&words[0], &words[1], &words[2]}, r); }
  void move(FutexBell& bell, int r, uint64_t to) {
    counters[size_t(r)].store(to, std::memory_order_release);
    bell.ring();
  }
};

// As the engine waits: arm for `mask`, look again, sleep unless done. Counts
// the times the sleep ended before `done` held.
int sleepUntil(FutexBell& bell, uint64_t mask, const std::function<bool()>& done,
               std::chrono::microseconds max) {
  int early = 0;
  for (;;) {
    const uint32_t seen = bell.arm(mask);
    if (done()) {
      bell.disarm();
      return early;
    }
    bell.sleep(seen, max);
    bell.disarm();
    if (!done()) ++early;
  }
}

void waitUntilAsleep(const BellWord& w) {
  const auto until = Clock::now() + 10s;
  while (w.sleepers.load() == 0 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(w.sleepers.load() == 1);
  // Registered is not yet inside the futex: give it the moment to get there.
  std::this_thread::sleep_for(20ms);
}

}  // namespace

TEST_CASE("a sleeper on rank A's bell is not woken by rank B's unrelated counter move") {
  Bells b;
  FutexBell a = b.bell(0), waitedFor = b.bell(1), other = b.bell(2);
  std::atomic<int> early{-1};
  const auto start = Clock::now();
  std::thread sleeper([&] {
    early = sleepUntil(
        a, a.maskOf({1}), [&] { return b.counters[1].load() >= 1; }, 20s);
  });
  waitUntilAsleep(b.words[0]);
  const uint32_t seq = b.words[0].seq.load();
  for (uint64_t k = 1; k <= 20; ++k) {
    b.move(other, 2, k);
    std::this_thread::sleep_for(1ms);
  }
  CHECK(b.words[0].seq.load() == seq);
  b.move(waitedFor, 1, 1);
  sleeper.join();
  CHECK(early == 0);
  CHECK(Clock::now() - start < 10s);
}

TEST_CASE("a sleeper that cannot say whom it waits for is woken by any rank's counter move") {
  Bells b;
  FutexBell a = b.bell(0), other = b.bell(2);
  std::thread sleeper([&] {
    sleepUntil(
        a, a.maskOf({}), [&] { return b.counters[2].load() >= 1; }, 20s);
  });
  waitUntilAsleep(b.words[0]);
  const auto moved = Clock::now();
  b.move(other, 2, 1);
  sleeper.join();
  CHECK(Clock::now() - moved < 5s);
}

TEST_CASE("a rank's own wake-up reaches its sleeper, and no peer's") {
  Bells b;
  FutexBell a = b.bell(0), peer = b.bell(1);
  std::atomic<bool> handed{false};
  std::thread sleeper([&] {
    sleepUntil(
        a, a.maskOf({2}), [&] { return handed.load(); }, 20s);
  });
  std::thread other([&] {
    sleepUntil(
        peer, peer.maskOf({2}), [&] { return handed.load(); }, 20s);
  });
  waitUntilAsleep(b.words[0]);
  waitUntilAsleep(b.words[1]);
  const uint32_t peerSeq = b.words[1].seq.load();
  handed = true;
  a.wakeOwn();
  sleeper.join();
  CHECK(b.words[1].seq.load() == peerSeq);
  peer.wakeOwn();
  other.join();
}

TEST_CASE("no counter move is lost between a sleeper's registration and its sleep") {
  // Two ranks hand a token back and forth, each sleeping until the other
  // moves; a lost ring would cost a whole 5 s sleep.
  constexpr uint64_t kRounds = 20000;
  Bells b;
  const auto start = Clock::now();
  auto rank = [&](int r) {
    FutexBell bell = b.bell(r);
    const int peer = 1 - r;
    for (uint64_t k = 1; k <= kRounds; ++k) {
      const uint64_t want = r == 0 ? k - 1 : k;
      sleepUntil(
          bell, bell.maskOf({peer}), [&] { return b.counters[size_t(peer)].load() >= want; }, 5s);
      b.move(bell, r, k);
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  CHECK(Clock::now() - start < 4s);
}

TEST_CASE(
    "maskOf names area ranks through the group's ranks, and anyone for a rank outside the area") {
  Bells b;
  FutexBell bell = b.bell(0);
  CHECK(bell.maskOf({0, 2}) == 0b101);
  bell.setGroupRanks({4, 9, 6});
  CHECK(bell.maskOf({9}) == 0b010);
  CHECK(bell.maskOf({6, 4}) == 0b101);
  CHECK(bell.maskOf({5}) == FutexBell::kAnyone);
  CHECK(bell.maskOf({}) == FutexBell::kAnyone);
}

TEST_CASE(
    "spin decision auto gives 0 when this host's ranks outnumber its CPUs, 50 us when each has "
    "one") {
  CHECK(decideSpin(std::nullopt, 2, 8).spin == 0us);
  CHECK(decideSpin(std::nullopt, 2, 3).spin == 0us);
  CHECK(decideSpin(std::nullopt, 2, 2).spin == kSpinWithOwnCore);
  CHECK(decideSpin(std::nullopt, 64, 8).spin == kSpinWithOwnCore);
  CHECK(decideSpin(std::nullopt, 2, 8).why.find("sleeps at once") != std::string::npos);
  // auto also gauges the spin on the network; a fixed value does not.
  CHECK(decideSpin(std::nullopt, 64, 8).gaugeNetwork);
  CHECK_FALSE(decideSpin(50us, 64, 8).gaugeNetwork);
  // An explicit value wins either way.
  CHECK(decideSpin(20us, 2, 8).spin == 20us);
  CHECK(decideSpin(0us, 64, 2).spin == 0us);
  CHECK(cpusAvailable() >= 1);
}

TEST_CASE(
    "the network spin gauge stops the spin after long waits and brings it back once short waits "
    "are half of the recent ones") {
  SpinGauge g(50us);
  REQUIRE(g.worthSpinning());
  int longWaits = 0;
  while (g.worthSpinning()) {
    g.record(2ms);
    ++longWaits;
  }
  // One slow wait does not stop it; a run of them does.
  CHECK(longWaits > 3);
  CHECK(longWaits < 10);
  g.record(50us);  // exactly the budget counts as short
  int shortWaits = 1;
  while (!g.worthSpinning()) {
    g.record(10us);
    ++shortWaits;
  }
  CHECK(shortWaits < 10);
  for (int i = 0; i < 50; ++i) g.record(std::chrono::microseconds(i % 2 ? 10 : 5000));
  CHECK(g.shortShare() > 0.3);
  CHECK(g.shortShare() < 0.7);
}

TEST_CASE("a gauge for no spin never spins, whatever the waits") {
  SpinGauge g(0us);
  CHECK_FALSE(g.worthSpinning());
  g.record(0us);
  CHECK_FALSE(g.worthSpinning());
}
