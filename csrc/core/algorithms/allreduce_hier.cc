#include <algorithm>
#include <cstring>
#include <vector>

#include "core/algorithms/hier_steps.h"
#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/patterns/ring.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

namespace {

// The buffer is cut into at most this many pipeline blocks: what cannot
// overlap the inter-host phase (the first block's reduce-scatter, the last
// one's all-gather) is then at most 1/16 of the shared-memory work.
constexpr size_t kMaxBlocks = 16;
// Blocks of fewer shared-memory chunks would add inter-host phases (each a
// latency) for little overlap.
constexpr size_t kMinChunksPerBlock = 2;
// Blocks whose reduce-scatter runs before the all-gather of a block waiting
// for its inter-host phase: with two, the next block's inter-host phase is
// already on the wire when one ends, so the link never idles on shared memory.
constexpr size_t kLookahead = 2;

}  // namespace

// Hierarchical all-reduce for a group on several hosts with L ranks each:
// the narrow inter-host link carries each host's partial sum once instead of
// every rank's data, and all L ranks of a host use it at the same time.
//
// Terms: the buffer is cut into slot-sized chunks as in the shared-memory
// all-reduce (allreduce_shm.cc), and each chunk into L portions; local rank l
// owns portion l of every chunk, and its "share" is those portions laid end
// to end in a scratch buffer. Consecutive chunks form up to kMaxBlocks
// pipeline blocks, each taken through three phases:
//   1. intra-host reduce-scatter (shared memory): every rank copies each
//      chunk into its slot; local rank l reduces portion l out of the L
//      slots into its share;
//   2. inter-host all-reduce of the block's share among the ranks with local
//      rank l on every host (one sub-group per local rank, all running at
//      once), by the cheapest flat all-reduce for that many hosts and bytes;
//   3. intra-host all-gather (shared memory): every rank copies its share
//      back into its portions of its slot, and every rank copies all
//      portions out into its buffer.
// The shared-memory chunks run in one order on every rank (the slots allow
// no other): block b's reduce-scatter, then block b - kLookahead + 1's
// all-gather, so the shared-memory phases of some blocks run while others
// are on the wire.
// AVG and PREMUL_SUM sum in every phase: the factor is applied once, to the
// input (PREMUL_SUM) or to the share before the all-gather (AVG).
//
// Bytes across a host's link each way: 2 (H-1)/H N for H hosts, against
// 2 (n-1)/n N on the busiest link of a flat ring over all n ranks.
Schedule buildAllReduceHier(const CollArgs& a) {
  const HostLayout& h = *a.hosts;
  ShmArea* shm = h.shm;
  const int L = h.localSize(), l = h.localRank;
  const ReduceOp sumOp =
      a.op == ReduceOp::Avg || a.op == ReduceOp::PremulSum ? ReduceOp::Sum : a.op;
  Schedule s(a.dtype, sumOp, a.device);
  auto* buf = static_cast<std::byte*>(a.buf);
  StepId prev = premultiply(s, a, buf);
  if (a.count == 0) {
    s.setAlgorithm("hier");
    return s;
  }
  const size_t es = dtypeSize(a.dtype);
  const DType dtype = a.dtype;
  const ReduceNFn reduce = reduceNFn(a.dtype, sumOp);
  const ShmArea::SlotHeader header = identityOf(a);
  const size_t chunkElems = shm->slotBytes() / es;
  const size_t chunks = ring::numSegments(a.count, chunkElems);
  const size_t blocks = std::max<size_t>(1, std::min(kMaxBlocks, chunks / kMinChunksPerBlock));
  // Block b: elements [blockStart(b), blockStart(b + 1)), whole chunks.
  auto blockStart = [&](size_t b) {
    return std::min(a.count, ring::chunkStart(chunks, int(blocks), int(b)) * chunkElems);
  };
  // Where block b's part of this rank's share starts: its portions of the
  // earlier blocks' chunks, end to end.
  std::vector<size_t> shareAt(blocks + 1, 0);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t count = blockStart(b + 1) - blockStart(b);
    shareAt[b + 1] = shareAt[b];
    for (size_t at = 0; at < count; at += chunkElems)
      shareAt[b + 1] += ring::chunkLen(std::min(chunkElems, count - at), L, l);
  }
  std::byte* share = s.scratch(shareAt[blocks] * es);
  const double avg = a.op == ReduceOp::Avg ? 1.0 / a.size : 1.0;

  auto scatterBlock = [&](size_t b) {
    std::byte* dst = share + shareAt[b] * es;
    const ShmChunks part(shm, blockStart(b + 1) - blockStart(b), chunkElems);
    part.forEach([&](uint64_t id, int, size_t at, size_t m) {
      const std::byte* chunk = buf + (blockStart(b) + at) * es;
      const size_t off = ring::chunkStart(m, L, l) * es, len = ring::chunkLen(m, L, l);
      std::byte* out = dst;
      dst += len * es;
      prev = shmCopyIn(
          s, shm, id, header, [=](std::byte* slot) { std::memcpy(slot, chunk, m * es); }, prev);
      prev = shmReadAll(
          s, shm, id, header,
          [=](int which) {
            if (!len) return;
            std::vector<const void*> srcs(static_cast<size_t>(L));
            for (int q = 0; q < L; ++q) srcs[size_t(q)] = shm->slot(q, which) + off;
            reduce(out, srcs.data(), L, len);
          },
          prev);
    });
  };
  auto gatherBlock = [&](size_t b, StepId acrossDone) {
    const std::byte* src = share + shareAt[b] * es;
    const ShmChunks part(shm, blockStart(b + 1) - blockStart(b), chunkElems);
    const StepId both[] = {prev, acrossDone};
    prev = s.join(both);
    part.forEach([&](uint64_t id, int, size_t at, size_t m) {
      std::byte* chunk = buf + (blockStart(b) + at) * es;
      const size_t off = ring::chunkStart(m, L, l) * es, len = ring::chunkLen(m, L, l);
      const std::byte* in = src;
      src += len * es;
      prev = shmCopyIn(
          s, shm, id, header,
          [=](std::byte* slot) {
            if (!len) return;
            std::memcpy(slot + off, in, len * es);
            if (avg != 1.0) scale(slot + off, len, dtype, avg);
          },
          prev);
      prev = shmReadAll(
          s, shm, id, header, [=](int which) { shmCopyPortionsOut(shm, which, m, es, chunk); },
          prev);
    });
  };

  std::vector<StepId> acrossDone(blocks, kNoStep);
  std::string_view inter;
  for (size_t t = 0; t < blocks + kLookahead - 1; ++t) {
    if (t < blocks) {
      scatterBlock(t);
      CollArgs across = acrossHostsArgs(a, sumOp);
      across.buf = share + shareAt[t] * es;
      across.count = shareAt[t + 1] - shareAt[t];
      auto [last, name] = appendAcrossHosts(s, a, across, prev, t, blocks);
      last.push_back(prev);
      acrossDone[t] = s.join(last);
      inter = name;
    }
    if (t + 1 >= kLookahead) gatherBlock(t + 1 - kLookahead, acrossDone[t + 1 - kLookahead]);
  }
  s.setAlgorithm("hier(" + std::string(inter) + ")");
  return s;
}

}  // namespace ringx
