// Ranks that call different collectives (kind, root, reduce op, dtype or
// size) must never return wrong data: either every rank's result is right
// (the calls were compatible) or the ranks that can see the mismatch fail,
// after which the group is rebuilt. Whole worlds of threads over the
// loopback transport (the network algorithms) and over in-process shared
// memory (the intra-host ones), the algorithm chosen as the torch layer
// chooses it, with the identity checks it adds.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "core/algorithms/identity.h"
#include "core/select/select.h"
#include "core/transport/loopback/loopback_transport.h"
#include "core/transport/shm/cma.h"
#include "core/transport/shm/shm_area.h"
#include "sweep.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

// One rank's call.
struct Spec {
  Collective coll = Collective::AllReduce;
  size_t count = 16;  // elements of one block
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
};

std::string describeSpec(const Spec& s) {
  return std::string(collectiveName(s.coll)) + "(" + std::to_string(s.count) + " " +
         std::string(dtypeName(s.dtype)) + " " + std::string(reduceOpName(s.op)) + " root " +
         std::to_string(s.root) + ")";
}

// Rank q's element i of any input: small integers, exact in every dtype used.
double inputValue(int q, size_t i) { return double((q + 1) * 3 + int(i % 11)); }

double get(const std::vector<std::byte>& b, DType t, size_t i) {
  switch (t) {
    case DType::F64: { double v; std::memcpy(&v, b.data() + 8 * i, 8); return v; }
    case DType::I32: { int32_t v; std::memcpy(&v, b.data() + 4 * i, 4); return v; }
    default: { float v; std::memcpy(&v, b.data() + 4 * i, 4); return v; }
  }
}

void put(std::vector<std::byte>& b, DType t, size_t i, double v) {
  switch (t) {
    case DType::F64: { std::memcpy(b.data() + 8 * i, &v, 8); return; }
    case DType::I32: { int32_t x = int32_t(v); std::memcpy(b.data() + 4 * i, &x, 4); return; }
    default: { float x = float(v); std::memcpy(b.data() + 4 * i, &x, 4); return; }
  }
}

std::vector<std::byte> filled(int rank, DType t, size_t n) {
  std::vector<std::byte> b(n * dtypeSize(t));
  for (size_t i = 0; i < n; ++i) put(b, t, i, inputValue(rank, i));
  return b;
}

double combine(ReduceOp op, double acc, double v) {
  return op == ReduceOp::Max ? std::max(acc, v) : acc + v;
}

// Rank r's expected output element i had every rank called `s`.
double expected(const Spec& s, int r, int n, size_t i) {
  auto reduced = [&](size_t at) {
    double acc = inputValue(0, at);
    for (int q = 1; q < n; ++q) acc = combine(s.op, acc, inputValue(q, at));
    return s.op == ReduceOp::Avg ? acc / n : acc;
  };
  switch (s.coll) {
    case Collective::AllReduce: return reduced(i);
    case Collective::Reduce: return r == s.root ? reduced(i) : inputValue(r, i);
    case Collective::ReduceScatter: return reduced(r * s.count + i);
    case Collective::Broadcast: return inputValue(s.root, i);
    case Collective::AllGather:
    case Collective::Gather: return inputValue(int(i / s.count), i % s.count);
    case Collective::Scatter: return inputValue(s.root, r * s.count + i);
    case Collective::AllToAll: return inputValue(int(i / s.count), r * s.count + i % s.count);
    case Collective::Barrier: return 0;
  }
  return 0;
}

enum class Outcome { Correct, Wrong, Failed, TimedOut };

struct RankResult {
  Outcome outcome;
  std::string detail;
};

