#include <cstring>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host broadcast through the root's shared slots.
//
// A buffer that fits an eager slot (ShmArea::eagerBytes) is one chunk in the
// root's ring of small slots: the root returns once it is there and may run
// ShmArea::kEagerSlots calls ahead of the slowest reader, as MPI's eager
// protocol lets a small send return before its receive is posted. A larger
// one is cut into slot-sized chunks alternating between the root's two
// slots, the root filling chunk id + 1 while the others still copy chunk id
// out. Chunks are numbered like the all-reduce's (ShmArea::reserveChunks).
// For each chunk (shmFromRoot) the root copies it into its slot once every
// rank has released the chunk that used the slot last, and raises its
// counter to 2 id; every other rank waits for that, copies the chunk out and
// releases it.
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
  const size_t es = dtypeSize(a.dtype);
  auto* buf = static_cast<std::byte*>(a.buf);
  const bool eager = a.count * es <= shm->eagerBytes();
  const ShmChunks chunks(shm, a.count, eager ? a.count : shm->slotBytes() / es);
  const FromRootSlots at{shm, eager};
  const ShmArea::SlotHeader header = identityOf(a);

  StepId prev = kNoStep;
  chunks.forEach([&](uint64_t id, int, size_t start, size_t len) {
    std::byte* chunk = buf + start * es;
    const size_t bytes = len * es;
    prev = shmFromRoot(
        s, at, a.root, id, header, [=](std::byte* slot) { std::memcpy(slot, chunk, bytes); },
        [=](const std::byte* slot) { std::memcpy(chunk, slot, bytes); }, prev);
  });
  return s;
}

}  // namespace ringx
