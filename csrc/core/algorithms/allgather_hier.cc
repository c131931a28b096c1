#include <algorithm>
#include <cstring>

#include "core/algorithms/hier_steps.h"
#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Hierarchical all-gather for a group on H hosts with L ranks each: every
// block crosses each host's link once.
//   1. inter-host all-gather of this rank's block among the ranks with its
//      local rank on every host (one sub-group per local rank, all at once),
//      by the cheapest flat all-gather, into a scratch "row" of H blocks;
//   2. intra-host all-gather of the rows through shared memory, slot-sized
//      pieces at a time: every rank copies local rank q's row out block by
//      block to the places of the group ranks (host h, local rank q).
// Bytes across a host's link each way: L (H-1) blocks, the least possible.
Schedule buildAllGatherHier(const CollArgs& a) {
  const HostLayout& h = *a.hosts;
  ShmArea* shm = h.shm;
  const int H = h.hosts, L = h.localSize();
  Schedule s(a.dtype, a.op, a.device);
  if (a.count == 0) {
    s.setAlgorithm("hier");
    return s;
  }
  const size_t es = dtypeSize(a.dtype), blockBytes = a.count * es, rowElems = size_t(H) * a.count;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = a.input ? static_cast<const std::byte*>(a.input) : out + size_t(a.rank) * blockBytes;
  std::byte* row = s.scratch(size_t(H) * blockBytes);

  CollArgs across = acrossHostsArgs(a, a.op);
  across.input = in;
  across.buf = row;
  across.count = a.count;
  auto [last, inter] = appendAcrossHosts(s, a, across, kNoStep);
  StepId prev = s.join(last);

  const ShmChunks chunks(shm, rowElems, shm->slotBytes() / es);
  const ShmArea::SlotHeader header = identityOf(a);
  const HostLayout* layout = &h;
  const size_t count = a.count;
  chunks.forEach([&](uint64_t id, int, size_t start, size_t len) {
    prev = shmCopyIn(s, shm, id, header, [=](std::byte* slot) { std::memcpy(slot, row + start * es, len * es); },
                     prev);
    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          for (int q = 0; q < L; ++q) {
            const std::byte* piece = shm->slot(q, which);
            // Row elements [start, start + len) of local rank q, cut at block
            // boundaries: block b of the row is group rank (host b, rank q)'s.
            for (size_t e = start; e < start + len;) {
              const size_t b = e / count, inBlock = e % count;
              const size_t n = std::min(count - inBlock, start + len - e);
              std::memcpy(out + size_t(layout->groupRank(int(b), q)) * blockBytes + inBlock * es,
                          piece + (e - start) * es, n * es);
              e += n;
            }
          }
        },
        prev);
  });
  s.setAlgorithm("hier(" + std::string(inter) + ")");
  return s;
}

}  // namespace ringx
