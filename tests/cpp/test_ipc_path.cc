// The ipc data path (core/device_paths/ipc_collective.h) on the simulated
// device: ranks are threads, but their buffers and mailboxes are POSIX
// shared memory mapped by name, as between processes. Every collective is
// checked against a CPU reference built from the ranks' inputs with the
// reduce loops, for every dtype and op; then the failure paths.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <map>
#include <random>

#include "core/device_paths/ipc_collective.h"
#include "core/patterns/ring.h"
#include "sim_support.h"
#include "sweep.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

// Names of their own: the test files are compiled in unity batches.
namespace ipc_test {

// A world whose ranks also share an ipc buffer of `bufferBytes` each.
struct IpcWorld {
  IpcWorld(int size, size_t bufferBytes, std::chrono::milliseconds timeout = 20s)
      : sim(size, 30, timeout), peers(size) {
    onEachRank(size, [&](int r) {
      peers[r] = IpcPeers::create(sim.ranks[r]->device, sim.store, "ipc", r, size, bufferBytes);
    });
  }
  SimWorld sim;
  std::vector<std::unique_ptr<IpcPeers>> peers;
};

// Random elements; floating ones finite (the top exponent bit clear), since
// which NaN a sum of NaNs gives differs between the loops' vector and scalar
// paths, as between GPUs.
std::vector<std::byte> ipcRandomBytes(size_t n, uint64_t seed, DType dtype) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> b(n);
  for (auto& x : b) x = std::byte(rng());
  const size_t es = dtypeSize(dtype);
  if (isFloating(dtype)) {
    for (size_t i = es - 1; i < n; i += es) b[i] &= std::byte{0xbf};
  }
  return b;
}

CollArgs ipcArgs(Collective coll, int r, int size, uint64_t seq, size_t count, DType dtype, ReduceOp op) {
  CollArgs a{coll, r, size, seq};
  a.dtype = dtype;
  a.op = op;
  a.count = count;
  a.root = 1 % size;
  a.premulFactor = 0.5;
  a.evenSplits = coll == Collective::AllToAll;
  return a;
}

bool ipcInPlace(Collective c) {
  return c == Collective::AllReduce || c == Collective::Broadcast || c == Collective::Reduce;
}

// Bytes of each rank's input (its buf, in place) and output.
std::pair<size_t, size_t> ipcSizes(Collective c, size_t count, DType dtype, int n) {
  const size_t block = count * dtypeSize(dtype), all = block * size_t(n);
  switch (c) {
    case Collective::AllGather:
    case Collective::Gather: return {block, all};
    case Collective::ReduceScatter:
    case Collective::Scatter: return {all, block};
    case Collective::AllToAll: return {all, all};
    default: return {block, block};
  }
}

// The chunked ring's all_reduce through buffers of `bufferBytes`: each
// chunk of each round folded two at a time from the rank that starts it on
// around the ring, as the ring's steps combine them (ipc_plan.h).
std::vector<std::byte> ipcRingReference(const CollArgs& a, const std::vector<std::vector<std::byte>>& inputs,
                                        size_t bufferBytes) {
  const int n = a.size;
  const size_t es = dtypeSize(a.dtype);
  const IpcRingPlan plan = ipcRingPlan(a.count, es, n, bufferBytes);
  const ReduceNFn fold = reduceNFn(a.dtype, a.op);
  std::vector<std::byte> out(a.count * es);
  for (size_t k = 0; k < plan.rounds; ++k) {
    const auto [o, len] = ipcRound(a.count, plan.roundElems(), k);
    for (int c = 0; c < n; ++c) {
      const size_t at = (o + ring::chunkStart(len, n, c)) * es, elems = ring::chunkLen(len, n, c);
      if (elems == 0) continue;
      std::vector<std::byte> acc, part(elems * es);
      for (int j = 0; j < n; ++j) {
        const auto& in = inputs[size_t((c + j) % n)];
        std::memcpy(part.data(), in.data() + at, part.size());
        if (a.op == ReduceOp::PremulSum) scale(part.data(), elems, a.dtype, a.premulFactor);
        if (j == 0) {
          acc = part;
        } else {
          const void* srcs[2] = {acc.data(), part.data()};
          fold(acc.data(), srcs, 2, elems);
        }
      }
      std::memcpy(out.data() + at, acc.data(), acc.size());
    }
  }
  if (a.op == ReduceOp::Avg && a.count) scale(out.data(), a.count, a.dtype, 1.0 / n);
  return out;
}

