#include <algorithm>
#include <cstring>
#include <string>
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
// rank q (block h: host h's). Blocks are cut into PipelineBlocks, the same
// on every host; row piece b is piece b of each of the H blocks, end to end.
// For each piece b:
//   1. intra-host reduce-scatter through shared memory, in chunks such that
//      L parts fill one slot, row q's part at offset q m: every rank copies
//      its input's part of each row into its slot (scaled by its own factor
//      for PREMUL_SUM); local rank l reduces row l's part out of all L slots
//      into its scratch row: the host's partial sums of the blocks of every
//      rank with local rank l;
//   2. inter-host reduce-scatter of row piece b among those ranks (one sub-
//      group per local rank, all at once), by the cheapest flat reduce-
//      scatter, straight into piece b of the output, under its own tags,
//      while piece b + 1's shared-memory phase runs. AVG scales the output
//      by 1/n at the end.
// Only the first piece's shared-memory phase runs before the link is busy.
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
  const auto* in = static_cast<const std::byte*>(a.input);
  auto* out = static_cast<std::byte*>(a.buf);
  std::byte* row = s.scratch(size_t(H) * blockBytes);
  const ReduceNFn reduce = reduceNFn(a.dtype, sumOp);
  const DType dtype = a.dtype;
  const double premul = a.op == ReduceOp::PremulSum ? a.premulFactor : 1.0;
  const size_t partElems = shm->slotBytes() / (size_t(L) * es);
  const ShmArea::SlotHeader header = identityOf(a);
  const HostLayout* layout = &h;
  const PipelineBlocks pieces(count, h.chunkBytes / es);

  std::string_view inter;
  StepId prev = kNoStep;
  std::vector<StepId> last;
  for (size_t b = 0; b < pieces.size(); ++b) {
    // Element e of row piece b: element first + e % m of host e / m's block.
    const size_t m = pieces.len(b), first = pieces.start(b), rowAt = size_t(H) * first;
    const ShmChunks chunks(shm, size_t(H) * m, partElems);
    chunks.forEach([&](uint64_t id, int, size_t start, size_t len) {
      prev = shmCopyIn(
          s, shm, id, header,
          [=](std::byte* slot) {
            for (int q = 0; q < L; ++q) {
              std::byte* part = slot + size_t(q) * len * es;
              for (size_t e = start; e < start + len;) {
                const size_t n = std::min(m - e % m, start + len - e);
                const size_t from = size_t(layout->groupRank(int(e / m), q)) * blockBytes;
                std::memcpy(part + (e - start) * es, in + from + (first + e % m) * es, n * es);
                e += n;
              }
            }
            if (premul != 1.0) scale(slot, size_t(L) * len, dtype, premul);
          },
          prev);
      prev = shmReadAll(
          s, shm, id, header,
          [=](int which) {
            std::vector<const void*> srcs(static_cast<size_t>(L));
            for (int q = 0; q < L; ++q) {
              srcs[size_t(q)] = shm->slot(q, which) + size_t(l) * len * es;
            }
            reduce(row + (rowAt + start) * es, srcs.data(), L, len);
          },
          prev);
    });

    CollArgs across = acrossHostsArgs(a, sumOp);
    across.input = row + rowAt * es;
    across.buf = out + first * es;
    across.count = m;
    auto [ends, name] = appendAcrossHosts(s, a, across, prev, h.across, b, pieces.size());
    last.insert(last.end(), ends.begin(), ends.end());
    inter = name;
  }
  if (a.op == ReduceOp::Avg) {
    last.push_back(prev);
    s.setScaleFactor(1.0 / a.size);
    s.add({StepKind::Scale, -1, 0, a.buf, nullptr, blockBytes}, last);
  }
  s.setAlgorithm("hier(" + std::string(inter) + ")");
  return s;
}

}  // namespace ringx
