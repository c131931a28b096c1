// The single-copy (CMA) algorithms between threads of one process: each rank
// maps the others' shared-memory segments and reads their buffers with
// process_vm_readv of its own pid, the same calls separate processes make.
#include <catch2/catch.hpp>
#include <numeric>

#include "core/algorithms/cma_exchange.h"
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

struct CmaWorld {
  explicit CmaWorld(int size, size_t slotBytes = 4096)
      : world(makeLoopbackWorld(size)), areas(size), cmas(size) {
    onEachRank(size, [&](int r) {
      areas[r] = ShmArea::create(store, "t", r, size, slotBytes);
      cmas[r] = Cma::create(store, "t", r, size, CmaMode::On);
    });
    CommOptions o;
    o.timeout = 20s;
    for (auto& t : world.transports)
      comms.push_back(std::make_unique<Communicator>(std::move(t), o));
  }
  ~CmaWorld() { comms.clear(); }

  CollArgs args(Collective coll, int r, uint64_t seq) const {
    CollArgs a{coll, r, int(areas.size()), seq};
    a.shm = areas[r].get();
    a.cma = cmas[r].get();
    return a;
  }

  LoopbackWorld world;
  MemoryStore store;
  std::vector<std::unique_ptr<ShmArea>> areas;
  std::vector<std::unique_ptr<Cma>> cmas;
  std::vector<std::unique_ptr<Communicator>> comms;
};

// Rank q's element i of any input: exact in float.
float cmaValue(int q, size_t i) { return float(q * 100000 + int(i % 99991)); }

std::vector<float> cmaInput(int q, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = cmaValue(q, i);
  return v;
}

// Rank src's all_to_all message to dst: element i is cmaValue(src, dst * 1000003 + i).
float message(int src, int dst, size_t i) { return cmaValue(src, dst * 1000003 + i); }

// Rank r's part of an all_to_all in which rank src sends rank dst
// count(src, dst) elements: its offsets and lengths in `a`, its packed input,
// and what it must receive.
template <typename Count>
void layOutAllToAll(CollArgs& a, int size, Count count, std::vector<float>& in,
                    std::vector<float>& want) {
  const int r = a.rank;
  for (int q = 0; q < size; ++q) {
    a.sendOffsets.push_back(in.size() * 4);
    a.sendBytes.push_back(count(r, q) * 4);
    for (size_t i = 0; i < count(r, q); ++i) in.push_back(message(r, q, i));
    a.recvOffsets.push_back(want.size() * 4);
    a.recvBytes.push_back(count(q, r) * 4);
    for (size_t i = 0; i < count(q, r); ++i) want.push_back(message(q, r, i));
  }
}

// Elements rank src sends rank dst in the uneven all_to_all: zero for some
// pairs (and for everything rank 0 sends), up to `scale` + 6 for others.
size_t split(int src, int dst, size_t scale) {
  if (src == 0) return 0;
  const size_t k = size_t(3 * src + 5 * dst + 1) % 7;
  return k == 0 ? 0 : scale + k;
}

// Fails with the first element of `got` that differs from `want`.
template <typename Want>
void expectEach(int r, const std::string& what, const std::vector<float>& got, Want want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want(i)) {
      RANK_FAIL("rank " << r << " " << what << ": element " << i << " is " << got[i] << ", want "
                        << want(i));
    }
  }
}

// Runs the all_to_all laid out in `a` (packed input `in`) again as call
// `seq`, each message in a block of its own both ways, and checks every
// block this rank receives.
void expectSeparateBlocks(CmaWorld& w, const CollArgs& a, const std::vector<float>& in,
                          uint64_t seq, const std::string& what) {
  const int r = a.rank, size = a.size;
  CollArgs sep = a;
  sep.seq = seq;
  std::vector<std::vector<float>> ins(size), outs(size);
  for (int q = 0; q < size; ++q) {
    ins[q].assign(in.begin() + a.sendOffsets[q] / 4, in.begin() + (a.sendOffsets[q] + a.sendBytes[q]) / 4);
    outs[q].assign(a.recvBytes[q] / 4, -1);
    sep.inputBlocks.push_back(ins[q].data());
    sep.blocks.push_back(outs[q].data());
  }
  sep.input = nullptr;
  sep.buf = nullptr;
  RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_to_all", seq, buildAllToAllCma(sep)));
  for (int q = 0; q < size; ++q) {
    expectEach(r, what + " block " + std::to_string(q), outs[q], [&](size_t i) { return message(q, r, i); });
  }
}

}  // namespace