// What rank r's output holds after the collective, from every rank's input
// and its own output before: the reduce loops in rank order, as the
// kernels combine them (the ring's order for an all_reduce on the ring).
std::vector<std::byte> ipcReference(const CollArgs& a, const std::vector<std::vector<std::byte>>& inputs,
                                    const std::vector<std::byte>& before, IpcAlgo algo = IpcAlgo::OneShot,
                                    size_t bufferBytes = 0) {
  if (a.coll == Collective::AllReduce && algo == IpcAlgo::Ring) return ipcRingReference(a, inputs, bufferBytes);
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype), block = a.count * es;
  auto reduceBlocks = [&](size_t offset) {
    std::vector<std::vector<std::byte>> parts;
    std::vector<const void*> srcs;
    for (int q = 0; q < n; ++q) {
      parts.emplace_back(inputs[size_t(q)].begin() + long(offset), inputs[size_t(q)].begin() + long(offset + block));
      if (a.op == ReduceOp::PremulSum) scale(parts.back().data(), a.count, a.dtype, a.premulFactor);
    }
    for (auto& p : parts) srcs.push_back(p.data());
    std::vector<std::byte> out(block);
    if (a.count) reduceNFn(a.dtype, a.op)(out.data(), srcs.data(), n, a.count);
    if (a.op == ReduceOp::Avg) scale(out.data(), a.count, a.dtype, 1.0 / n);
    return out;
  };
  auto concat = [&](auto blockOf) {
    std::vector<std::byte> out;
    for (int q = 0; q < n; ++q) {
      const auto [src, off] = blockOf(q);
      out.insert(out.end(), inputs[size_t(src)].begin() + long(off), inputs[size_t(src)].begin() + long(off + block));
    }
    return out;
  };
  switch (a.coll) {
    case Collective::AllReduce: return reduceBlocks(0);
    case Collective::Reduce: return r == a.root ? reduceBlocks(0) : before;
    case Collective::ReduceScatter: return reduceBlocks(size_t(r) * block);
    case Collective::Broadcast: return inputs[size_t(a.root)];
    case Collective::AllGather: return concat([](int q) { return std::pair<int, size_t>{q, 0}; });
    case Collective::Gather:
      return r == a.root ? concat([](int q) { return std::pair<int, size_t>{q, 0}; }) : before;
    case Collective::Scatter: {
      const auto& in = inputs[size_t(a.root)];
      return {in.begin() + long(size_t(r) * block), in.begin() + long(size_t(r + 1) * block)};
    }
    case Collective::AllToAll: return concat([&](int q) { return std::pair<int, size_t>{q, size_t(r) * block}; });
    case Collective::Barrier: break;
  }
  return {};
}

struct IpcOutcome {
  std::optional<Error> error;
  std::vector<std::byte> output, input;
  std::string algorithm;
};

// Issues `a` on rank r's device copies of `input` and `output`, runs its
// schedule and reads both back once the caller's stream passed `done`.
IpcOutcome runIpc(IpcWorld& w, const CollArgs& args, const std::vector<std::byte>& input,
                  const std::vector<std::byte>& output, std::optional<IpcAlgo> algo = std::nullopt,
                  std::chrono::milliseconds timeout = 0ms) {
  const int r = args.rank;
  SimRank& me = *w.sim.ranks[size_t(r)];
  CollArgs a = args;
  auto dIn = ipcInPlace(a.coll) ? nullptr : deviceCopyOf(me, input);
  auto dOut = deviceCopyOf(me, ipcInPlace(a.coll) ? input : output);
  a.buf = dOut.get();
  a.input = dIn.get();
  IpcCollective op(me.order, *me.caller, *w.peers[size_t(r)], a, algo);
  IpcOutcome out;
  out.algorithm = op.algorithm();
  out.error = runOp(*w.sim.comms[size_t(r)], std::string(collectiveName(a.coll)), a.seq, op.schedule(), timeout);
  out.output = readAfter(me, *op.done(), dOut.get(), ipcInPlace(a.coll) ? input.size() : output.size());
  if (dIn) out.input = readAfter(me, *op.done(), dIn.get(), input.size());
  return out;
}