// Runs rank r's call and checks its output against the reference of its own
// spec.
RankResult runCall(Communicator& comm, ShmArea* shm, const Cma* cma, int r, int n, uint64_t seq, const Spec& s,
                   std::chrono::milliseconds timeout) {
  const size_t es = dtypeSize(s.dtype), block = s.count;
  std::vector<std::byte> in, out;
  CollArgs a{s.coll, r, n, seq};
  a.dtype = s.dtype;
  a.op = s.op;
  a.root = s.root;
  a.count = block;
  a.segmentBytes = 1024;
  a.shm = shm;
  a.cma = cma;
  size_t outElems = 0;
  switch (s.coll) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::Reduce:
      out = filled(r, s.dtype, block);
      a.buf = out.data();
      outElems = block;
      break;
    case Collective::AllGather:
      in = filled(r, s.dtype, block);
      out.assign(n * block * es, std::byte{0xee});
      a.input = in.data();
      a.buf = out.data();
      outElems = n * block;
      break;
    case Collective::ReduceScatter:
      in = filled(r, s.dtype, n * block);
      out.assign(block * es, std::byte{0xee});
      a.input = in.data();
      a.buf = out.data();
      outElems = block;
      break;
    case Collective::AllToAll:
      in = filled(r, s.dtype, n * block);
      out.assign(n * block * es, std::byte{0xee});
      for (int q = 0; q < n; ++q) {
        a.sendOffsets.push_back(q * block * es);
        a.sendBytes.push_back(block * es);
      }
      a.recvOffsets = a.sendOffsets;
      a.recvBytes = a.sendBytes;
      a.evenSplits = true;
      a.count = n * block;
      a.input = in.data();
      a.buf = out.data();
      outElems = n * block;
      break;
    case Collective::Gather:
      in = filled(r, s.dtype, block);
      a.input = in.data();
      if (r == s.root) {
        out.assign(n * block * es, std::byte{0xee});
        a.buf = out.data();
        outElems = n * block;
      }
      break;
    case Collective::Scatter:
      if (r == s.root) {
        in = filled(r, s.dtype, n * block);
        a.input = in.data();
      }
      out.assign(block * es, std::byte{0xee});
      a.buf = out.data();
      outElems = block;
      break;
    case Collective::Barrier: break;
  }
  // With CMA, the single-copy algorithms wherever a collective has one, and
  // the slot ones for the others, so that both kinds meet on one chunk.
  const Algorithm& alg = selectAlgorithm(a, AlgoOverride(cma ? "cma" : ""));
  auto err = runOp(comm, std::string(collectiveName(s.coll)), seq, buildChecked(alg, a), timeout);
  if (err) {
    return {err->kind() == ErrorKind::Timeout ? Outcome::TimedOut : Outcome::Failed, err->what()};
  }
  for (size_t i = 0; i < outElems; ++i) {
    const double want = expected(s, r, n, i), got = get(out, s.dtype, i);
    if (std::abs(got - want) > 1e-5 * std::max(1.0, std::abs(want))) {
      return {Outcome::Wrong, "rank " + std::to_string(r) + " " + describeSpec(s) + " via " +
                                  std::string(alg.name) + ": element " + std::to_string(i) + " is " +
                                  std::to_string(got) + ", want " + std::to_string(want)};
    }
  }
  return {Outcome::Correct, ""};
}

// Communicators over loopback transports, with shared-memory areas when
// `withShm` (then the torch layer's choice of algorithm takes the
// intra-host ones) and single-copy reads between them when `withCma`.
struct World {
  World(int size, bool withShm, bool withCma = false) : size(size) {
    auto lw = makeLoopbackWorld(size);
    if (withShm) {
      areas.resize(size);
      cmas.resize(size);
      onEachRank(size, [&](int r) {
        areas[r] = ShmArea::create(store, "m", r, size, 4096);
        if (withCma) cmas[r] = Cma::create(store, "m", r, size, CmaMode::On);
      });
    }
    CommOptions o;
    o.timeout = 20s;
    for (auto& t : lw.transports) comms.push_back(std::make_unique<Communicator>(std::move(t), o));
  }
  ~World() { comms.clear(); }
  ShmArea* shm(int r) const { return areas.empty() ? nullptr : areas[r].get(); }
  const Cma* cma(int r) const { return cmas.empty() ? nullptr : cmas[r].get(); }

  int size;
  MemoryStore store;
  std::vector<std::unique_ptr<ShmArea>> areas;
  std::vector<std::unique_ptr<Cma>> cmas;
  std::vector<std::unique_ptr<Communicator>> comms;
};