TEST_CASE(
    "the CMA probe succeeds between ranks that can read each other, and RINGX_CMA=0 skips it") {
  const int size = 3;
  MemoryStore store;
  std::vector<std::unique_ptr<Cma>> on(size), off(size);
  onEachRank(size, [&](int r) {
    on[r] = Cma::create(store, "a", r, size, CmaMode::Auto);
    off[r] = Cma::create(store, "b", r, size, CmaMode::Off);
  });
  for (int r = 0; r < size; ++r) {
    CHECK(on[r] != nullptr);
    CHECK(off[r] == nullptr);
    for (int p = 0; p < size; ++p) CHECK(on[r]->alive(p));
  }
}

TEST_CASE(
    "single-copy all_reduce and reduce_scatter sum every rank's input, AVG divides it, and slot ops "
    "between them share the chunk numbering") {
  auto size = GENERATE(2, 3, 4);
  // 1.2 M floats span many scratch pieces and several 4 MiB transfer steps.
  auto count = GENERATE(size_t{1}, size_t{7}, size_t{1000}, size_t{1200007});
  CAPTURE(size, count);
  CmaWorld w(size);
  // Sums of the ranks' cmaValue are exact in float up to 4 ranks.
  auto sum = [&](size_t i) {
    float s = 0;
    for (int q = 0; q < size; ++q) s += cmaValue(q, i);
    return s;
  };
  onEachRank(size, [&](int r) {
    uint64_t seq = 0;
    for (int round = 0; round < 2; ++round) {
      std::vector<float> buf = cmaInput(r, count);
      CollArgs a = w.args(Collective::AllReduce, r, ++seq);
      a.buf = buf.data();
      a.count = count;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_reduce", seq, buildAllReduceCma(a)));
      expectEach(r, "all_reduce", buf, sum);

      std::vector<float> slotted = cmaInput(r, count);
      a = w.args(Collective::AllReduce, r, ++seq);
      a.buf = slotted.data();
      a.count = count;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_reduce", seq, buildAllReduceShm(a)));
      expectEach(r, "slot all_reduce", slotted, sum);

      const std::vector<float> in = cmaInput(r, size * count);
      std::vector<float> mine(count, -1);
      a = w.args(Collective::ReduceScatter, r, ++seq);
      a.input = in.data();
      a.buf = mine.data();
      a.count = count;
      // AVG's 1/n is exact where n is a power of two.
      a.op = round == 1 && size != 3 ? ReduceOp::Avg : ReduceOp::Sum;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "reduce_scatter", seq, buildReduceScatterCma(a)));
      expectEach(r, "reduce_scatter", mine, [&](size_t i) {
        const float s = sum(r * count + i);
        return a.op == ReduceOp::Avg ? s / float(size) : s;
      });
    }
  });
}