// An int64 all_reduce of pattern(q + k, ...) over ranks q, and what a
// device buffer read back holds.
std::vector<int64_t> ipcPatternSum(int size, int k, size_t n) {
  std::vector<int64_t> want(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (int q = 0; q < size; ++q) want[i] += (q + k) * 1000 + int64_t(i % 97) + 1;
  }
  return want;
}

std::vector<int64_t> ipcInt64s(const std::vector<std::byte>& bytes) {
  std::vector<int64_t> v(bytes.size() / 8);
  std::memcpy(v.data(), bytes.data(), v.size() * 8);
  return v;
}

// Seq 1 on rank r of a world of 3: an int64 all_reduce for which rank 1
// passes 99 elements and the others 100. Also returns r's input.
std::pair<IpcOutcome, std::vector<std::byte>> ipcMismatchedCall(IpcWorld& w, int r,
                                                                std::optional<IpcAlgo> algo = std::nullopt) {
  const size_t count = r == 1 ? 99 : 100;
  auto in = pattern(r, count * 8, DType::I64);
  const CollArgs a = ipcArgs(Collective::AllReduce, r, 3, 1, count, DType::I64, ReduceOp::Sum);
  IpcOutcome got = runIpc(w, a, in, {}, algo);
  return {std::move(got), std::move(in)};
}

const Collective kIpcCollectives[] = {Collective::AllReduce,     Collective::Reduce,   Collective::Broadcast,
                                   Collective::AllGather,     Collective::Gather,   Collective::Scatter,
                                   Collective::ReduceScatter, Collective::AllToAll};

}  // namespace ipc_test

using namespace ipc_test;

TEST_CASE("ipc plan: rounds cover the op, portions cover a round") {
  CollArgs a{Collective::ReduceScatter, 0, 4, 1};
  a.dtype = DType::F32;
  REQUIRE(ipcRoundElems(a, 64) == 4);  // 4 pieces of 4 floats
  a.coll = Collective::AllReduce;
  REQUIRE(ipcRoundElems(a, 64) == 16);
  REQUIRE(ipcRounds(0, 16) == 0);
  REQUIRE(ipcRounds(33, 16) == 3);
  REQUIRE(ipcRound(33, 16, 2) == std::pair<size_t, size_t>{32, 1});
  size_t covered = 0;
  for (int q = 0; q < 3; ++q) {
    REQUIRE(ipcPortion(7, 3, q).first == covered);
    covered += ipcPortion(7, 3, q).second;
  }
  REQUIRE(covered == 7);
}

TEST_CASE("ipc ring plan: slots fit the buffer, rounds cover the op, each step's chunk walks the ring") {
  const IpcRingPlan p = ipcRingPlan(100, 8, 3, 96);  // 12 elements: 4 slots of 3, rounds of 9
  REQUIRE(p.slots == 4);
  REQUIRE(p.slotElems == 3);
  REQUIRE(p.roundElems() == 9);
  REQUIRE(p.rounds == 12);
  REQUIRE(p.writes() == 12 * 4);
  REQUIRE(ipcRingPlan(100, 8, 3, 24).slots == 3);  // fewer slots rather than none
  REQUIRE(ipcRingPlan(100, 8, 3, 8).slots == 0);   // not two slots of an element
  REQUIRE(ipcRingPlan(100, 8, 1, 96).slots == 0);  // no ring of one rank
  for (int n : {2, 3, 4}) {
    for (int r = 0; r < n; ++r) {
      // Reduce-scatter ends with chunk r+1 reduced on rank r; every chunk once
      // in each phase.
      REQUIRE(ipcRingChunk(r, n, size_t(n) - 1) == (r + 1) % n);
      std::vector<int> seen(size_t(n), 0);
      for (size_t s = size_t(n) - 1; s < 2 * size_t(n) - 1; ++s) ++seen[size_t(ipcRingChunk(r, n, s))];
      REQUIRE(seen == std::vector<int>(size_t(n), 1));
      // Step s reads what the left peer wrote at step s - 1: the same chunk.
      for (size_t s = 1; s < 2 * size_t(n) - 1; ++s) {
        REQUIRE(ipcRingChunk(r, n, s) == ipcRingChunk(ring::left(r, n), n, s - 1));
      }
    }
  }
}

