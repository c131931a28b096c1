#include <cstring>

#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host all-to-all of equal blocks through shared memory.
//
// Only for all_to_all_single without split sizes: then every rank's n blocks
// have the same size on every rank, so all ranks cut them into the same
// chunks. Each block is cut into pieces of m elements such that n pieces fill
// a slot; chunk k holds piece k of the blocks for every destination, the
// block for rank j at offset j m. For each chunk:
//   1. copy in (once every rank has released the chunk that last used the
//      slot); counter := 2 id - 1;
//   2. once every counter >= 2 id - 1, copy piece r of every rank's slot into
//      that rank's block of the output, and release the chunk.
//
// Memory traffic per rank: N copied in, N copied out; no bytes on any wire.
Schedule buildAllToAllShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype), blockElems = a.sendBytes[0] / es;
  if (blockElems == 0) return s;
  ShmArea* shm = a.shm;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = static_cast<const std::byte*>(a.input);
  const ShmChunks chunks(shm, blockElems, shm->slotBytes() / (size_t(n) * es));
  // Every rank cuts its blocks into chunks by the count: the ranks must agree
  // on it, which the identity alone does not check for all_to_all.
  ShmArea::SlotHeader header = identityOf(a);
  header.count = a.count;
  const std::vector<size_t> sendOffsets = a.sendOffsets, recvOffsets = a.recvOffsets;

  StepId prev = kNoStep;
  chunks.forEach([&](uint64_t id, int, size_t start, size_t m) {
    const size_t off = start * es, bytes = m * es;
    prev = shmCopyIn(
        s, shm, id, header,
        [=](std::byte* slot) {
          for (int j = 0; j < n; ++j) std::memcpy(slot + j * bytes, in + sendOffsets[j] + off, bytes);
        },
        prev);
    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          for (int q = 0; q < n; ++q) std::memcpy(out + recvOffsets[q] + off, shm->slot(q, which) + r * bytes, bytes);
        },
        prev);
  });
  return s;
}

}  // namespace ringx
