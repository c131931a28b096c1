// Callers that progress the communicator themselves (Communicator::drive),
// the hand-over between them and the progress thread, and the shared-memory
// doorbell a waiting rank sleeps on. Run under TSan by `make test-sanitize`.
#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "core/transport/loopback/loopback_transport.h"
#include "core/transport/shm/shm_area.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// Threads as ranks, each with its shared-memory area and the area's doorbell
// wired into its communicator, as the torch adapter does.
struct BellWorld {
  BellWorld(int size, std::chrono::microseconds spin, bool gaugeNetworkSpin = false)
      : world(makeLoopbackWorld(size)), areas(size) {
    onEachRank(size, [&](int r) { areas[r] = ShmArea::create(store, "d", r, size, 4096); });
    for (int r = 0; r < size; ++r) {
      CommOptions o;
      o.spin = spin;
      o.gaugeNetworkSpin = gaugeNetworkSpin;
      o.bell = areas[r]->bell();
      comms.push_back(std::make_unique<Communicator>(std::move(world.transports[r]), o));
    }
  }
  ~BellWorld() { comms.clear(); }

  LoopbackWorld world;
  MemoryStore store;
  std::vector<std::unique_ptr<ShmArea>> areas;
  std::vector<std::unique_ptr<Communicator>> comms;
};

// An all_reduce whose completion sets `done`.
struct Pending {
  std::vector<float> buf;
  std::atomic<bool> done{false};
  std::optional<Error> error;
};

// Submits `s`, whose completion sets `p`.
void submitInto(Communicator& comm, const std::string& name, uint64_t seq, Schedule s, Pending& p) {
  auto op = std::make_unique<Op>(name, seq, std::move(s));
  Pending* pp = &p;
  op->onDone = [pp](const Error* e) {
    if (e) pp->error = *e;
    pp->done = true;
  };
  comm.submit(std::move(op));
}

void submitAllReduce(Communicator& comm, ShmArea* area, int r, int size, uint64_t seq, Pending& p) {
  CollArgs a{Collective::AllReduce, r, size, seq};
  a.op = ReduceOp::Sum;
  a.buf = p.buf.data();
  a.count = p.buf.size();
  a.shm = area;
  submitInto(comm, "all_reduce", seq, buildAllReduceShm(a), p);
}

// drive() answers Busy when the progress lock stays taken for 200 us, as one
// pass of the progress thread can under a sanitizer; the caller tries again.
Communicator::Drive driveAgainWhileBusy(Communicator& comm, const std::function<bool()>& done,
                                        std::optional<Clock::time_point> until = std::nullopt) {
  for (;;) {
    const auto r = comm.drive(done, until);
    if (r != Communicator::Drive::Busy) return r;
    if (done()) return Communicator::Drive::Done;
    std::this_thread::sleep_for(100us);
  }
}

// Drives until the op is done, as WorkRingx::wait does.
void waitDriving(Communicator& comm, Pending& p) {
  driveAgainWhileBusy(comm, [&] { return p.done.load(); });
}

float sumOf(int size, int base) {
  float s = 0;
  for (int q = 0; q < size; ++q) s += float(q + base);
  return s;
}

// `rounds` all_reduces on `w`'s ranks, rank 1 arriving `late` in each, every
// rank driving its own; returns rank 0's time for them all, in ms.
int64_t allReduceRoundsWithLatePeer(BellWorld& w, int rounds, std::chrono::microseconds late) {
  constexpr int size = 2;
  std::atomic<int64_t> earlyRankMs{0};
  onEachRank(size, [&](int r) {
    auto start = Clock::now();
    for (int k = 0; k < rounds; ++k) {
      if (r == 1) std::this_thread::sleep_for(late);
      Pending p;
      p.buf.assign(16, float(r + k));
      submitAllReduce(*w.comms[r], w.areas[r].get(), r, size, uint64_t(k + 1), p);
      waitDriving(*w.comms[r], p);
      RANK_REQUIRE_NO_ERROR(p.error);
      RANK_REQUIRE(p.buf[0] == sumOf(size, k));
    }
    if (r == 0) {
      earlyRankMs =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    }
  });
  return earlyRankMs;
}

}  // namespace