TEST_CASE("ipc cost model: one-shot small, two-shot medium, the ring large from 3 ranks, a forced one where it runs") {
  const size_t mib = size_t(1) << 20, buffer = 8 * mib;
  for (size_t bytes : {size_t(8), mib, 64 * mib, 1024 * mib}) {
    REQUIRE(ipcAllReduceAlgo(bytes, 4, 2, buffer) == IpcAlgo::OneShot);
  }
  REQUIRE(ipcAllReduceAlgo(8, 4, 4, buffer) == IpcAlgo::OneShot);
  REQUIRE(ipcAllReduceAlgo(mib, 4, 4, buffer) == IpcAlgo::TwoShot);
  REQUIRE(ipcAllReduceAlgo(64 * mib, 4, 4, buffer) == IpcAlgo::Ring);
  REQUIRE(ipcAllReduceAlgo(64 * mib, 4, 8, buffer) == IpcAlgo::Ring);
  for (IpcAlgo forced : kIpcAlgos) REQUIRE(ipcAllReduceAlgo(8, 4, 4, buffer, forced) == forced);
  // The ring needs two ranks and two slots of an element.
  REQUIRE(ipcAllReduceAlgo(8, 4, 1, buffer, IpcAlgo::Ring) == IpcAlgo::OneShot);
  REQUIRE(ipcAllReduceAlgo(64 * mib, 8, 4, 8, IpcAlgo::Ring) != IpcAlgo::Ring);
  REQUIRE(parseIpcAlgo("auto") == std::nullopt);
  REQUIRE(parseIpcAlgo("Ring") == IpcAlgo::Ring);
  REQUIRE(parseIpcAlgo("ONE_SHOT") == IpcAlgo::OneShot);
  REQUIRE(parseIpcAlgo("two_shot") == IpcAlgo::TwoShot);
  REQUIRE_THROWS_WITH(parseIpcAlgo("tree"), Catch::Contains("RINGX_IPC_ALGO='tree'"));
}

TEST_CASE("ipc: every collective and all_reduce algorithm equals its CPU reference for every dtype and op, in rounds") {
  const int size = GENERATE(sweep<int>({2, 3, 4}, {2, 4}));
  CAPTURE(size);
  // 48 bytes a buffer: an op of 13 elements takes several rounds, a short
  // last one included, for every element size.
  IpcWorld w(size, 48);
  uint64_t seq = 1;
  int checked = 0;
  for (Collective coll : kIpcCollectives) {
    const bool reduces =
        coll == Collective::AllReduce || coll == Collective::Reduce || coll == Collective::ReduceScatter;
    for (int d = 0; d < kNumDTypes; ++d) {
      for (int o = 0; o < (reduces ? kNumReduceOps : 1); ++o) {
        const DType dtype = DType(d);
        const ReduceOp op = ReduceOp(o);
        if (reduces && !reduceSupported(dtype, op)) continue;
        for (IpcAlgo algo : kIpcAlgos) {
          if (algo != IpcAlgo::OneShot && coll != Collective::AllReduce) continue;
          CAPTURE(collectiveName(coll), dtypeName(dtype), int(op), ipcAlgoName(algo));
          // The ring: two full rounds, then one that leaves chunks of unequal
          // length, more than the buffer holds and not a multiple of the ranks.
          const size_t ringRound = ipcRingPlan(0, dtypeSize(dtype), size, 48).roundElems();
          const size_t count = algo == IpcAlgo::Ring ? 2 * ringRound + size_t(size) + 1 : 13;
          const auto [inBytes, outBytes] = ipcSizes(coll, count, dtype, size);
          std::vector<std::vector<std::byte>> inputs, outputs;
          for (int r = 0; r < size; ++r) {
            inputs.push_back(ipcRandomBytes(inBytes, seq * 100 + uint64_t(r), dtype));
            outputs.push_back(ipcRandomBytes(outBytes, seq * 100 + 50 + uint64_t(r), dtype));
          }
          onEachRank(size, [&](int r) {
            const CollArgs a = ipcArgs(coll, r, size, seq, count, dtype, op);
            const IpcOutcome got = runIpc(w, a, inputs[size_t(r)], outputs[size_t(r)], algo);
            RANK_REQUIRE_NO_ERROR(got.error);
            if (coll == Collective::AllReduce) RANK_REQUIRE(got.algorithm == "ipc_" + std::string(ipcAlgoName(algo)));
            const auto& before = ipcInPlace(coll) ? inputs[size_t(r)] : outputs[size_t(r)];
            RANK_REQUIRE(got.output == ipcReference(a, inputs, before, algo, 48));
            if (!ipcInPlace(coll)) RANK_REQUIRE(got.input == inputs[size_t(r)]);
          });
          ++seq;
          ++checked;
        }
      }
    }
  }
  // 8 collectives; the reductions over every supported dtype x op, all_reduce
  // three times.
  REQUIRE(checked > 5 * kNumDTypes);
}