TEST_CASE(
    "single-copy all_gather, broadcast, gather and scatter match the closed form, between slot "
    "ops") {
  auto size = GENERATE(2, 3, 4);
  // 1.2 M floats span several of the transfer step's 4 MiB pieces.
  auto count = GENERATE(size_t{1}, size_t{7}, size_t{1000}, size_t{1200007});
  CAPTURE(size, count);
  CmaWorld w(size);
  onEachRank(size, [&](int r) {
    uint64_t seq = 0;
    for (int round = 0; round < 2; ++round) {
      const int root = (round + size - 1) % size;
      const std::vector<float> in = cmaInput(r, count);

      std::vector<float> out(size * count, -1);
      CollArgs a = w.args(Collective::AllGather, r, ++seq);
      a.input = in.data();
      a.buf = out.data();
      a.count = count;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_gather", seq, buildAllGatherCma(a)));
      expectEach(r, "all_gather", out, [&](size_t i) { return cmaValue(int(i / count), i % count); });

      // A slot op between single-copy ones: both share the chunk numbering.
      std::vector<float> slotted = in;
      a = w.args(Collective::Broadcast, r, ++seq);
      a.buf = slotted.data();
      a.count = count;
      a.root = root;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "broadcast", seq, buildBroadcastShm(a)));
      expectEach(r, "slot broadcast", slotted, [&](size_t i) { return cmaValue(root, i); });

      std::vector<float> buf = in;
      a = w.args(Collective::Broadcast, r, ++seq);
      a.buf = buf.data();
      a.count = count;
      a.root = root;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "broadcast", seq, buildBroadcastCma(a)));
      expectEach(r, "broadcast", buf, [&](size_t i) { return cmaValue(root, i); });

      std::vector<float> gathered(r == root ? size * count : 0, -1);
      a = w.args(Collective::Gather, r, ++seq);
      a.input = in.data();
      a.buf = r == root ? gathered.data() : nullptr;
      a.count = count;
      a.root = root;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "gather", seq, buildGatherCma(a)));
      expectEach(r, "gather", gathered, [&](size_t i) { return cmaValue(int(i / count), i % count); });

      const std::vector<float> all = r == root ? cmaInput(r, size * count) : std::vector<float>{};
      std::vector<float> mine(count, -1);
      a = w.args(Collective::Scatter, r, ++seq);
      a.input = r == root ? all.data() : nullptr;
      a.buf = mine.data();
      a.count = count;
      a.root = root;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "scatter", seq, buildScatterCma(a)));
      expectEach(r, "scatter", mine, [&](size_t i) { return cmaValue(root, r * count + i); });
    }
  });
}

TEST_CASE(
    "single-copy all_gather, gather and scatter copy separate blocks in place, the root's table "
    "of them in its slot or, where it does not fit, in its memory") {
  auto size = GENERATE(sweep<int>({2, 3, 4}, {2, 4}));
  // A 16-byte slot holds the table of two blocks, not of three or four.
  auto slotBytes = GENERATE(size_t{4096}, size_t{16});
  auto count = GENERATE(size_t{1}, size_t{1000}, size_t{1200007});
  CAPTURE(size, slotBytes, count);
  CmaWorld w(size, slotBytes);
  auto blocksOf = [](std::vector<std::vector<float>>& vs) {
    std::vector<void*> b;
    for (auto& v : vs) b.push_back(v.data());
    return b;
  };
  onEachRank(size, [&](int r) {
    uint64_t seq = 0;
    for (int root = 0; root < size; ++root) {
      const std::vector<float> in = cmaInput(r, count);

      std::vector<std::vector<float>> outs(size, std::vector<float>(count, -1));
      CollArgs a = w.args(Collective::AllGather, r, ++seq);
      a.input = in.data();
      a.count = count;
      a.blocks = blocksOf(outs);
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_gather", seq, buildAllGatherCma(a)));
      for (int q = 0; q < size; ++q)
        expectEach(r, "all_gather block " + std::to_string(q), outs[size_t(q)],
                   [&](size_t i) { return cmaValue(q, i); });

      auto rooted = [&](Collective coll, std::vector<std::vector<float>>& blocks) {
        CollArgs ra = w.args(coll, r, ++seq);
        ra.count = count;
        ra.root = root;
        ra.blocks = blocksOf(blocks);
        return ra;
      };
      std::vector<std::vector<float>> gathered(r == root ? size : 0, std::vector<float>(count, -1));
      a = rooted(Collective::Gather, gathered);
      a.input = in.data();
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "gather", seq, buildGatherCma(a)));
      for (int q = 0; q < int(gathered.size()); ++q)
        expectEach(r, "gather block " + std::to_string(q), gathered[size_t(q)],
                   [&](size_t i) { return cmaValue(q, i); });

      std::vector<std::vector<float>> rows;
      for (int q = 0; q < (r == root ? size : 0); ++q) rows.push_back(cmaInput(q + 7, count));
      std::vector<float> mine(count, -1);
      a = rooted(Collective::Scatter, rows);
      a.buf = mine.data();
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "scatter", seq, buildScatterCma(a)));
      expectEach(r, "scatter", mine, [&](size_t i) { return cmaValue(r + 7, i); });
    }
  });
}

