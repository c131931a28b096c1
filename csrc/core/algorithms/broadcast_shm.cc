#include <cstring>
#include <string>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/common/error.h"
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
// no bytes on any wire. The root's header carries the element count and
// dtype, so a rank that passed a different tensor fails instead of copying
// the wrong number of bytes.
Schedule buildBroadcastShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op);
  s.setAlgorithm("shm");
  if (a.size == 1 || a.count == 0) return s;
  ShmArea* shm = a.shm;
  const int r = a.rank, root = a.root;
  const size_t es = dtypeSize(a.dtype);
  auto* buf = static_cast<std::byte*>(a.buf);
  const ShmChunks chunks(shm, a.count, shm->slotBytes() / es);
  const ShmArea::SlotHeader header{a.count, uint32_t(a.dtype), 0};

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
      prev = s.poll(
          [=] {
            if (shm->chunksDone().load(std::memory_order_acquire) + 1 < id ||
                shm->counter(root).load(std::memory_order_acquire) < 2 * id) {
              return false;
            }
            const ShmArea::SlotHeader& theirs = shm->header(root, which);
            if (theirs.opCount != header.opCount) {
              throw Error(ErrorKind::InvalidArgument,
                          "the ranks passed tensors of different sizes: this rank has " +
                              std::to_string(header.opCount) + " elements, the root (rank " + std::to_string(root) +
                              ") has " + std::to_string(theirs.opCount));
            }
            if (theirs.dtype != header.dtype) {
              throw Error(ErrorKind::InvalidArgument,
                          "the ranks passed tensors of different dtypes: this rank has " +
                              std::string(dtypeName(DType(header.dtype))) + ", the root (rank " +
                              std::to_string(root) + ") has " + std::string(dtypeName(DType(theirs.dtype))));
            }
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
