#include <cstring>
#include <vector>

#include "core/algorithms/hier_steps.h"
#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/patterns/ring.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Hierarchical all-reduce for a group on several hosts with L ranks each:
// the narrow inter-host link carries each host's partial sum once instead of
// every rank's data, and all L ranks of a host use it at the same time.
//
// Terms: the buffer is cut into slot-sized chunks as in the shared-memory
// all-reduce (allreduce_shm.cc), and each chunk into L portions; local rank l
// owns portion l of every chunk, and its "share" is those portions laid end
// to end in a scratch buffer.
//   1. intra-host reduce-scatter (shared memory): every rank copies each
//      chunk into its slot; local rank l reduces portion l out of the L
//      slots into its share;
//   2. inter-host all-reduce of the share among the ranks with local rank l
//      on every host (one sub-group per local rank, all running at once),
//      by the cheapest flat all-reduce for that many hosts and bytes;
//   3. intra-host all-gather (shared memory): every rank copies its share
//      back into its portions of its slot, and every rank copies all
//      portions out into its buffer.
// AVG and PREMUL_SUM sum in every phase: the factor is applied once, to the
// input (PREMUL_SUM) or to the share before the all-gather (AVG).
//
// Bytes across a host's link each way: 2 (H-1)/H N for H hosts, against
// 2 (n-1)/n N on the busiest link of a flat ring over all n ranks.
Schedule buildAllReduceHier(const CollArgs& a) {
  const HostLayout& h = *a.hosts;
  ShmArea* shm = h.shm;
  const int L = h.localSize(), l = h.localRank;
  const ReduceOp sumOp = a.op == ReduceOp::Avg || a.op == ReduceOp::PremulSum ? ReduceOp::Sum : a.op;
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
  const ShmChunks scatter(shm, a.count, shm->slotBytes() / es);
  const ShmChunks gather(shm, a.count, shm->slotBytes() / es);

  size_t shareCount = 0;
  for (size_t k = 0; k < scatter.count; ++k) shareCount += ring::chunkLen(scatter.len(k), L, l);
  std::byte* share = s.scratch(shareCount * es);

  size_t at = 0;
  scatter.forEach([&](uint64_t id, int, size_t start, size_t m) {
    const std::byte* chunk = buf + start * es;
    const size_t off = ring::chunkStart(m, L, l) * es, len = ring::chunkLen(m, L, l);
    std::byte* dst = share + at * es;
    at += len;
    prev = shmCopyIn(s, shm, id, header, [=](std::byte* slot) { std::memcpy(slot, chunk, m * es); }, prev);
    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          if (!len) return;
          std::vector<const void*> srcs(static_cast<size_t>(L));
          for (int q = 0; q < L; ++q) srcs[size_t(q)] = shm->slot(q, which) + off;
          reduce(dst, srcs.data(), L, len);
        },
        prev);
  });

  CollArgs across = acrossHostsArgs(a, sumOp);
  across.buf = share;
  across.count = shareCount;
  auto [last, inter] = appendAcrossHosts(s, a, across, prev);
  last.push_back(prev);
  prev = s.join(last);

  const double avg = a.op == ReduceOp::Avg ? 1.0 / a.size : 1.0;
  at = 0;
  gather.forEach([&](uint64_t id, int, size_t start, size_t m) {
    std::byte* chunk = buf + start * es;
    const size_t off = ring::chunkStart(m, L, l) * es, len = ring::chunkLen(m, L, l);
    const std::byte* src = share + at * es;
    at += len;
    prev = shmCopyIn(
        s, shm, id, header,
        [=](std::byte* slot) {
          if (!len) return;
          std::memcpy(slot + off, src, len * es);
          if (avg != 1.0) scale(slot + off, len, dtype, avg);
        },
        prev);
    prev = shmReadAll(s, shm, id, header, [=](int which) { shmCopyPortionsOut(shm, which, m, es, chunk); }, prev);
  });
  s.setAlgorithm("hier(" + std::string(inter) + ")");
  return s;
}

}  // namespace ringx
