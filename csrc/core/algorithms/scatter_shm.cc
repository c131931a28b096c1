#include <algorithm>
#include <cstring>

#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host scatter through the root's slots.
//
// Terms: each block (one rank's share) is cut into pieces of slot / n bytes;
// chunk k holds piece k of every rank's block, side by side in the root's
// slot. For each chunk:
//   1. copy in: the root copies piece k of each block into its slot; every
//      other rank only announces the chunk (header, counter 2 id - 1);
//   2. once every counter >= 2 id - 1: each rank copies its own piece out of
//      the root's slot and releases the chunk.
//
// Memory traffic: N copied in by the root (its whole input), N/n copied out
// by each rank; no bytes on any wire.
Schedule buildScatterShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  if (a.count == 0) return s;
  ShmArea* shm = a.shm;
  const int n = a.size, r = a.rank, root = a.root;
  const size_t es = dtypeSize(a.dtype), blockBytes = a.count * es;
  const size_t pieceElems = std::max<size_t>(1, shm->slotBytes() / es / size_t(n));
  const size_t pieceBytes = pieceElems * es;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = static_cast<const std::byte*>(a.input);
  const ShmChunks chunks(shm, a.count, pieceElems);
  const ShmArea::SlotHeader header = identityOf(a);

  StepId prev = kNoStep;
  chunks.forEach([&](uint64_t id, int, size_t start, size_t len) {
    const size_t off = start * es, bytes = len * es;
    prev = shmCopyIn(
        s, shm, id, header,
        [=](std::byte* slot) {
          if (r != root) return;
          for (int q = 0; q < n; ++q) std::memcpy(slot + q * pieceBytes, in + q * blockBytes + off, bytes);
        },
        prev);
    prev = shmReadAll(
        s, shm, id, header, [=](int which) { std::memcpy(out + off, shm->slot(root, which) + r * pieceBytes, bytes); },
        prev);
  });
  return s;
}

}  // namespace ringx
