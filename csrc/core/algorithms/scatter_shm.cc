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
// slot. Where the n blocks together fit an eager slot (ShmArea::eagerBytes)
// they are one chunk in the root's ring of small slots, and the root may run
// ShmArea::kEagerSlots calls ahead of the slowest reader, as in the
// broadcast (broadcast_shm.cc). For each chunk (shmFromRoot):
//   1. the root copies piece k of each block into its slot (its own straight
//      to its output) and is done with the chunk: counter 2 id;
//   2. every other rank, once the root's counter reaches 2 id, copies its
//      own piece out of the root's slot and releases the chunk.
//
// Memory traffic: N copied in by the root (its whole input), N/n copied out
// by each rank; no bytes on any wire.
Schedule buildScatterShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  if (a.count == 0) return s;
  ShmArea* shm = a.shm;
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype), blockBytes = a.count * es;
  const bool eager = size_t(n) * blockBytes <= shm->eagerBytes();
  const size_t pieceElems = eager ? a.count : std::max<size_t>(1, shm->slotBytes() / es / size_t(n));
  const size_t pieceBytes = pieceElems * es;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = static_cast<const std::byte*>(a.input);
  const ShmChunks chunks(shm, a.count, pieceElems);
  const FromRootSlots at{shm, eager};
  const ShmArea::SlotHeader header = identityOf(a);

  StepId prev = kNoStep;
  chunks.forEach([&](uint64_t id, int, size_t start, size_t len) {
    const size_t off = start * es, bytes = len * es;
    prev = shmFromRoot(
        s, at, a.root, id, header,
        [=](std::byte* slot) {
          for (int q = 0; q < n; ++q) std::memcpy(slot + q * pieceBytes, in + q * blockBytes + off, bytes);
          std::memmove(out + off, in + r * blockBytes + off, bytes);
        },
        [=](const std::byte* slot) { std::memcpy(out + off, slot + r * pieceBytes, bytes); }, prev);
  });
  return s;
}

}  // namespace ringx
