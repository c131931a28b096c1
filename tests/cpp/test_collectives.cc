// reduce, reduce_scatter, all_to_all, gather, scatter and barrier schedules
// over the in-process transport, against closed-form answers.
#include <catch2/catch.hpp>

#include <numeric>
#include <string>

#include "core/transport/loopback/loopback_transport.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

double value(int rank, size_t i) { return double(rank * 100 + int(i % 37)); }

}  // namespace

TEST_CASE("reduce leaves the sum on the root and the inputs elsewhere untouched, from every root") {
  auto size = GENERATE(1, 2, 3, 5, 8);
  auto count = GENERATE(size_t{0}, size_t{1}, size_t{13}, size_t{20001});
  CAPTURE(size, count);
  auto comms = makeWorld(size);
  for (int root = 0; root < size; ++root) {
    onEachRank(size, [&](int r) {
      std::vector<double> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = value(r, i);
      CollArgs a{Collective::Reduce, r, size, uint64_t(root)};
      a.dtype = DType::F64;
      a.buf = buf.data();
      a.count = count;
      a.root = root;
      a.segmentBytes = 4096;
      RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "reduce", root, buildReduceBinomial(a)));
      for (size_t i = 0; i < count; ++i) {
        double want = value(r, i);
        if (r == root) {
          want = 0;
          for (int q = 0; q < size; ++q) want += value(q, i);
        }
        RANK_REQUIRE(buf[i] == want);
      }
    });
  }
}

TEST_CASE("reduce_scatter gives rank r block r of the sum, averaged when asked") {
  auto size = GENERATE(1, 2, 3, 4, 7);
  auto count = GENERATE(size_t{0}, size_t{1}, size_t{13}, size_t{9001});
  auto op = GENERATE(ReduceOp::Sum, ReduceOp::Avg);
  CAPTURE(size, count, reduceOpName(op));
  auto comms = makeWorld(size);
  onEachRank(size, [&](int r) {
    std::vector<double> in(count * size), out(count, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
    const auto before = in;
    CollArgs a{Collective::ReduceScatter, r, size, 1};
    a.dtype = DType::F64;
    a.op = op;
    a.input = in.data();
    a.buf = out.data();
    a.count = count;
    a.segmentBytes = 2048;
    RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "reduce_scatter", 1, buildReduceScatterRing(a)));
    RANK_REQUIRE(in == before);
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int q = 0; q < size; ++q) want += value(q, r * count + i);
      if (op == ReduceOp::Avg) want /= size;
      RANK_REQUIRE(out[i] == Approx(want));
    }
  });
}

TEST_CASE("all_to_all with uneven and empty blocks delivers each block to its rank") {
  auto size = GENERATE(1, 2, 3, 5);
  CAPTURE(size);
  auto comms = makeWorld(size);
  // Rank s sends (s + d) % 3 elements to rank d, each equal to s * 1000 + d.
  auto len = [](int s, int d) { return size_t((s + d) % 3); };
  onEachRank(size, [&](int r) {
    CollArgs a{Collective::AllToAll, r, size, 2};
    a.dtype = DType::I32;
    std::vector<int32_t> in, out;
    for (int d = 0; d < size; ++d) {
      a.sendOffsets.push_back(in.size() * 4);
      a.sendBytes.push_back(len(r, d) * 4);
      in.insert(in.end(), len(r, d), r * 1000 + d);
    }
    size_t total = 0;
    for (int s = 0; s < size; ++s) {
      a.recvOffsets.push_back(total * 4);
      a.recvBytes.push_back(len(s, r) * 4);
      total += len(s, r);
    }
    out.assign(total, -1);
    a.input = in.data();
    a.buf = out.data();
    RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "all_to_all", 2, buildAllToAllPairwise(a)));
    size_t at = 0;
    for (int s = 0; s < size; ++s) {
      RANK_REQUIRE_EACH(k, len(s, r), out[at + k] == s * 1000 + r);
      at += len(s, r);
    }
  });
}

TEST_CASE("gather collects every rank's block on the root and scatter hands them back, from every root") {
  auto size = GENERATE(1, 2, 3, 6, 8);
  auto count = GENERATE(size_t{0}, size_t{1}, size_t{17}, size_t{5000});
  // Direct: also into and out of separate blocks, and in segments of 4 KiB.
  auto form = GENERATE(as<std::string>{}, "binomial", "direct", "direct, separate blocks");
  CAPTURE(size, count, form);
  const bool direct = form != "binomial", separate = form == "direct, separate blocks";
  auto comms = makeWorld(size);
  for (int root = 0; root < size; ++root) {
    onEachRank(size, [&](int r) {
      std::vector<int64_t> mine(count), all(count * size, -1), back(count, -1);
      std::vector<std::vector<int64_t>> parts(size_t(size), std::vector<int64_t>(count, -1));
      for (size_t i = 0; i < count; ++i) mine[i] = r * 1000 + int64_t(i);
      CollArgs g{Collective::Gather, r, size, uint64_t(2 * root)};
      g.dtype = DType::I64;
      g.input = mine.data();
      g.buf = all.data();
      g.count = count;
      g.root = root;
      g.segmentBytes = 4096;
      if (separate && r == root) {
        for (auto& p : parts) g.blocks.push_back(p.data());
      }
      Schedule gather = direct ? buildGatherDirect(g) : buildGatherBinomial(g);
      RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "gather", g.seq, std::move(gather)));
      if (r == root) {
        for (int q = 0; q < size; ++q) {
          const int64_t* got = separate ? parts[size_t(q)].data() : all.data() + q * count;
          RANK_REQUIRE_EACH(i, count, got[i] == q * 1000 + int64_t(i));
        }
      }
      CollArgs s{Collective::Scatter, r, size, uint64_t(2 * root + 1)};
      s.dtype = DType::I64;
      s.input = separate ? nullptr : all.data();
      s.buf = back.data();
      s.count = count;
      s.root = root;
      s.segmentBytes = 4096;
      if (separate && r == root) {
        for (auto& p : parts) s.blocks.push_back(p.data());
      }
      Schedule scatter = direct ? buildScatterDirect(s) : buildScatterBinomial(s);
      RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "scatter", s.seq, std::move(scatter)));
      RANK_REQUIRE(back == mine);
    });
  }
}

