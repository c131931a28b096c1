// Whole collectives over the in-process transport, one thread per rank.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <numeric>
#include <thread>

#include "core/select/select.h"
#include "core/transport/loopback/loopback_transport.h"
#include "sweep.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

const Algorithm& algorithmNamed(Collective coll, std::string_view name) {
  for (const auto& alg : algorithms()) {
    if (alg.coll == coll && alg.name == name) return alg;
  }
  RANK_FAIL("no algorithm " << name);
  throw;
}

// Rank r's element i: small integers, so float sums are exact.
float input(int rank, size_t i) { return float((rank + 1) * 3 + int(i % 11)); }

}  // namespace

TEST_CASE("all_reduce sum and max agree with the closed form for every algorithm, size and count") {
  auto algName = GENERATE(as<std::string>{}, "ring", "recursive_doubling", "rabenseifner");
  auto size = GENERATE(sweep<int>({1, 2, 3, 4, 5, 7, 8}, {1, 2, 3, 4, 7}));
  auto count = GENERATE(sweep<size_t>({0, 1, 7, 1003, 100003}, {0, 1, 1003, 100003}));
  auto op = GENERATE(ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg);
  CAPTURE(algName, size, count, reduceOpName(op));
  const Algorithm& alg = algorithmNamed(Collective::AllReduce, algName);
  auto comms = makeWorld(size);
  onEachRank(size, [&](int r) {
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = input(r, i);
    CollArgs a{Collective::AllReduce, r, size, 7};
    a.dtype = DType::F32;
    a.op = op;
    a.buf = buf.data();
    a.count = count;
    a.segmentBytes = 4096;  // many segments, so pipelining and slot reuse run
    auto err = runOp(*comms[r], "all_reduce", 7, alg.build(a));
    RANK_REQUIRE_FALSE(err);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < size; ++q) want = op == ReduceOp::Max ? std::max(want, input(q, i)) : want + input(q, i);
      if (op == ReduceOp::Avg) want /= size;
      if (std::fabs(buf[i] - want) > 1e-5f * std::fabs(want)) {
        RANK_FAIL("rank " << r << " element " << i << " got " << buf[i] << " want " << want);
      }
    }
  });
}

TEST_CASE("broadcast by the tree and by the chain delivers the root's buffer to every rank, from every root") {
  auto build = GENERATE(&buildBroadcastBinomial, &buildBroadcastChain);
  auto size = GENERATE(1, 2, 3, 5, 8);
  auto count = GENERATE(size_t{0}, size_t{1}, size_t{1003}, size_t{65537});
  CAPTURE(build == &buildBroadcastChain ? "chain" : "binomial", size, count);
  auto comms = makeWorld(size);
  for (int root = 0; root < size; ++root) {
    onEachRank(size, [&](int r) {
      std::vector<int32_t> buf(count, r == root ? 0 : -1);
      if (r == root) std::iota(buf.begin(), buf.end(), root * 1000);
      CollArgs a{Collective::Broadcast, r, size, uint64_t(root)};
      a.dtype = DType::I32;
      a.buf = buf.data();
      a.count = count;
      a.root = root;
      a.segmentBytes = 1024;
      RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "broadcast", root, build(a)));
      RANK_REQUIRE_EACH(i, count, buf[i] == int32_t(root * 1000 + i));
    });
  }
}