TEST_CASE("a caller that drives the communicator completes its op and every op submitted before it") {
  auto size = GENERATE(2, 3);
  CAPTURE(size);
  BellWorld w(size, 20us);
  constexpr int kOps = 40;
  onEachRank(size, [&](int r) {
    std::vector<Pending> ops(kOps);
    for (int k = 0; k < kOps; ++k) {
      ops[k].buf.assign(size_t(100 + k * 37), float(r + k));
      submitAllReduce(*w.comms[r], w.areas[r].get(), r, size, uint64_t(k + 1), ops[k]);
    }
    waitDriving(*w.comms[r], ops.back());
    for (int k = 0; k < kOps; ++k) {
      RANK_REQUIRE(ops[k].done);
      RANK_REQUIRE_NO_ERROR(ops[k].error);
      const float want = sumOf(size, k);
      for (float v : ops[k].buf) {
        if (v != want) RANK_FAIL("rank " << r << " op " << k << " got " << v << " want " << want);
      }
    }
  });
}

TEST_CASE("several threads of a rank drive one communicator at once and each sees its own op complete") {
  constexpr int size = 2, kThreads = 4, kRounds = 25;
  BellWorld w(size, 10us);
  onEachRank(size, [&](int r) {
    for (int round = 0; round < kRounds; ++round) {
      std::vector<Pending> ops(kThreads);
      for (int t = 0; t < kThreads; ++t) {
        ops[t].buf.assign(size_t(1 + t * 300), float(r + t));
        submitAllReduce(*w.comms[r], w.areas[r].get(), r, size, uint64_t(round * kThreads + t + 1), ops[t]);
      }
      // The waiters race for the communicator; the last op's waiter may win
      // first and so finish the others' ops for them.
      std::vector<std::thread> waiters;
      for (int t = kThreads - 1; t >= 0; --t) waiters.emplace_back([&, t] { waitDriving(*w.comms[r], ops[t]); });
      for (auto& th : waiters) th.join();
      for (int t = 0; t < kThreads; ++t) {
        RANK_REQUIRE(ops[t].done);
        RANK_REQUIRE_NO_ERROR(ops[t].error);
        RANK_REQUIRE(ops[t].buf.front() == sumOf(size, t));
        RANK_REQUIRE(ops[t].buf.back() == sumOf(size, t));
      }
    }
  });
}