std::vector<RankResult> runTrial(World& w, uint64_t seq, const std::vector<Spec>& specs,
                                 std::chrono::milliseconds timeout) {
  std::vector<RankResult> results(w.size);
  onEachRank(w.size, [&](int r) {
    results[r] = runCall(*w.comms[r], w.shm(r), w.cma(r), r, w.size, seq, specs[r], timeout);
  });
  return results;
}

}  // namespace

TEST_CASE("all_reduce on one rank and all_gather on the other fail on both, naming both calls") {
  auto withShm = GENERATE(false, true);
  CAPTURE(withShm);
  World w(2, withShm);
  Spec ar, ag;
  ag.coll = Collective::AllGather;
  auto results = runTrial(w, 1, {ar, ag}, 5s);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r, results[r].detail);
    REQUIRE(results[r].outcome == Outcome::Failed);
    REQUIRE_THAT(results[r].detail, Catch::Contains("called all_gather (float32, 16 elements, seq 1)") &&
                                        Catch::Contains("called all_reduce (SUM, float32, 16 elements, seq 1)") &&
                                        Catch::Contains("they differ in the collective"));
  }
}

TEST_CASE("ranks that call different roots, ops, dtypes or sizes fail instead of combining them") {
  auto withShm = GENERATE(false, true);
  CAPTURE(withShm);
  Spec base;
  base.count = 1000;
  std::vector<std::pair<std::string, Spec>> variants;
  Spec v = base;
  v.op = ReduceOp::Max;
  variants.emplace_back("the reduce op", v);
  v = base;
  v.dtype = DType::I32;
  variants.emplace_back("the dtype", v);
  v = base;
  v.count = 999;
  variants.emplace_back("the element count", v);
  for (auto& [what, other] : variants) {
    CAPTURE(what);
    World w(3, withShm);
    auto results = runTrial(w, 5, {base, base, other}, 5s);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r, results[r].detail);
      REQUIRE(results[r].outcome != Outcome::Wrong);
    }
    REQUIRE(results[2].outcome == Outcome::Failed);
    REQUIRE_THAT(results[2].detail, Catch::Contains("they differ in " + what));
  }
  World w(2, withShm);
  Spec b0, b1;
  b0.coll = b1.coll = Collective::Reduce;
  b1.root = 1;
  auto results = runTrial(w, 9, {b0, b1}, 2s);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r, results[r].detail);
    REQUIRE(results[r].outcome == Outcome::Failed);
    REQUIRE_THAT(results[r].detail, Catch::Contains("they differ in the root"));
  }
}