TEST_CASE(
    "single-copy all_to_all delivers uneven splits, zero splits, an input that is its own output "
    "and separate blocks in place, whether ranks inline their input in the slot or not") {
  auto size = GENERATE(2, 3, 4);
  // The area's slots hold 4096 bytes: at scale 0 every rank inlines its
  // input, at 250 some do, above none but rank 0 (which sends nothing).
  auto scale = GENERATE(size_t{0}, size_t{250}, size_t{1000}, size_t{700001});
  CAPTURE(size, scale);
  CmaWorld w(size);
  onEachRank(size, [&](int r) {
    CollArgs a = w.args(Collective::AllToAll, r, 1);
    std::vector<float> in, want;
    layOutAllToAll(a, size, [&](int src, int dst) { return split(src, dst, scale); }, in, want);
    std::vector<float> out(want.size(), -1);
    a.input = in.data();
    a.buf = out.data();
    a.count = in.size();
    RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_to_all", 1, buildAllToAllCma(a)));
    expectEach(r, "uneven all_to_all", out, [&](size_t i) { return want[i]; });

    // Even blocks, in place: peers read the input this rank overwrites.
    const size_t block = scale + 3;
    std::vector<float> buf(size * block);
    for (int dst = 0; dst < size; ++dst) {
      for (size_t i = 0; i < block; ++i) buf[dst * block + i] = message(r, dst, i);
    }
    CollArgs e = w.args(Collective::AllToAll, r, 2);
    for (int q = 0; q < size; ++q) {
      e.sendOffsets.push_back(q * block * 4);
      e.sendBytes.push_back(block * 4);
    }
    e.recvOffsets = e.sendOffsets;
    e.recvBytes = e.sendBytes;
    e.evenSplits = true;
    e.input = buf.data();
    e.buf = buf.data();
    e.count = buf.size();
    RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_to_all", 2, buildAllToAllCma(e)));
    expectEach(r, "in-place all_to_all", buf,
               [&](size_t i) { return message(int(i / block), r, i % block); });

    // The uneven exchange again, each message in a block of its own both ways.
    expectSeparateBlocks(w, a, in, 3, "separate all_to_all");
  });
}

TEST_CASE(
    "single-copy all_to_all delivers every byte between ranks whose blocks for each other differ "
    "in size (the receiver reads the head, the sender writes the tail), packed, in separate blocks "
    "and in place, below, at and above the smallest tail, and where the sender's input lies in its "
    "slot") {
  auto size = GENERATE(2, 3);
  // 8176 elements more one way leave a tail just under 16 KiB, 8192 just
  // at it. With 1 MiB slots the 8176- and 8192-element inputs lie in the
  // slots (so nothing is written), with 4096-byte slots none does.
  auto diff = GENERATE(size_t{8176}, size_t{8192}, size_t{300001});
  auto slotBytes = GENERATE(size_t{4096}, size_t{1} << 20);
  CAPTURE(size, diff, slotBytes);
  const size_t small = 5;
  // At world 3 each rank sends its successor the larger block, so every rank
  // sends and receives as much as the others (and can exchange in place).
  auto count = [&](int src, int dst) -> size_t {
    if (src == dst) return 3;
    if (size == 2) return src == 0 ? small + diff : small;
    return dst == (src + 1) % size ? small + diff : small;
  };
  CmaWorld w(size, slotBytes);
  onEachRank(size, [&](int r) {
    CollArgs a = w.args(Collective::AllToAll, r, 1);
    std::vector<float> in, want;
    layOutAllToAll(a, size, count, in, want);
    std::vector<float> out(want.size(), -1);
    a.input = in.data();
    a.buf = out.data();
    a.count = in.size();
    RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_to_all", 1, buildAllToAllCma(a)));
    expectEach(r, "lopsided all_to_all", out, [&](size_t i) { return want[i]; });

    expectSeparateBlocks(w, a, in, 2, "lopsided separate");

    if (size == 3) {
      // In place: the input is copied aside, and the tails come from there.
      CollArgs inPlace = a;
      inPlace.seq = 3;
      std::vector<float> buf = in;
      inPlace.input = buf.data();
      inPlace.buf = buf.data();
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_to_all", 3, buildAllToAllCma(inPlace)));
      expectEach(r, "lopsided in-place all_to_all", buf, [&](size_t i) { return want[i]; });
    }
  });
}