TEST_CASE("ops nobody waits on are finished by the progress thread") {
  constexpr int size = 2;
  BellWorld w(size, 5us);
  onEachRank(size, [&](int r) {
    Pending p;
    p.buf.assign(1000, float(r));
    // Rank 1 joins late, so rank 0's op cannot finish inline in submit.
    if (r == 1) std::this_thread::sleep_for(20ms);
    submitAllReduce(*w.comms[r], w.areas[r].get(), r, size, 1, p);
    auto deadline = Clock::now() + 20s;
    while (!p.done && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    RANK_REQUIRE(p.done);
    RANK_REQUIRE_NO_ERROR(p.error);
    RANK_REQUIRE(p.buf[999] == 1.0f);
  });
}

TEST_CASE("a rank asleep on the doorbell wakes when its peer arrives, not at its sleep's time limit") {
  // A missed ring costs the sleeper its whole nap (up to 100 ms); 20 rounds
  // in which the peer arrives 5 ms late would then take over 2 s.
  BellWorld w(2, 1us);
  const int64_t earlyRankMs = allReduceRoundsWithLatePeer(w, 20, 5ms);
  CAPTURE(earlyRankMs);
  REQUIRE(earlyRankMs < 1500);
}

TEST_CASE("a driver gives up at its own limit and after an abort, and the op still ends with an error") {
  constexpr int size = 2;
  BellWorld w(size, 5us);
  Pending p;
  p.buf.assign(8, 1.0f);
  // Only rank 0 calls: the op cannot complete.
  submitAllReduce(*w.comms[0], w.areas[0].get(), 0, size, 1, p);
  REQUIRE(driveAgainWhileBusy(*w.comms[0], [&] { return p.done.load(); }, Clock::now() + 30ms) ==
          Communicator::Drive::TimedOut);
  REQUIRE_FALSE(p.done);
  std::thread aborter([&] {
    std::this_thread::sleep_for(20ms);
    w.comms[0]->abort("test abort");
  });
  auto r = driveAgainWhileBusy(*w.comms[0], [&] { return p.done.load(); });
  aborter.join();
  REQUIRE((r == Communicator::Drive::Stopped || r == Communicator::Drive::Done));
  REQUIRE(p.done);
  REQUIRE(p.error);
  REQUIRE(p.error->kind() == ErrorKind::Aborted);
  REQUIRE(w.comms[0]->drive([&] { return false; }) == Communicator::Drive::Stopped);
}

TEST_CASE("a rank asleep waiting for one peer is not woken by another peer's counter moves") {
  constexpr int size = 3;
  BellWorld w(size, 0us);
  ShmArea& area = *w.areas[0];
  Schedule s(DType::F32, ReduceOp::Sum);
  s.poll([&area] { return area.counter(1).load(std::memory_order_acquire) >= 1; },
         [&area] {
           return area.counter(1).load(std::memory_order_acquire) >= 1 ? std::vector<int>{}
                                                                       : std::vector<int>{1};
         });
  std::atomic<bool> done{false};
  auto op = std::make_unique<Op>("wait_for_rank_1", 1, std::move(s));
  op->callerWaits = true;
  op->onDone = [&done](const Error*) { done = true; };
  w.comms[0]->submit(std::move(op));
  std::thread driver([&] { driveAgainWhileBusy(*w.comms[0], [&] { return done.load(); }); });

  const BellWord& bell = area.bell()->word(0);
  for (auto until = Clock::now() + 10s; bell.sleepers.load() == 0 && Clock::now() < until;) {
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(20ms);
  const uint32_t seq = bell.seq.load();
  for (uint64_t k = 1; k <= 20; ++k) {
    w.areas[2]->counter(2).store(k, std::memory_order_release);
    w.areas[2]->ring();
    std::this_thread::sleep_for(1ms);
  }
  CHECK(bell.seq.load() == seq);
  w.areas[1]->counter(1).store(1, std::memory_order_release);
  w.areas[1]->ring();
  driver.join();
  CHECK(done);
  // Woken by rank 1's ring, not by its nap's time limit.
  CHECK(bell.seq.load() != seq);
}

TEST_CASE(
    "eight ranks that sleep at once instead of spinning lose no wake-up over many all_reduces") {
  // Each rank waits for the others twice per call, asleep: a lost ring
  // costs a waiter its nap's limit (100 ms), so 300 calls would take 30 s.
  constexpr int size = 8, kOps = 300;
  BellWorld w(size, 0us);
  const auto start = Clock::now();
  onEachRank(size, [&](int r) {
    for (int k = 0; k < kOps; ++k) {
      Pending p;
      p.buf.assign(size_t(1 + k % 50), float(r + k));
      submitAllReduce(*w.comms[r], w.areas[r].get(), r, size, uint64_t(k + 1), p);
      waitDriving(*w.comms[r], p);
      RANK_REQUIRE_NO_ERROR(p.error);
      RANK_REQUIRE(p.buf[0] == sumOf(size, k));
    }
  });
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  CAPTURE(ms);
  REQUIRE(ms < 10000);
}

namespace {

// One float from rank 1 to rank 0 per round, rank 1 sending `late` after
// rank 0 began to wait; both drive their op to the end.
void exchangeRounds(std::vector<std::unique_ptr<Communicator>>& comms, int rounds,
                    std::chrono::microseconds late, uint64_t firstSeq) {
  onEachRank(2, [&](int r) {
    for (int k = 0; k < rounds; ++k) {
      const uint64_t seq = firstSeq + uint64_t(k);
      Pending p;
      p.buf.assign(1, float(r == 1 ? k : -1));
      Schedule s(DType::F32, ReduceOp::Sum);
      if (r == 0) {
        s.recv(1, collTag(seq, 0), p.buf.data(), sizeof(float));
      } else {
        std::this_thread::sleep_for(late);
        s.send(0, collTag(seq, 0), p.buf.data(), sizeof(float));
      }
      submitInto(*comms[size_t(r)], "exchange", seq, std::move(s), p);
      waitDriving(*comms[size_t(r)], p);
      RANK_REQUIRE_NO_ERROR(p.error);
      RANK_REQUIRE(p.buf[0] == float(k));
    }
  });
}

}  // namespace

TEST_CASE(
    "with the network spin gauged (auto), a rank whose waits for the network outlast the spin "
    "stops spinning on them; with a fixed spin it keeps spinning") {
  const bool gauged = GENERATE(true, false);
  CAPTURE(gauged);
  auto world = makeLoopbackWorld(2);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& t : world.transports) {
    CommOptions o;
    o.spin = 50us;
    o.gaugeNetworkSpin = gauged;
    comms.push_back(std::make_unique<Communicator>(std::move(t), o));
  }
  REQUIRE(comms[0]->spinsOnNetwork());
  // Each of rank 0's waits lasts at least 3 ms, 60 times its spin.
  exchangeRounds(comms, 12, 3ms, 1);
  CHECK(comms[0]->spinsOnNetwork() == !gauged);
  // Rank 1 never waited: its sends complete as it posts them.
  CHECK(comms[1]->spinsOnNetwork());
}

TEST_CASE(
    "with the network spin gauged, waits on peers' shared-memory counters keep the spin, however "
    "long they last") {
  BellWorld w(2, 50us, true);
  allReduceRoundsWithLatePeer(w, 12, 3ms);
  CHECK(w.comms[0]->spinsOnNetwork());
}

namespace {

std::vector<std::string> progressThreadIds() {
  std::vector<std::string> ids;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name == "ringx-progress") ids.push_back(task.path().filename().string());
  }
  return ids;
}

