#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

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
//      the block goes in PipelineBlocks, each piece's phase under its own
//      tags and starting once the one kBlocksInFlight before it has ended,
//      and the row holds piece b of every host's block end to end;
//   2. beside it, an intra-host all-gather of the host's own L blocks through
//      shared memory, which needs nothing from the other hosts;
//   3. once a piece has crossed, an intra-host all-gather of the other H - 1
//      hosts' parts of it, slot-sized at a time: every rank copies local rank
//      q's part out to the places of the group ranks (host h, local rank q),
//      while the next piece crosses.
// On 2 x 2 test-bed hosts the inter-host phase alone nearly reached the
// link's bound and the shared-memory phase after it added 60-100 ms at
// 64 MiB; now only the last piece's part of it follows the link.
// Bytes across a host's link each way: L (H-1) blocks, the least possible.
Schedule buildAllGatherHier(const CollArgs& a) {
  const HostLayout& h = *a.hosts;
  ShmArea* shm = h.shm;
  const int H = h.hosts, L = h.localSize(), me = h.host;
  Schedule s(a.dtype, a.op, a.device);
  if (a.count == 0) {
    s.setAlgorithm("hier");
    return s;
  }
  const size_t es = dtypeSize(a.dtype), blockBytes = a.count * es;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = a.input ? static_cast<const std::byte*>(a.input) : out + size_t(a.rank) * blockBytes;
  std::byte* row = s.scratch(size_t(H) * blockBytes);
  const PipelineBlocks pieces(a.count, h.chunkBytes / es);

  std::string_view inter;
  std::vector<StepId> crossed(pieces.size(), kNoStep);
  for (size_t b = 0; b < pieces.size(); ++b) {
    CollArgs across = acrossHostsArgs(a, a.op);
    across.input = in + pieces.start(b) * es;
    across.buf = row + size_t(H) * pieces.start(b) * es;
    across.count = pieces.len(b);
    const StepId after = b >= kBlocksInFlight ? crossed[b - kBlocksInFlight] : kNoStep;
    auto [ends, name] = appendAcrossHosts(s, a, across, after, h.across, b, pieces.size());
    crossed[b] = s.join(ends);
    inter = name;
  }

  const ShmArea::SlotHeader header = identityOf(a);
  const HostLayout* layout = &h;
  const size_t count = a.count, slotElems = shm->slotBytes() / es;
  const int self = h.localRank;
  const bool inPlace = a.input == nullptr;
  StepId prev = kNoStep;
  const ShmChunks own(shm, count, slotElems);
  own.forEach([&](uint64_t id, int, size_t start, size_t len) {
    prev = shmCopyIn(
        s, shm, id, header, [=](std::byte* slot) { std::memcpy(slot, in + start * es, len * es); },
        prev);
    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          for (int q = 0; q < L; ++q) {
            // This rank's own block: in place already, or straight from its
            // input (the inter-host phase may still be reading that block).
            if (q == self && inPlace) continue;
            const std::byte* from = q == self ? in + start * es : shm->slot(q, which);
            std::memcpy(out + size_t(layout->groupRank(me, q)) * blockBytes + start * es, from, len * es);
          }
        },
        prev);
  });

  for (size_t b = 0; b < pieces.size(); ++b) {
    const StepId both[] = {prev, crossed[b]};
    prev = s.join(both);
    // Element e of the other hosts' parts of piece b (m elements each, in
    // host order without this host): host hostOf(e), element e % m of the
    // piece; in the row at rowAt + hostOf(e) m + e % m.
    const size_t m = pieces.len(b), first = pieces.start(b), rowAt = size_t(H) * first;
    auto hostOf = [=](size_t e) { return e / m < size_t(me) ? e / m : e / m + 1; };
    const ShmChunks others(shm, size_t(H - 1) * m, slotElems);
    others.forEach([&](uint64_t id, int, size_t start, size_t len) {
      prev = shmCopyIn(
          s, shm, id, header,
          [=](std::byte* slot) {
            for (size_t e = start; e < start + len;) {
              const size_t n = std::min(m - e % m, start + len - e);
              const std::byte* from = row + (rowAt + hostOf(e) * m + e % m) * es;
              std::memcpy(slot + (e - start) * es, from, n * es);
              e += n;
            }
          },
          prev);
      prev = shmReadAll(
          s, shm, id, header,
          [=](int which) {
            for (int q = 0; q < L; ++q) {
              const std::byte* part = shm->slot(q, which);
              for (size_t e = start; e < start + len;) {
                const size_t n = std::min(m - e % m, start + len - e);
                const size_t to = size_t(layout->groupRank(int(hostOf(e)), q)) * blockBytes;
                std::memcpy(out + to + (first + e % m) * es, part + (e - start) * es, n * es);
                e += n;
              }
            }
          },
          prev);
    });
  }
  s.setAlgorithm("hier(" + std::string(inter) + ")");
  return s;
}

}  // namespace ringx