TEST_CASE("several outstanding all_reduces with distinct sequence numbers all complete") {
  const int size = 4, ops = 6;
  auto comms = makeWorld(size);
  onEachRank(size, [&](int r) {
    std::vector<std::vector<float>> bufs(ops, std::vector<float>(5000, float(r)));
    std::vector<std::future<bool>> done;
    for (int k = 0; k < ops; ++k) {
      auto p = std::make_shared<std::promise<bool>>();
      done.push_back(p->get_future());
      CollArgs a{Collective::AllReduce, r, size, uint64_t(k)};
      a.buf = bufs[k].data();
      a.count = bufs[k].size();
      a.segmentBytes = 2048;
      auto op = std::make_unique<Op>("all_reduce", k, buildAllReduceRing(a));
      op->onDone = [p](const Error* e) { p->set_value(e == nullptr); };
      comms[r]->submit(std::move(op));
    }
    for (int k = ops - 1; k >= 0; --k) {
      bool ok = done[k].get();
      RANK_REQUIRE(ok);
    }
    for (auto& b : bufs) RANK_REQUIRE(b[4999] == 6.0f);
  });
}

TEST_CASE("a rank that never joins makes the others time out naming it") {
  const int size = 3;
  auto comms = makeWorld(size, 300ms);
  onEachRank(size, [&](int r) {
    if (r == 2) return;
    std::vector<float> buf(100, 1.0f);
    CollArgs a{Collective::AllReduce, r, size, 1};
    a.buf = buf.data();
    a.count = buf.size();
    auto t0 = std::chrono::steady_clock::now();
    auto err = runOp(*comms[r], "all_reduce", 1, buildAllReduceRing(a));
    auto took = std::chrono::steady_clock::now() - t0;
    RANK_REQUIRE(err);
    RANK_REQUIRE(err->kind() == ErrorKind::Timeout);
    std::string what = err->what();
    RANK_REQUIRE_SAYING(what, what.rfind("ringx: all_reduce (rank " + std::to_string(r) + ", seq 1): Timed out", 0) == 0);
    RANK_REQUIRE_SAYING(what, what.find("rank(s)") != std::string::npos);
    RANK_REQUIRE_SAYING(what, took < 2s);
    // The communicator is poisoned: later ops fail at once with the cause.
    auto again = runOp(*comms[r], "broadcast", 2, buildBroadcastBinomial(a));
    RANK_REQUIRE_SAYING(what, again);
    RANK_REQUIRE_SAYING(what, std::string(again->what()).find("failed earlier") != std::string::npos);
  });
}

TEST_CASE("a dead peer fails every survivor's pending operation with a closed error naming it") {
  const int size = 3;
  auto world = makeLoopbackWorld(size);
  auto comms = communicatorsOver(world, 2s);
  onEachRank(size, [&](int r) {
    if (r == 1) {
      std::this_thread::sleep_for(100ms);
      world.kill(1);
      return;
    }
    std::vector<float> buf(100, 1.0f);
    CollArgs a{Collective::AllReduce, r, size, 1};
    a.buf = buf.data();
    a.count = buf.size();
    auto err = runOp(*comms[r], "all_reduce", 1, buildAllReduceRing(a));
    RANK_REQUIRE(err);
    std::string what = err->what();
    // Rank 2 receives from the dead rank; rank 0 only waits on rank 2. Both
    // learn of the death at the next peer check instead of at the timeout.
    RANK_REQUIRE_SAYING(what, err->kind() == ErrorKind::PeerClosed);
    RANK_REQUIRE_SAYING(what, what.find("connection to rank 1 closed") != std::string::npos);
  });
}

