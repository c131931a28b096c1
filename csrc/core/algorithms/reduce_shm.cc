#include <cstring>

#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host reduce: the two-shot all-reduce (allreduce_shm.cc) whose last
// shot only the root takes. For each slot-sized chunk:
//   1. copy in: the chunk into this rank's slot, all but this rank's own
//      1/n of it; counter := 2 id - 1;
//   2. once every counter >= 2 id - 1: reduce this rank's 1/n of the chunk
//      out of the other n - 1 slots and its own input into its slot (the
//      root: straight into its buffer); a non-root rank then releases the
//      chunk (counter := 2 id), the root only marks it reduced;
//   3. the root, once every counter >= 2 id, copies every other rank's
//      reduced portion into its buffer and releases the chunk.
// The other ranks' buffers are left as they were: with PREMUL_SUM they scale
// a scratch copy.
//
// Memory traffic per rank: (n-1)/n N copied in, N/n x n read and N/n written
// by the reduce; (n-1)/n N copied out by the root; no bytes on any wire.
Schedule buildReduceShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  if (a.count == 0) return s;
  ShmArea* shm = a.shm;
  const int n = a.size, r = a.rank;
  const bool isRoot = r == a.root;
  const size_t es = dtypeSize(a.dtype), bytes = a.bytes();
  auto* buf = static_cast<std::byte*>(a.buf);
  const std::byte* src = buf;
  StepId prev = kNoStep;
  if (a.op == ReduceOp::PremulSum) {
    std::byte* scaled = buf;
    if (!isRoot) {
      scaled = s.scratch(bytes);
      prev = s.copy(scaled, buf, bytes);
    }
    s.setScaleFactor(a.premulFactor);
    prev = s.scale(scaled, bytes, {prev});
    src = scaled;
  }

  const ReduceNFn reduce = reduceNFn(a.dtype, a.op);
  const DType dtype = a.dtype;
  const double avg = a.op == ReduceOp::Avg ? 1.0 / n : 1.0;
  const ShmChunks chunks(shm, a.count, shm->slotBytes() / es);
  const ShmArea::SlotHeader header = identityOf(a);

  chunks.forEach([&](uint64_t id, int which, size_t start, size_t m) {
    const size_t chunkOff = start * es;
    const std::byte* chunk = src + chunkOff;
    prev = shmCopyIn(
        s, shm, id, header, [=](std::byte* slot) { shmCopyInOthersPortions(slot, chunk, m, es, n, r); }, prev);
    prev = s.poll(
        [=] {
          if (!shm->allReached(2 * id - 1)) return false;
          shm->checkSameOp(which, header);
          shmReduceMyPortion(shm, which, m, reduce, dtype, avg, chunk, isRoot ? buf + chunkOff : shm->slot(r, which),
                             false);
          if (isRoot) {
            shm->counter(r).store(2 * id, std::memory_order_release);
            shm->ring();
          } else {
            shm->finishChunk(id);
          }
          return true;
        },
        [=] { return shm->behind(2 * id - 1); }, {prev});
    if (!isRoot) return;
    prev = s.poll(
        [=] {
          if (!shm->allReached(2 * id)) return false;
          shmCopyPortionsOut(shm, which, m, es, buf + chunkOff, r);
          shm->finishChunk(id);
          return true;
        },
        [=] { return shm->behind(2 * id); }, {prev});
  });
  return s;
}

}  // namespace ringx