TEST_CASE("ipc: ops issued back to back reuse the buffers only after every peer has read them") {
  const int size = GENERATE(2, 3, 4);
  CAPTURE(size);
  IpcWorld w(size, 256);
  const size_t n = 1000;  // 32 rounds of 32 int64 each (the ring: 8 slots' worth a round)
  // Each algorithm after each other one, the ring after itself.
  const IpcAlgo algos[] = {IpcAlgo::Ring, IpcAlgo::Ring, IpcAlgo::OneShot, IpcAlgo::Ring, IpcAlgo::TwoShot,
                           IpcAlgo::OneShot, IpcAlgo::TwoShot, IpcAlgo::Ring};
  const int ops = int(std::size(algos));
  onEachRank(size, [&](int r) {
    SimRank& me = *w.sim.ranks[size_t(r)];
    std::vector<std::vector<std::byte>> hostIn;  // the caller's stream copies them late
    std::vector<std::shared_ptr<std::byte>> bufs;
    std::vector<std::unique_ptr<IpcCollective>> issued;
    for (int k = 0; k < ops; ++k) hostIn.push_back(pattern(r + k, n * 8, DType::I64));
    std::vector<std::future<std::optional<Error>>> results;
    for (int k = 0; k < ops; ++k) {
      bufs.push_back(deviceCopyOf(me, hostIn[size_t(k)]));
      CollArgs a = ipcArgs(Collective::AllReduce, r, size, uint64_t(k + 1), n, DType::I64, ReduceOp::Sum);
      a.buf = bufs.back().get();
      issued.push_back(
          std::make_unique<IpcCollective>(me.order, *me.caller, *w.peers[size_t(r)], a, algos[k]));
      results.push_back(std::async(std::launch::async, [&, s = issued.back()->schedule(), k]() mutable {
        return runOp(*w.sim.comms[size_t(r)], "all_reduce", uint64_t(k + 1), std::move(s));
      }));
    }
    for (int k = 0; k < ops; ++k) {
      RANK_REQUIRE_NO_ERROR(results[size_t(k)].get());
      const auto got = readAfter(me, *issued[size_t(k)]->done(), bufs[size_t(k)].get(), n * 8);
      RANK_REQUIRE(ipcInt64s(got) == ipcPatternSum(size, k, n));
    }
  });
}

TEST_CASE("ipc: a peer that never calls makes the others time out, their tensors untouched") {
  const IpcAlgo algo = GENERATE(IpcAlgo::OneShot, IpcAlgo::TwoShot, IpcAlgo::Ring);
  CAPTURE(ipcAlgoName(algo));
  const int size = 3;
  IpcWorld w(size, 128, 400ms);
  const size_t count = 100;
  onEachRank(size - 1, [&](int r) {
    const auto in = pattern(r, count * 4, DType::F32);
    const CollArgs a = ipcArgs(Collective::AllReduce, r, size, 1, count, DType::F32, ReduceOp::Sum);
    const auto start = std::chrono::steady_clock::now();
    const IpcOutcome got = runIpc(w, a, in, {}, algo);
    RANK_REQUIRE(got.algorithm == "ipc_" + std::string(ipcAlgoName(algo)));
    RANK_REQUIRE(got.error);
    RANK_REQUIRE(got.error->kind() == ErrorKind::Timeout);
    RANK_REQUIRE_SAYING(got.error->what(), std::string(got.error->what()).find("rank(s) 2") != std::string::npos);
    RANK_REQUIRE(std::chrono::steady_clock::now() - start < 10s);
    RANK_REQUIRE(got.output == in);
  });
}

