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
//      beside it, an intra-host all-gather of the host's own L blocks
//      through shared memory, which needs nothing from the other hosts;
//   2. then an intra-host all-gather of the rows' other H - 1 blocks, slot-
//      sized pieces at a time: every rank copies local rank q's row out block
//      by block to the places of the group ranks (host h, local rank q).
// On 2 x 2 test-bed hosts the inter-host phase alone nearly reached the
// link's bound and the shared-memory phase after it added 60-100 ms at
// 64 MiB; the own blocks are 1/H of that phase.
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

  CollArgs across = acrossHostsArgs(a, a.op);
  across.input = in;
  across.buf = row;
  across.count = a.count;
  auto [last, inter] = appendAcrossHosts(s, a, across, kNoStep);

  const ShmArea::SlotHeader header = identityOf(a);
  const HostLayout* layout = &h;
  const size_t count = a.count, slotElems = shm->slotBytes() / es;
  const int self = h.localRank;
  const bool inPlace = a.input == nullptr;
  StepId local = kNoStep;
  const ShmChunks own(shm, count, slotElems);
  own.forEach([&](uint64_t id, int, size_t start, size_t len) {
    local = shmCopyIn(s, shm, id, header, [=](std::byte* slot) { std::memcpy(slot, in + start * es, len * es); },
                      local);
    local = shmReadAll(
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
        local);
  });
  last.push_back(local);
  StepId prev = s.join(last);

  // Element e of the other hosts' part of a row is row element
  // e + count where its block lies at or past this host's.
  auto rowElem = [=](size_t e) { return e / count < size_t(me) ? e : e + count; };
  const ShmChunks others(shm, size_t(H - 1) * count, slotElems);
  others.forEach([&](uint64_t id, int, size_t start, size_t len) {
    prev = shmCopyIn(
        s, shm, id, header,
        [=](std::byte* slot) {
          for (size_t e = start; e < start + len;) {
            const size_t n = std::min(count - e % count, start + len - e);
            std::memcpy(slot + (e - start) * es, row + rowElem(e) * es, n * es);
            e += n;
          }
        },
        prev);
    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          for (int q = 0; q < L; ++q) {
            const std::byte* piece = shm->slot(q, which);
            // Block b of the row is group rank (host b, rank q)'s.
            for (size_t e = start; e < start + len;) {
              const size_t r = rowElem(e), b = r / count, inBlock = r % count;
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