TEST_CASE("dissemination barrier holds every rank until the last one arrives") {
  auto size = GENERATE(1, 2, 3, 7);
  CAPTURE(size);
  auto comms = makeWorld(size);
  std::atomic<int> arrived{0};
  onEachRank(size, [&](int r) {
    if (r == size - 1) std::this_thread::sleep_for(100ms);
    arrived++;
    CollArgs a{Collective::Barrier, r, size, 5};
    RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "barrier", 5, buildBarrierDissemination(a)));
    RANK_REQUIRE(arrived.load() == size);
  });
}

// torch's PREMUL_SUM: each rank scales its own input by its own factor, then
// the scaled inputs are summed. Factors differ per rank here, so scaling the
// finished sum by the local factor gives a different answer on every rank.
TEST_CASE("PREMUL_SUM sums each rank's input scaled by that rank's own factor, in every reducing algorithm") {
  auto size = GENERATE(1, 2, 3, 4, 5);
  auto count = GENERATE(size_t{1}, size_t{13}, size_t{5001});
  CAPTURE(size, count);
  auto comms = makeWorld(size);
  auto factor = [](int q) { return 0.5 * (q + 1); };
  auto scaledSum = [&](size_t i) {
    double want = 0;
    for (int q = 0; q < size; ++q) want += factor(q) * value(q, i);
    return want;
  };
  uint64_t seq = 0;
  for (auto build : {&buildAllReduceRing, &buildAllReduceRecursiveDoubling, &buildAllReduceRabenseifner}) {
    ++seq;
    onEachRank(size, [&](int r) {
      std::vector<double> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = value(r, i);
      CollArgs a{Collective::AllReduce, r, size, seq};
      a.dtype = DType::F64;
      a.op = ReduceOp::PremulSum;
      a.premulFactor = factor(r);
      a.buf = buf.data();
      a.count = count;
      a.segmentBytes = 2048;
      RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "all_reduce", seq, build(a)));
      RANK_REQUIRE_EACH(i, count, buf[i] == Approx(scaledSum(i)));
    });
  }
  ++seq;
  onEachRank(size, [&](int r) {
    std::vector<double> in(count * size), out(count, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
    const auto before = in;
    CollArgs a{Collective::ReduceScatter, r, size, seq};
    a.dtype = DType::F64;
    a.op = ReduceOp::PremulSum;
    a.premulFactor = factor(r);
    a.input = in.data();
    a.buf = out.data();
    a.count = count;
    a.segmentBytes = 2048;
    RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "reduce_scatter", seq, buildReduceScatterRing(a)));
    RANK_REQUIRE(in == before);
    RANK_REQUIRE_EACH(i, count, out[i] == Approx(scaledSum(r * count + i)));
  });
  for (int root = 0; root < size; ++root) {
    ++seq;
    onEachRank(size, [&](int r) {
      std::vector<double> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = value(r, i);
      CollArgs a{Collective::Reduce, r, size, seq};
      a.dtype = DType::F64;
      a.op = ReduceOp::PremulSum;
      a.premulFactor = factor(r);
      a.buf = buf.data();
      a.count = count;
      a.root = root;
      a.segmentBytes = 2048;
      RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "reduce", seq, buildReduceBinomial(a)));
      RANK_REQUIRE_EACH(i, count, buf[i] == Approx(r == root ? scaledSum(i) : value(r, i)));
    });
  }
}

TEST_CASE("pairwise all_to_all with the output aliasing the input sends every block before it is overwritten") {
  auto size = GENERATE(2, 3, 5);
  auto block = GENERATE(size_t{1}, size_t{3000});
  CAPTURE(size, block);
  auto comms = makeWorld(size);
  onEachRank(size, [&](int r) {
    // Element k of the block for rank d is r * 100000 + d * 1000 + k % 1000.
    std::vector<double> x(block * size);
    for (int d = 0; d < size; ++d) {
      for (size_t k = 0; k < block; ++k) x[d * block + k] = r * 100000 + d * 1000 + double(k % 1000);
    }
    CollArgs a{Collective::AllToAll, r, size, 7};
    a.dtype = DType::F64;
    for (int q = 0; q < size; ++q) {
      a.sendOffsets.push_back(q * block * 8);
      a.sendBytes.push_back(block * 8);
    }
    a.recvOffsets = a.sendOffsets;
    a.recvBytes = a.sendBytes;
    a.input = x.data();
    a.buf = x.data();
    a.count = x.size();
    a.evenSplits = true;
    RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "all_to_all", 7, buildAllToAllPairwise(a)));
    for (int s = 0; s < size; ++s) {
      RANK_REQUIRE_EACH(k, block, x[s * block + k] == s * 100000 + r * 1000 + double(k % 1000));
    }
  });
}
