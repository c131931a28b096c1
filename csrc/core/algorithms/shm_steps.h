// What the shared-memory algorithms share: their chunking, the copy-in step,
// and the step that reads every rank's copy.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/engine/schedule.h"
#include "core/patterns/ring.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// `count` elements cut into pieces of at most `pieceElems`, one chunk number
// reserved for each (ShmArea::reserveChunks), so every rank agrees on each
// chunk's slot and counter values.
struct ShmChunks {
  ShmChunks(ShmArea* shm, size_t count, size_t pieceElems)
      : pieceElems(pieceElems), count(ring::numSegments(count, pieceElems)), total(count),
        first(shm->reserveChunks(this->count)) {}

  // Calls step(id, which slot, first element, elements) for each chunk.
  template <typename Step>
  void forEach(Step step) const {
    for (size_t k = 0; k < count; ++k) step(first + k, int((first + k) % 2), k * pieceElems, len(k));
  }
  size_t len(size_t k) const { return ring::segmentLen(total, pieceElems, k); }

  size_t pieceElems;
  size_t count;
  size_t total;
  uint64_t first;
};

// Chunk `id` may fill this rank's slot once this rank has finished its
// previous chunk (ops run in submission order) and every rank has released
// the chunk that used the slot last. `fill(slot)` writes the slot; then the
// header is published and the counter raised to 2 id - 1, which tells the
// others the slot holds chunk `id`.
template <typename Fill>
StepId shmCopyIn(Schedule& s, ShmArea* shm, uint64_t id, ShmArea::SlotHeader header, Fill fill, StepId prev) {
  return s.poll(
      [=] {
        if (shm->chunksDone().load(std::memory_order_acquire) + 1 < id || !shm->slotFree(id)) return false;
        const int which = int(id % 2);
        fill(shm->slot(shm->rank(), which));
        shm->header(shm->rank(), which) = header;
        shm->counter(shm->rank()).store(2 * id - 1, std::memory_order_release);
        shm->ring();
        return true;
      },
      [=] { return shm->holdingSlot(id); }, {prev});
}

// Chunk `id` once every rank has copied it in: the headers are compared (so
// ranks that passed different tensors fail instead of reading mismatched
// bytes), `use(which)` reads the slots, and the chunk is released.
template <typename Use>
StepId shmReadAll(Schedule& s, ShmArea* shm, uint64_t id, ShmArea::SlotHeader header, Use use, StepId prev) {
  return s.poll(
      [=] {
        if (!shm->allReached(2 * id - 1)) return false;
        const int which = int(id % 2);
        shm->checkSameOp(which, header);
        use(which);
        shm->finishChunk(id);
        return true;
      },
      [=] { return shm->behind(2 * id - 1); }, {prev});
}

}  // namespace ringx