TEST_CASE("ipc: a peer that dies mid-collective fails the others at once, their tensors untouched") {
  const int size = GENERATE(2, 3, 4);
  CAPTURE(size);
  IpcWorld w(size, 128, 20s);
  const size_t count = 100;
  const int victim = size - 1;
  // The victim's caller stream never gets to the collective: it publishes
  // its call (the survivors' verdict passes) but its device never arrives.
  SimRank& v = *w.sim.ranks[size_t(victim)];
  auto gate = v.device.allocPinned(sizeof(uint32_t));
  auto* word = reinterpret_cast<uint32_t*>(gate.get());
  std::atomic_ref<uint32_t>(*word).store(0);
  v.caller->waitFlag(word, 1);
  auto killer = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(300ms);
    w.sim.world.kill(victim);
  });
  onEachRank(size, [&](int r) {
    const auto in = pattern(r, count * 4, DType::F32);
    const CollArgs a = ipcArgs(Collective::AllReduce, r, size, 1, count, DType::F32, ReduceOp::Sum);
    if (r == victim) {
      // Once the survivors failed, the victim's device runs on and sees
      // their failure.
      std::this_thread::sleep_for(1s);
      std::atomic_ref<uint32_t>(*word).store(1, std::memory_order_release);
    }
    const auto start = std::chrono::steady_clock::now();
    const IpcOutcome got = runIpc(w, a, in, {});
    RANK_REQUIRE(got.error);
    RANK_REQUIRE(got.output == in);
    if (r != victim) {
      RANK_REQUIRE_SAYING(got.error->what(), got.error->kind() == ErrorKind::PeerClosed);
      RANK_REQUIRE(std::chrono::steady_clock::now() - start < 5s);
    }
  });
  killer.get();
}

TEST_CASE("ipc: ranks that call different collectives fail naming the rank, their tensors untouched") {
  const IpcAlgo algo = GENERATE(IpcAlgo::OneShot, IpcAlgo::TwoShot, IpcAlgo::Ring);
  CAPTURE(ipcAlgoName(algo));
  const int size = 3;
  IpcWorld w(size, 128, 5s);
  onEachRank(size, [&](int r) {
    const auto [got, in] = ipcMismatchedCall(w, r, algo);
    RANK_REQUIRE(got.error);
    RANK_REQUIRE(got.output == in);
    if (r != 1) {
      RANK_REQUIRE_SAYING(got.error->what(), got.error->kind() == ErrorKind::InvalidArgument);
      RANK_REQUIRE_SAYING(got.error->what(), std::string(got.error->what()).find("rank 1") != std::string::npos);
    }
  });
}

TEST_CASE("ipc: more ops in flight than identity slots, one submitted before the op it follows in its slot") {
  const int size = GENERATE(2, 3, 4);
  CAPTURE(size);
  IpcWorld w(size, 256);
  const size_t n = 100;
  // Twice the slots, plus one: ops 1 and 17 share a slot, and so do 2, 18
  // and 34. Rank 0 submits op 17 first, as when an op run inline at submit
  // gets to its slot before an earlier one still queued; it must still
  // publish after op 1, or the peers compare op 1 with op 17's record.
  const int ops = 2 * IpcPeers::kIdentitySlots + 1;
  const int early = IpcPeers::kIdentitySlots + 1;
  onEachRank(size, [&](int r) {
    SimRank& me = *w.sim.ranks[size_t(r)];
    std::vector<std::vector<std::byte>> hostIn;  // the caller's stream copies them late
    std::vector<std::shared_ptr<std::byte>> bufs;
    std::vector<std::unique_ptr<IpcCollective>> issued;
    for (int k = 1; k <= ops; ++k) hostIn.push_back(pattern(r + k, n * 8, DType::I64));
    for (int k = 1; k <= ops; ++k) {
      bufs.push_back(deviceCopyOf(me, hostIn[size_t(k - 1)]));
      CollArgs a = ipcArgs(Collective::AllReduce, r, size, uint64_t(k), n, DType::I64, ReduceOp::Sum);
      a.buf = bufs.back().get();
      issued.push_back(std::make_unique<IpcCollective>(me.order, *me.caller, *w.peers[size_t(r)], a));
    }
    std::vector<int> order;
    if (r == 0) order.push_back(early);
    for (int k = 1; k <= ops; ++k) {
      if (r != 0 || k != early) order.push_back(k);
    }
    std::map<int, std::future<std::optional<Error>>> results;
    for (int k : order) {
      results[k] = submitOp(*w.sim.comms[size_t(r)], "all_reduce", uint64_t(k), issued[size_t(k - 1)]->schedule());
    }
    for (int k = 1; k <= ops; ++k) {
      RANK_REQUIRE_NO_ERROR(results[k].get());
      const auto got = readAfter(me, *issued[size_t(k - 1)]->done(), bufs[size_t(k - 1)].get(), n * 8);
      RANK_REQUIRE_SAYING("op " + std::to_string(k), ipcInt64s(got) == ipcPatternSum(size, k, n));
    }
  });
}