TEST_CASE(
    "ranks whose all_to_all split sizes disagree both fail, naming the peer, without copying") {
  CmaWorld w(2);
  std::vector<std::optional<Error>> errs(2);
  std::vector<std::vector<float>> outs(2);
  onEachRank(2, [&](int r) {
    // Rank 0 sends rank 1 five elements, rank 1 expects four.
    const std::vector<float> in(8, float(r + 1));
    outs[r].assign(8, -1);
    CollArgs a = w.args(Collective::AllToAll, r, 1);
    a.sendOffsets = {0, 12};
    a.sendBytes = {12, r == 0 ? 20u : 12u};
    a.recvOffsets = {0, r == 1 ? 16u : 12u};
    a.recvBytes = {r == 1 ? 16u : 12u, 12};
    a.input = in.data();
    a.buf = outs[r].data();
    a.count = 8;
    errs[r] = runOp(*w.comms[r], "all_to_all", 1, buildAllToAllCma(a), 10s);
  });
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errs[r]);
    CHECK(errs[r]->kind() == ErrorKind::InvalidArgument);
    CHECK_THAT(errs[r]->what(), Catch::Contains("rank " + std::to_string(1 - r)) &&
                                    Catch::Contains("split sizes disagree"));
    // No peer's bytes arrived (the local block is copied after the checks too).
    CHECK(std::count(outs[r].begin(), outs[r].end(), -1.0f) == 8);
  }
}

TEST_CASE(
    "single-copy all_to_all: a rank passing no split sizes and ranks passing uneven ones exchange "
    "their blocks") {
  auto scale = GENERATE(size_t{0}, size_t{5}, size_t{300000});
  CAPTURE(scale);
  const int size = 3;
  CmaWorld w(size);
  // Rank 0 sends and receives `scale` + 1 elements per peer (the even form);
  // ranks 1 and 2 exchange different counts with each other.
  auto count = [&](int src, int dst) {
    return src == 0 || dst == 0 || src == dst ? scale + 1 : scale + size_t(2 + src);
  };
  onEachRank(size, [&](int r) {
    CollArgs a = w.args(Collective::AllToAll, r, 1);
    std::vector<float> in, want;
    layOutAllToAll(a, size, count, in, want);
    std::vector<float> out(want.size(), -1);
    a.evenSplits = r == 0;
    a.input = in.data();
    a.buf = out.data();
    a.count = in.size();
    RANK_REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "cma");
    RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_to_all", 1, buildAllToAllCma(a)));
    expectEach(r, "mixed-form all_to_all", out, [&](size_t i) { return want[i]; });
  });
}

TEST_CASE(
    "single-copy all_to_all with every table in a slot: a rank fails when two other ranks' split "
    "sizes disagree, naming them, whether the inputs lie in the slots too or are read in place") {
  // 4096-byte slots: two elements per block fit beside the table, 2000 do not.
  const size_t scale = GENERATE(size_t{2}, size_t{2000});
  CAPTURE(scale);
  CmaWorld w(3);
  std::vector<std::optional<Error>> errs(3);
  onEachRank(3, [&](int r) {
    // Rank 1 sends rank 2 one element more than rank 2 expects; rank 0's pairs agree.
    std::vector<size_t> sends{scale, scale, scale}, recvs{scale, scale, scale};
    if (r == 1) sends[2] = scale + 1;
    const std::vector<float> in(3 * scale + 1, float(r));
    std::vector<float> out(3 * scale + 1, -1);
    CollArgs a = w.args(Collective::AllToAll, r, 1);
    size_t at = 0, back = 0;
    for (int q = 0; q < 3; ++q) {
      a.sendOffsets.push_back(at);
      a.sendBytes.push_back(sends[q] * 4);
      at += sends[q] * 4;
      a.recvOffsets.push_back(back);
      a.recvBytes.push_back(recvs[q] * 4);
      back += recvs[q] * 4;
    }
    a.input = in.data();
    a.buf = out.data();
    a.count = in.size();
    errs[r] = runOp(*w.comms[r], "all_to_all", 1, buildAllToAllCma(a), 10s);
  });
  REQUIRE(errs[0]);
  CHECK(errs[0]->kind() == ErrorKind::InvalidArgument);
  CHECK_THAT(errs[0]->what(), Catch::Contains("ranks 1 and 2 disagree on their split sizes: rank 1 "
                                              "sends rank 2 " +
                                              std::to_string(4 * (scale + 1)) + " bytes and expects " +
                                              std::to_string(4 * scale)));
  for (int r = 1; r < 3; ++r) {
    REQUIRE(errs[r]);
    CHECK_THAT(errs[r]->what(), Catch::Contains("rank " + std::to_string(3 - r)) &&
                                    Catch::Contains("split sizes disagree"));
  }
}