TEST_CASE("a peer that finished its part and left does not fail a call the others still complete") {
  const int size = 3;
  auto world = makeLoopbackWorld(size);
  auto comms = communicatorsOver(world, 5s);
  std::atomic<bool> left{false};
  onEachRank(size, [&](int r) {
    float mine = float(r + 1);
    std::vector<float> got(2, 0.0f);
    Schedule s(DType::F32, ReduceOp::Sum);
    if (r == 0) {
      s.recv(2, 7, &got[1], sizeof(float));
      s.recv(1, 7, &got[0], sizeof(float));
    } else {
      s.send(0, 7, &mine, sizeof(float));
    }
    if (r == 1) {
      // Rank 2 has delivered its part and gone before rank 1 sends.
      while (!left) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(300ms);  // three peer checks
    }
    auto err = runOp(*comms[r], "gather", 1, std::move(s));
    RANK_REQUIRE_SAYING((err ? err->what() : ""), !err);
    if (r == 2) {
      std::this_thread::sleep_for(100ms);  // its message has reached rank 0
      world.kill(2);
      left = true;
      return;
    }
    if (r == 0) {
      RANK_REQUIRE(got[0] == 2.0f);
      RANK_REQUIRE(got[1] == 3.0f);
    }
    // A call that needs the departed rank fails at the next peer check.
    Schedule again(DType::F32, ReduceOp::Sum);
    again.recv(2, 8, &got[0], sizeof(float));
    const auto t0 = std::chrono::steady_clock::now();
    auto err2 = runOp(*comms[r], "gather", 2, std::move(again));
    RANK_REQUIRE(err2);
    RANK_REQUIRE_SAYING(err2->what(), err2->kind() == ErrorKind::PeerClosed);
    RANK_REQUIRE_SAYING(err2->what(), std::string(err2->what()).find("connection to rank 2 closed") != std::string::npos);
    RANK_REQUIRE(std::chrono::steady_clock::now() - t0 < 1s);
  });
}

TEST_CASE("a call still receives what a peer sent before it left") {
  auto world = makeLoopbackWorld(2);
  auto comms = communicatorsOver(world, 5s);
  // Rank 1 sends its whole part and is gone before rank 0 starts a call that
  // receives it in a chain, each receive posted once the one before is done:
  // the messages are there, so the call completes.
  const int n = 32;
  std::vector<float> sent(n), got(n, 0.0f);
  std::iota(sent.begin(), sent.end(), 1.0f);
  Schedule out(DType::F32, ReduceOp::Sum);
  for (int i = 0; i < n; ++i) out.send(0, uint64_t(i), &sent[i], sizeof(float));
  auto sendErr = runOp(*comms[1], "gather", 1, std::move(out));
  REQUIRE_FALSE(sendErr);
  world.kill(1);
  Schedule in(DType::F32, ReduceOp::Sum);
  StepId prev = kNoStep;
  for (int i = 0; i < n; ++i) prev = in.recv(1, uint64_t(i), &got[i], sizeof(float), {prev});
  auto err = runOp(*comms[0], "gather", 1, std::move(in));
  REQUIRE_FALSE(err);
  CHECK(got == sent);
  // What the peer never sent fails at once, naming it.
  Schedule more(DType::F32, ReduceOp::Sum);
  more.recv(1, 99, &got[0], sizeof(float));
  auto err2 = runOp(*comms[0], "gather", 2, std::move(more));
  REQUIRE(err2);
  CHECK(std::string(err2->what()).find("connection to rank 1 closed") != std::string::npos);
}

TEST_CASE("a shared-memory step goes on after a peer it does not wait on left, and fails at once when it does") {
  auto world = makeLoopbackWorld(3);
  auto comms = communicatorsOver(world, 20s);
  world.kill(1);
  // Rank 0's step waits on rank 2, which rank 1 served before it left (its
  // counter already there): the step completes once rank 2 is there too.
  std::atomic<bool> rank2There{false};
  Schedule onSurvivor(DType::F32, ReduceOp::Sum);
  onSurvivor.poll([&] { return rank2There.load(); },
                  [&] { return rank2There.load() ? std::vector<int>{} : std::vector<int>{2}; });
  std::thread arrives([&] {
    std::this_thread::sleep_for(300ms);
    rank2There = true;
  });
  auto err = runOp(*comms[0], "all_gather", 1, std::move(onSurvivor));
  arrives.join();
  REQUIRE_FALSE(err);
  // A step that waits on the dead rank fails at once, naming it, not at the
  // grace period's end (1 s here) or the timeout.
  Schedule onDead(DType::F32, ReduceOp::Sum);
  onDead.poll([] { return false; }, [] { return std::vector<int>{1}; });
  const auto start = std::chrono::steady_clock::now();
  auto err2 = runOp(*comms[0], "all_gather", 2, std::move(onDead));
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE(err2);
  CHECK(std::string(err2->what()).find("connection to rank 1 closed") != std::string::npos);
  CHECK(took < 800ms);
}