TEST_CASE("ipc: after a failed op every later op of the group is refused at once, naming that failure") {
  const int size = 3;
  IpcWorld w(size, 128, 5s);
  onEachRank(size, [&](int r) {
    const auto [first, in] = ipcMismatchedCall(w, r);
    RANK_REQUIRE(first.error);
    SimRank& me = *w.sim.ranks[size_t(r)];
    const auto later = pattern(r, 800, DType::I64);
    for (Collective coll : {Collective::AllReduce, Collective::Broadcast}) {
      auto buf = deviceCopyOf(me, later);
      CollArgs a = ipcArgs(coll, r, size, 2, 100, DType::I64, ReduceOp::Sum);
      a.buf = buf.get();
      const auto start = std::chrono::steady_clock::now();
      try {
        IpcCollective refused(me.order, *me.caller, *w.peers[size_t(r)], a);
        RANK_REQUIRE_SAYING("accepted after a failure", false);
      } catch (const Error& e) {
        const std::string what = e.what();
        RANK_REQUIRE_SAYING(what, e.kind() == ErrorKind::Aborted);
        RANK_REQUIRE_SAYING(what, what.find(std::string(collectiveName(coll)) + " (rank " + std::to_string(r) +
                                            ", seq 2)") != std::string::npos);
        RANK_REQUIRE_SAYING(what, what.find("failed at an earlier op") != std::string::npos);
        RANK_REQUIRE_SAYING(what, what.find("seq 1)") != std::string::npos);
      }
      RANK_REQUIRE(std::chrono::steady_clock::now() - start < 1s);
      OnDevice on(&me.device);
      me.caller->synchronize();  // the copy into buf, before buf goes
    }
  });
}

TEST_CASE("ipc: every forced all_reduce algorithm gives the same sums, and unforced the cost model's choice runs") {
  const int size = GENERATE(2, 3, 4);
  CAPTURE(size);
  const size_t buffer = 512;
  IpcWorld w(size, buffer);
  uint64_t seq = 1;
  for (size_t n : {size_t(1), size_t(7), size_t(300)}) {
    for (std::optional<IpcAlgo> algo : {std::optional<IpcAlgo>(), std::optional(IpcAlgo::OneShot),
                                        std::optional(IpcAlgo::TwoShot), std::optional(IpcAlgo::Ring)}) {
      onEachRank(size, [&](int r) {
        const auto in = pattern(r + int(seq), n * 8, DType::I64);
        const CollArgs a = ipcArgs(Collective::AllReduce, r, size, seq, n, DType::I64, ReduceOp::Sum);
        const IpcOutcome got = runIpc(w, a, in, {}, algo);
        RANK_REQUIRE_NO_ERROR(got.error);
        const IpcAlgo ran = algo.value_or(ipcAllReduceAlgo(n * 8, 8, size, buffer));
        RANK_REQUIRE_SAYING(got.algorithm, got.algorithm == "ipc_" + std::string(ipcAlgoName(ran)));
        RANK_REQUIRE_SAYING(got.algorithm, ipcInt64s(got.output) == ipcPatternSum(size, int(seq), n));
      });
      ++seq;
    }
  }
}

TEST_CASE("ipc ring: with fewer slots than ranks, a slot is refilled only once the right peer has read it") {
  // With as many slots as ranks or more, the ring's own order keeps a rank
  // within n-1 writes of its right peer; 5 ranks through 2 slots need the
  // Left wait.
  const int size = 5;
  IpcWorld w(size, 16);  // two int64: 2 slots of one
  const size_t n = 120;
  REQUIRE(ipcRingPlan(n, 8, size, 16).slots == 2);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    onEachRank(size, [&](int r) {
      const auto in = pattern(r + int(seq), n * 8, DType::I64);
      const CollArgs a = ipcArgs(Collective::AllReduce, r, size, seq, n, DType::I64, ReduceOp::Sum);
      const IpcOutcome got = runIpc(w, a, in, {}, IpcAlgo::Ring);
      RANK_REQUIRE_NO_ERROR(got.error);
      RANK_REQUIRE(ipcInt64s(got.output) == ipcPatternSum(size, int(seq), n));
    });
  }
}

