#include <cstring>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host broadcast through the root's shared slots.
//
// The buffer is cut into slot-sized chunks numbered like the all-reduce's
// (ShmArea::reserveChunks), alternating between the root's two slots. For
// each chunk the root copies it into its slot once every rank has released
// the chunk that used the slot last, and raises its counter to 2 id; every
// other rank waits for that, copies the chunk out and releases it. The root
// fills chunk id + 1 while the others still copy chunk id out.
//
// Memory traffic: N copied in by the root, N copied out by each other rank;
// no bytes on any wire. The root's header carries the collective's identity
// (core/common/identity.h), so a rank that passed a different tensor, root or
// collective fails instead of copying the wrong bytes; the other ranks
// publish theirs too, for ranks in another collective that wait on them.
Schedule buildBroadcastShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  if (a.size == 1 || a.count == 0) return s;
  ShmArea* shm = a.shm;
  const int r = a.rank, root = a.root;
  const size_t es = dtypeSize(a.dtype);
  auto* buf = static_cast<std::byte*>(a.buf);
  const ShmChunks chunks(shm, a.count, shm->slotBytes() / es);
  const ShmArea::SlotHeader header = identityOf(a);

  StepId prev = kNoStep;
  chunks.forEach([&](uint64_t id, int which, size_t start, size_t len) {
    std::byte* chunk = buf + start * es;
    const size_t bytes = len * es;
    if (r == root) {
      prev = s.poll(
          [=] {
            if (shm->chunksDone().load(std::memory_order_acquire) + 1 < id || !shm->slotFree(id)) return false;
            std::memcpy(shm->slot(r, which), chunk, bytes);
            shm->header(r, which) = header;
            shm->finishChunk(id);
            return true;
          },
          [=] { return shm->holdingSlot(id); }, {prev});
    } else {
      // Announce which collective this rank is in (header, counter 2 id - 1)
      // so that a rank in another collective on the same chunk sees the
      // mismatch instead of waiting for this rank forever.
      prev = s.poll(
          [=] {
            if (shm->chunksDone().load(std::memory_order_acquire) + 1 < id || !shm->slotFree(id)) return false;
            shm->header(r, which) = header;
            shm->counter(r).store(2 * id - 1, std::memory_order_release);
            shm->ring();
            return true;
          },
          [=] { return shm->holdingSlot(id); }, {prev});
      prev = s.poll(
          [=] {
            const uint64_t rootAt = shm->counter(root).load(std::memory_order_acquire);
            if (rootAt < 2 * id - 1) return false;
            shm->checkSameOp(root, which, header);
            if (rootAt < 2 * id) return false;
            std::memcpy(chunk, shm->slot(root, which), bytes);
            shm->finishChunk(id);
            return true;
          },
          [=] {
            return shm->counter(root).load(std::memory_order_acquire) < 2 * id ? std::vector<int>{root}
                                                                              : std::vector<int>{};
          },
          {prev});
    }
  });
  return s;
}

}  // namespace ringx
