// The copy-in step the shared-memory algorithms share.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/engine/schedule.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

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
        return true;
      },
      [=] { return shm->holdingSlot(id); }, {prev});
}

}  // namespace ringx