TEST_CASE(
    "a single-copy call against a slot call of the same chunk fails on both ranks, naming the "
    "other") {
  CmaWorld w(2);
  std::vector<std::optional<Error>> errs(2);
  onEachRank(2, [&](int r) {
    std::vector<float> in(100, float(r)), out(200, -1);
    CollArgs a = w.args(Collective::AllGather, r, 1);
    a.input = in.data();
    a.buf = out.data();
    a.count = 100;
    errs[r] = runOp(*w.comms[r], "all_gather", 1,
                    r == 0 ? buildAllGatherCma(a) : buildAllGatherShm(a), 10s);
    if (r == 0) {
      RANK_REQUIRE(std::count(out.begin() + 100, out.end(), -1.0f) == 100);
    }
  });
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errs[r]);
    CHECK(errs[r]->kind() == ErrorKind::InvalidArgument);
    CHECK_THAT(errs[r]->what(),
               Catch::Contains("rank " + std::to_string(1 - r) + " called all_gather") &&
                   Catch::Contains("the algorithm"));
  }
}

// Measured on 2 cores (docs/algorithms.md, 2026-11-30): with 4 ranks or more
// per core the slot broadcast won in every pattern from 512 KiB to 16 MiB,
// and the single copy kept the pattern with compute between calls below
// that; with 2 per core neither won at every size.
TEST_CASE("with 4 ranks or more per core the cost model takes the slot broadcast over the single copy from 512 KiB") {
  for (int size : {3, 4, 8, 16}) {
    CmaWorld w(size, 256 * 1024);
    auto pick = [&](int cores, size_t bytes) {
      w.areas[0]->setCores(cores);
      CollArgs a = w.args(Collective::Broadcast, 0, 1);
      a.count = bytes / sizeof(float);
      return std::string(selectAlgorithm(a, AlgoOverride("")).name);
    };
    CAPTURE(size);
    const bool slots = size >= 8;
    for (size_t bytes : {size_t{512} << 10, size_t{1} << 20, size_t{16} << 20}) {
      CAPTURE(bytes);
      CHECK(pick(2, bytes) == (slots ? "shm" : "cma"));
      // A core per rank: the single copy, as before.
      CHECK(pick(size, bytes) == "cma");
    }
    CHECK(pick(2, 256 << 10) == "cma");
  }
}

TEST_CASE(
    "the cost model takes the single copy where it applies, and alike on every rank for all_to_all "
    "with or without split sizes") {
  CmaWorld w(2);
  for (int r = 0; r < 2; ++r) {
    CollArgs a = w.args(Collective::AllGather, r, 1);
    a.count = 4 << 20;
    CHECK(selectAlgorithm(a, AlgoOverride("")).name == "cma");
    CHECK(selectAlgorithm(a, AlgoOverride("all_gather:shm")).name == "shm");
    a.cma = nullptr;
    CHECK(selectAlgorithm(a, AlgoOverride("all_gather:cma")).name != "cma");

    // Ranks that send 1 element and 64 MiB choose the same algorithm.
    CollArgs v = w.args(Collective::AllToAll, r, 1);
    v.sendBytes = {4, r == 0 ? 4u : 64u << 20};
    v.recvBytes = v.sendBytes;
    v.count = r == 0 ? 2 : 16u << 20;
    CHECK(selectAlgorithm(v, AlgoOverride("")).name == "cma");

    // all_to_all without split sizes takes it at every size too: a peer may
    // pass split sizes for the same blocks.
    CollArgs e = w.args(Collective::AllToAll, r, 1);
    e.sendBytes = {4, 4};
    e.recvBytes = e.sendBytes;
    e.count = 2;
    e.evenSplits = true;
    CHECK(selectAlgorithm(e, AlgoOverride("")).name == "cma");
    CHECK(selectAlgorithm(e, AlgoOverride("all_to_all:shm")).name == "shm");

    // Without the single copy both forms take pairwise, the one algorithm
    // that serves both; the slot algorithm only when forced.
    e.cma = nullptr;
    v.cma = nullptr;
    CHECK(selectAlgorithm(e, AlgoOverride("")).name == "pairwise");
    CHECK(selectAlgorithm(v, AlgoOverride("")).name == "pairwise");
    CHECK(selectAlgorithm(e, AlgoOverride("all_to_all:shm")).name == "shm");
  }
}

