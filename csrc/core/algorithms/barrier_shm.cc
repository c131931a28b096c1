#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host barrier: one empty chunk. Each rank announces it (header and
// counter 2 id - 1, as a copy-in with nothing to copy) and leaves once every
// rank has, releasing the chunk. Two counter stores per rank and no message;
// the header check makes a rank in another collective fail, not pass.
Schedule buildBarrierShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  ShmArea* shm = a.shm;
  const uint64_t id = shm->reserveChunks(1);
  const ShmArea::SlotHeader header = identityOf(a);
  const StepId in = shmCopyIn(s, shm, id, header, [](std::byte*) {}, kNoStep);
  shmReadAll(s, shm, id, header, [](int) {}, in);
  return s;
}

}  // namespace ringx