TEST_CASE("ranks passing different element counts get a size error, not an overrun") {
  const int size = 2;
  auto comms = makeWorld(size, 2s);
  onEachRank(size, [&](int r) {
    std::vector<float> buf(r == 0 ? 10 : 20, 1.0f);
    CollArgs a{Collective::Broadcast, r, size, 3};
    a.buf = buf.data();
    a.count = buf.size();
    auto err = runOp(*comms[r], "broadcast", 3, buildBroadcastBinomial(a));
    if (r == 1) {
      RANK_REQUIRE(err);
      RANK_REQUIRE(std::string(err->what()).find("different sizes") != std::string::npos);
    }
  });
}

// Each rank first tells every other how many elements it will send, then
// sends them; the receives learn their length from the first messages.
TEST_CASE("a transfer sized by an earlier step of its op moves the length set before it is posted") {
  const int size = GENERATE(1, 2, 4);
  CAPTURE(size);
  auto comms = makeWorld(size, 5s);
  onEachRank(size, [&](int r) {
    auto countOf = [](int q) { return size_t(q * 5000 + 3); };
    std::vector<int32_t> mine(countOf(r));
    std::iota(mine.begin(), mine.end(), r * 100000);
    const size_t n = static_cast<size_t>(size);
    std::vector<uint64_t> counts(n, 0);
    counts[size_t(r)] = mine.size();
    std::vector<std::vector<int32_t>> got(n);
    std::vector<LateExtent> extents(n);
    Schedule s(DType::I32, ReduceOp::Sum);
    std::vector<StepId> told;
    for (int p = 0; p < size; ++p) {
      if (p == r) continue;
      s.send(p, collTag(9, 0), &counts[size_t(r)], sizeof(uint64_t));
      told.push_back(s.recv(p, collTag(9, 0), &counts[size_t(p)], sizeof(uint64_t)));
    }
    const StepId sized = s.poll(
        [&] {
          for (int p = 0; p < size; ++p) {
            if (p == r) continue;
            got[size_t(p)].resize(counts[size_t(p)]);
            extents[size_t(p)] = {got[size_t(p)].data(), got[size_t(p)].size() * sizeof(int32_t)};
          }
          return true;
        },
        nullptr, {s.join(told)});
    for (int p = 0; p < size; ++p) {
      if (p == r) continue;
      s.send(p, collTag(9, 1), mine.data(), mine.size() * sizeof(int32_t));
      s.recvLate(p, collTag(9, 1), &extents[size_t(p)], {sized});
    }
    RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "sized_late", 9, std::move(s)));
    for (int p = 0; p < size; ++p) {
      if (p == r) continue;
      RANK_REQUIRE(got[size_t(p)].size() == countOf(p));
      RANK_REQUIRE_EACH(i, countOf(p), got[size_t(p)][i] == int32_t(p * 100000 + i));
    }
  });
}

TEST_CASE("RINGX_ALGO overrides the cost model and rejects unknown names") {
  CollArgs a{Collective::AllReduce, 0, 4, 0};
  a.count = 1 << 24;
  RANK_REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "rabenseifner");
  a.size = 3;  // one rank folded in: the halving's bandwidth no longer pays
  RANK_REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "ring");
  a.size = 4;
  a.count = 4;
  RANK_REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "recursive_doubling");
  RANK_REQUIRE(selectAlgorithm(a, AlgoOverride("ring")).name == "ring");
  RANK_REQUIRE(selectAlgorithm(a, AlgoOverride("all_reduce:ring,broadcast:binomial")).name == "ring");
  REQUIRE_THROWS_WITH(AlgoOverride("nope"), Catch::Contains("names no algorithm"));
  REQUIRE_THROWS_WITH(AlgoOverride("all_reduce:binomial"), Catch::Contains("choose from: ring"));
}