TEST_CASE(
    "a rank reading a peer's buffer stops at the next piece once the peer's engine abandoned the "
    "op, and fails naming it") {
  CmaWorld w(2);
  const size_t n = (8u << 20) / sizeof(float);  // two 4 MiB pieces
  std::vector<float> owned = cmaInput(0, n), got(n, -1.0f);
  CollIdentity id{};
  id.seq = 1;
  id.count = n;
  id.kind = uint8_t(Collective::Broadcast);
  id.root = 0;
  std::vector<std::unique_ptr<CmaExchange>> x;
  for (int r = 0; r < 2; ++r) {
    CmaRecord rec;
    if (r == 0) rec = {reinterpret_cast<uint64_t>(owned.data()), n * sizeof(float), 0};
    x.push_back(std::make_unique<CmaExchange>(w.areas[r].get(), w.cmas[r].get(),
                                              w.areas[r]->reserveChunks(1), id, rec, 0));
  }
  x[1]->setPlan([&](CmaExchange& e) { e.addRead(0, e.record(0).addr, got.data(), e.record(0).bytes); });
  REQUIRE(x[0]->publish());
  REQUIRE(x[1]->publish());
  REQUIRE(x[0]->match());
  REQUIRE(x[1]->match());
  REQUIRE_FALSE(x[1]->transfer());  // the first piece
  CHECK(got[0] == cmaValue(0, 0));
  // Rank 0 timed out: its caller has the buffer back and writes into it.
  x[0]->abandon();
  std::fill(owned.begin(), owned.end(), -7.0f);
  REQUIRE(x[1]->transfer());
  try {
    while (!x[1]->finish()) {
    }
    FAIL("the reader finished as if the abandoned buffer were whole");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("rank 0 failed"));
  }
  CHECK(std::count(got.begin(), got.end(), -7.0f) == 0);
}

TEST_CASE("a rank that fails because another's failed names the rank whose process closed, not the messenger") {
  CmaWorld w(3);
  const size_t n = 1024;
  std::vector<std::vector<float>> bufs = {cmaInput(0, n), cmaInput(1, n), cmaInput(2, n)};
  CollIdentity id{};
  id.seq = 1;
  id.count = n;
  id.kind = uint8_t(Collective::AllGather);
  std::vector<std::unique_ptr<CmaExchange>> x;
  for (int r = 0; r < 3; ++r) {
    CmaRecord rec{reinterpret_cast<uint64_t>(bufs[size_t(r)].data()), n * sizeof(float), 0};
    x.push_back(std::make_unique<CmaExchange>(w.areas[size_t(r)].get(), w.cmas[size_t(r)].get(),
                                              w.areas[size_t(r)]->reserveChunks(1), id, rec));
  }
  for (auto& e : x) REQUIRE(e->publish());
  for (auto& e : x) REQUIRE(e->match());
  // Rank 1 found rank 2's process gone (as a failed read reports it).
  x[1]->fail(Error(ErrorKind::PeerClosed, "rank 2 closed"), {2, 1});
  for (auto& e : x) REQUIRE(e->transfer());
  try {
    while (!x[0]->finish()) {
    }
    FAIL("rank 0 finished although rank 1 failed");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::PeerClosed);
    CHECK_THAT(e.what(), Catch::Contains("rank 1 failed") && Catch::Contains("after rank 2 closed"));
  }
}