// Thousands of random pairs of calls. Each trial either gives every rank
// the same spec (then every rank must be right) or changes one field on
// some ranks; any rank that returns without an error must hold the right
// answer for the call it made. After a trial in which any rank failed, the
// world is rebuilt, as a user would after an error.
TEST_CASE("random mismatched calls never return wrong data, on the network, slot and single-copy algorithms") {
  const int trials = kSanitizedBuild ? 500 : 1500;
  std::mt19937 rng(20261123);
  auto pick = [&](int n) { return int(rng() % unsigned(n)); };
  const Collective kinds[] = {Collective::AllReduce, Collective::Broadcast,   Collective::AllGather,
                              Collective::Reduce,    Collective::ReduceScatter, Collective::AllToAll,
                              Collective::Gather,    Collective::Scatter,     Collective::Barrier};
  const size_t counts[] = {1, 7, 16, 600, 1500};  // 1500 floats span two 4 KiB slots
  const DType dtypes[] = {DType::F32, DType::F64, DType::I32};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg};
  auto randomSpec = [&](int n) {
    Spec s;
    s.coll = kinds[pick(9)];
    s.count = counts[pick(5)];
    s.dtype = dtypes[pick(3)];
    s.op = ops[pick(3)];
    if (s.op == ReduceOp::Avg && s.dtype == DType::I32) s.op = ReduceOp::Sum;
    s.root = pick(n);
    return s;
  };
  // Changes one field that the call's identity carries.
  auto mutate = [&](Spec s, int n) {
    switch (pick(5)) {
      case 0: s.coll = kinds[pick(9)]; break;
      case 1: s.count = counts[pick(5)]; break;
      case 2: s.dtype = dtypes[pick(3)]; break;
      case 3: s.op = ops[pick(3)]; break;
      case 4: s.root = pick(n); break;
    }
    if (s.op == ReduceOp::Avg && s.dtype == DType::I32) s.op = ReduceOp::Max;
    return s;
  };

  struct Counts {
    int matched = 0, mismatched = 0, allCorrect = 0, failedSome = 0, timedOutSome = 0, wrong = 0, rebuilt = 0;
  };
  for (int mode = 0; mode < 3; ++mode) {
    const bool withShm = mode > 0, withCma = mode > 1;
    Counts c;
    std::vector<std::string> wrongs;
    int size = 2;
    auto world = std::make_unique<World>(size, withShm, withCma);
    uint64_t seq = 0;
    for (int t = 0; t < trials; ++t) {
      const Spec base = randomSpec(size);
      std::vector<Spec> specs(size, base);
      const bool mismatched = pick(2) == 0;
      if (mismatched) {
        for (int r = 0; r < size; ++r) {
          if (r == 0 || pick(2)) specs[r] = mutate(base, size);
        }
      }
      // Matched calls get the group's timeout, mismatched ones a short one:
      // where no rank can see the mismatch, all a rank can do is wait.
      auto results = runTrial(*world, ++seq, specs, mismatched ? 60ms : 20s);
      bool failed = false, timedOut = false, allCorrect = true;
      for (auto& res : results) {
        if (res.outcome == Outcome::Wrong) {
          ++c.wrong;
          std::string all;
          for (int r = 0; r < size; ++r) all += " rank " + std::to_string(r) + ": " + describeSpec(specs[r]);
          wrongs.push_back(res.detail + " (calls:" + all + ")");
        }
        failed |= res.outcome == Outcome::Failed;
        timedOut |= res.outcome == Outcome::TimedOut;
        allCorrect &= res.outcome == Outcome::Correct;
      }
      if (!mismatched) {
        ++c.matched;
        if (!allCorrect) {
          std::string all;
          for (int r = 0; r < size; ++r) all += " rank " + std::to_string(r) + ": " + results[r].detail;
          FAIL("matched calls " << describeSpec(base) << " did not all succeed:" << all);
        }
      } else {
        ++c.mismatched;
      }
      c.allCorrect += allCorrect;
      c.failedSome += failed;
      c.timedOutSome += timedOut && !failed;
      if (failed || timedOut) {
        ++c.rebuilt;
        size = 2 + pick(2);
        world = std::make_unique<World>(size, withShm, withCma);
        seq = 0;
      }
    }
    WARN((withCma ? "single copy" : withShm ? "shared memory" : "network")
         << ": " << trials << " trials, " << c.matched << " matched, " << c.mismatched
         << " mismatched; all correct " << c.allCorrect << ", some rank failed " << c.failedSome
         << ", only timeouts " << c.timedOutSome << ", silently wrong " << c.wrong
         << ", worlds rebuilt " << c.rebuilt);
    for (auto& w : wrongs) UNSCOPED_INFO(w);
    CHECK(c.wrong == 0);
  }
}

TEST_CASE("ranks whose settings pick different algorithms for the same call fail naming the algorithm") {
  World w(2, false);
  onEachRank(2, [&](int r) {
    std::vector<float> buf(4096, float(r + 1));
    CollArgs a{Collective::AllReduce, r, 2, 1};
    a.buf = buf.data();
    a.count = buf.size();
    const Algorithm& alg = selectAlgorithm(a, AlgoOverride(r == 0 ? "ring" : "recursive_doubling"));
    auto err = runOp(*w.comms[r], "all_reduce", 1, buildChecked(alg, a), 5s);
    const std::string what = err ? err->what() : "no error";
    RANK_REQUIRE_SAYING(what, what.find("they differ in the algorithm or its segment size") != std::string::npos);
  });
}
