#include <algorithm>
#include <cstring>
#include <vector>

#include "core/algorithms/hier_steps.h"
#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Hierarchical reduce-scatter for a group on H hosts with L ranks each: the
// all-gather's mirror image, so every block's host partial sum crosses each
// link once.
//
// Terms: local rank q's "row" is the H blocks of the group ranks with local
// rank q (block h: host h's). Rows are cut into pieces of m elements such
// that L pieces fill one slot; chunk k holds piece k of every row, row q's at
// offset q m.
//   1. intra-host reduce-scatter through shared memory: every rank copies
//      piece k of each row out of its input into its slot (scaled by its own
//      factor for PREMUL_SUM); local rank l reduces piece k of row l out of
//      all L slots into its scratch row: the host's partial sums of the
//      blocks of every rank with local rank l;
//   2. inter-host reduce-scatter of the row among those ranks (one sub-group
//      per local rank, all at once), by the cheapest flat reduce-scatter,
//      straight into the output; AVG scales it by 1/n at the end.
Schedule buildReduceScatterHier(const CollArgs& a) {
  const HostLayout& h = *a.hosts;
  ShmArea* shm = h.shm;
  const int H = h.hosts, L = h.localSize(), l = h.localRank;
  const ReduceOp sumOp = a.op == ReduceOp::Avg || a.op == ReduceOp::PremulSum ? ReduceOp::Sum : a.op;
  Schedule s(a.dtype, sumOp, a.device);
  if (a.count == 0) {
    s.setAlgorithm("hier");
    return s;
  }
  const size_t es = dtypeSize(a.dtype), count = a.count, blockBytes = count * es;
  const size_t rowElems = size_t(H) * count;
  const auto* in = static_cast<const std::byte*>(a.input);
  std::byte* row = s.scratch(size_t(H) * blockBytes);
  const ReduceNFn reduce = reduceNFn(a.dtype, sumOp);
  const DType dtype = a.dtype;
  const double premul = a.op == ReduceOp::PremulSum ? a.premulFactor : 1.0;
  const ShmChunks chunks(shm, rowElems, shm->slotBytes() / (size_t(L) * es));
  const ShmArea::SlotHeader header = identityOf(a);
  const HostLayout* layout = &h;

  StepId prev = kNoStep;
  chunks.forEach([&](uint64_t id, int, size_t start, size_t m) {
    prev = shmCopyIn(
        s, shm, id, header,
        [=](std::byte* slot) {
          for (int q = 0; q < L; ++q) {
            std::byte* piece = slot + size_t(q) * m * es;
            // Row elements [start, start + m) of row q, from the blocks of
            // group ranks (host b, local rank q) in the input.
            for (size_t e = start; e < start + m;) {
              const size_t b = e / count, inBlock = e % count;
              const size_t n = std::min(count - inBlock, start + m - e);
              std::memcpy(piece + (e - start) * es,
                          in + size_t(layout->groupRank(int(b), q)) * blockBytes + inBlock * es, n * es);
              e += n;
            }
          }
          if (premul != 1.0) scale(slot, size_t(L) * m, dtype, premul);
        },
        prev);
    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          std::vector<const void*> srcs(static_cast<size_t>(L));
          for (int q = 0; q < L; ++q) srcs[size_t(q)] = shm->slot(q, which) + size_t(l) * m * es;
          reduce(row + start * es, srcs.data(), L, m);
        },
        prev);
  });

  CollArgs across = acrossHostsArgs(a, sumOp);
  across.input = row;
  across.buf = a.buf;
  across.count = count;
  auto [last, inter] = appendAcrossHosts(s, a, across, prev);
  if (a.op == ReduceOp::Avg) {
    last.push_back(prev);
    s.setScaleFactor(1.0 / a.size);
    s.add({StepKind::Scale, -1, 0, a.buf, nullptr, blockBytes}, last);
  }
  s.setAlgorithm("hier(" + std::string(inter) + ")");
  return s;
}

}  // namespace ringx