long voluntarySwitches(const std::string& tid) {
  std::ifstream status("/proc/self/task/" + tid + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(24));
  }
  return -1;
}

}  // namespace

TEST_CASE("a communicator with no op pending is not woken by each message a peer sends it") {
  auto world = makeLoopbackWorld(2);
  CommOptions o;
  o.spin = 50us;
  auto idle = std::make_unique<Communicator>(std::move(world.transports[0]), o);
  // The thread names itself once it runs.
  std::vector<std::string> ids = progressThreadIds();
  for (auto giveUp = Clock::now() + 5s; ids.size() != 1 && Clock::now() < giveUp;
       ids = progressThreadIds()) {
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(ids.size() == 1);
  const std::string tid = ids.front();
  auto sender = std::make_unique<Communicator>(std::move(world.transports[1]), o);
  std::this_thread::sleep_for(20ms);
  const long switches = voluntarySwitches(tid);
  REQUIRE(switches >= 0);
  // 60 messages 2 ms apart, none of which rank 0 has asked for yet: it
  // looks at the network every 100 ms meanwhile, about twice.
  constexpr int kMessages = 60;
  std::vector<float> payload(kMessages);
  for (int k = 0; k < kMessages; ++k) {
    payload[size_t(k)] = float(k);
    Schedule s(DType::F32, ReduceOp::Sum);
    s.send(0, collTag(uint64_t(k + 1), 0), &payload[size_t(k)], sizeof(float));
    RANK_REQUIRE_NO_ERROR(runOp(*sender, "send", uint64_t(k + 1), std::move(s)));
    std::this_thread::sleep_for(2ms);
  }
  const long woken = voluntarySwitches(tid) - switches;
  CAPTURE(woken);
  CHECK(woken < kMessages / 2);
  // Asked for now, every message is there.
  std::vector<float> got(kMessages, -1.0f);
  for (int k = 0; k < kMessages; ++k) {
    Schedule s(DType::F32, ReduceOp::Sum);
    s.recv(1, collTag(uint64_t(k + 1), 0), &got[size_t(k)], sizeof(float));
    RANK_REQUIRE_NO_ERROR(runOp(*idle, "recv", uint64_t(k + 1), std::move(s)));
  }
  CHECK(got == payload);
}