TEST_CASE("an op the engine ends early withdraws what it exposed before its caller hears of it") {
  // A poll step that never completes, so the op times out, and one that does.
  for (bool finishes : {false, true}) {
    auto comms = makeWorld(1, 100ms);
    Schedule s(DType::F32, ReduceOp::Sum);
    s.poll([finishes] { return finishes; }, nullptr);
    auto withdrawn = std::make_shared<std::atomic<bool>>(false);
    s.onAbandon([withdrawn](const std::string&) { withdrawn->store(true); });
    auto promise = std::make_shared<std::promise<std::pair<bool, bool>>>();
    auto op = std::make_unique<Op>("broadcast", 1, std::move(s));
    // What the caller sees at the moment it gets its buffer back.
    op->onDone = [promise, withdrawn](const Error* e) { promise->set_value({e != nullptr, withdrawn->load()}); };
    auto seen = promise->get_future();
    comms[0]->submit(std::move(op));
    auto [failed, withdrawnFirst] = seen.get();
    CHECK(failed == !finishes);
    CHECK(withdrawnFirst == !finishes);
  }
}

TEST_CASE("all_gather by the ring and by bruck puts every rank's block in place, in and out of place") {
  auto algName = GENERATE(as<std::string>{}, "ring", "bruck");
  auto size = GENERATE(1, 2, 3, 4, 5, 6, 7, 8, 9);
  auto count = GENERATE(size_t{0}, size_t{1}, size_t{1003});
  auto inPlace = GENERATE(false, true);
  CAPTURE(algName, size, count, inPlace);
  const Algorithm& alg = algorithmNamed(Collective::AllGather, algName);
  auto comms = makeWorld(size);
  onEachRank(size, [&](int r) {
    std::vector<int32_t> out(count * size_t(size), -1);
    std::vector<int32_t> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = int32_t(r * 100000 + i);
    if (inPlace) {
      std::copy(mine.begin(), mine.end(), out.begin() + std::ptrdiff_t(count * size_t(r)));
    }
    CollArgs a{Collective::AllGather, r, size, 3};
    a.dtype = DType::I32;
    a.buf = out.data();
    a.input = inPlace ? out.data() + count * size_t(r) : mine.data();
    a.count = count;
    a.segmentBytes = 1024;
    RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "all_gather", 3, alg.build(a)));
    RANK_REQUIRE_EACH(i, out.size(), out[i] == int32_t((i / count) * 100000 + i % count));
  });
}

TEST_CASE("bruck all_gather sends ceil(log2 n) rounds, and runs across hosts only when forced") {
  for (int size : {2, 3, 5, 8, 13}) {
    CollArgs a{Collective::AllGather, 1, size, 1};
    a.dtype = DType::F32;
    std::vector<float> out(size_t(size) * 4);
    a.buf = out.data();
    a.count = 4;
    int sends = 0;
    const Schedule sched = buildAllGatherBruck(a);
    for (const Step& st : sched.steps()) sends += st.kind == StepKind::Send;
    const int rounds = int(std::ceil(std::log2(size)));
    CAPTURE(size, sends, rounds);
    // A round's run travels as two messages where it wraps past the last block.
    REQUIRE(sends >= rounds);
    REQUIRE(sends <= 2 * rounds);
  }
  CollArgs a{Collective::AllGather, 0, 8, 1};
  a.crossHost = true;
  a.segmentBytes = 1 << 20;
  for (size_t count : {size_t{1}, size_t{1024}, size_t{8} << 20}) {
    a.count = count;
    CAPTURE(count);
    REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "ring");
    REQUIRE(selectAlgorithm(a, AlgoOverride("all_gather:bruck")).name == "bruck");
  }
}