TEST_CASE("ipc ring: a peer killed mid-ring fails the others at once, every tensor untouched") {
  const int size = GENERATE(3, 4);
  CAPTURE(size);
  IpcWorld w(size, 128, 20s);
  const size_t count = 2000;  // 63 rounds of the ring at 4 ranks
  const int victim = size - 1, gated = ring::left(victim, size), told = ring::right(victim, size);
  // The victim's left peer cannot start (its caller's stream waits on a
  // gate), so the victim copies its first chunk in, tells its right peer,
  // and waits mid-ring for a chunk that comes only once it is dead.
  SimRank& g = *w.sim.ranks[size_t(gated)];
  auto gate = g.device.allocPinned(sizeof(uint32_t));
  auto* word = reinterpret_cast<uint32_t*>(gate.get());
  std::atomic_ref<uint32_t>(*word).store(0);
  g.caller->waitFlag(word, 1);
  const uint32_t* victimWrote = w.peers[size_t(told)]->mailbox(told, IpcPeers::Arrive, victim);
  // The gate opens only once the other survivors have their answer, so
  // their devices must end on the failure, not on a ring that completes.
  std::atomic<int> answered{0};
  auto killer = std::async(std::launch::async, [&] {
    auto until = std::chrono::steady_clock::now() + 10s;
    while (std::atomic_ref<const uint32_t>(*victimWrote).load() < 1 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    const bool midRing = std::atomic_ref<const uint32_t>(*victimWrote).load() >= 1;
    w.sim.world.kill(victim);
    until = std::chrono::steady_clock::now() + 10s;
    while (answered.load() < size - 2 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    std::atomic_ref<uint32_t>(*word).store(1, std::memory_order_release);
    return midRing;
  });
  onEachRank(size, [&](int r) {
    const auto in = pattern(r, count * 4, DType::F32);
    const CollArgs a = ipcArgs(Collective::AllReduce, r, size, 1, count, DType::F32, ReduceOp::Sum);
    const auto start = std::chrono::steady_clock::now();
    const IpcOutcome got = runIpc(w, a, in, {}, IpcAlgo::Ring);
    RANK_REQUIRE(got.error);
    RANK_REQUIRE(got.output == in);
    if (r == told) RANK_REQUIRE_SAYING(got.error->what(), got.error->kind() == ErrorKind::PeerClosed);
    if (r != victim) {
      // The others hear it from their own watch, or from the failed bits
      // their ring neighbours pass on, whichever comes first.
      const bool heard = got.error->kind() == ErrorKind::PeerClosed || got.error->kind() == ErrorKind::Aborted;
      RANK_REQUIRE_SAYING(got.error->what(), heard);
      RANK_REQUIRE(std::chrono::steady_clock::now() - start < 5s);
    }
    if (r != victim && r != gated) ++answered;
  });
  REQUIRE(killer.get());
}

TEST_CASE("ipc set-up: a rank that fails before publishing its handle fails its peers at once, naming it") {
  const int size = GENERATE(2, 3, 4);
  CAPTURE(size);
  SimWorld sim(size, 30);
  const int failing = 1;
  sim.ranks[failing]->device.failAllocShared("out of device memory (injected)");
  onEachRank(size, [&](int r) {
    const auto start = std::chrono::steady_clock::now();
    try {
      IpcPeers::create(sim.ranks[size_t(r)]->device, sim.store, "ipc", r, size, 256);
      RANK_REQUIRE_SAYING("set up", false);
    } catch (const Error& e) {
      const std::string what = e.what();
      RANK_REQUIRE_SAYING(what, what.find("out of device memory (injected)") != std::string::npos);
      if (r != failing) {
        RANK_REQUIRE_SAYING(what, e.kind() == ErrorKind::Aborted);
        RANK_REQUIRE_SAYING(what, what.find("(rank " + std::to_string(r) + ")") != std::string::npos);
        RANK_REQUIRE_SAYING(what, what.find("rank 1 failed to set up its ipc path") != std::string::npos);
      }
    }
    // The store would have waited 30 s.
    RANK_REQUIRE(std::chrono::steady_clock::now() - start < 5s);
  });
}
