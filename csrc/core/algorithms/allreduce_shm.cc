#include <cstring>
#include <string>
#include <vector>

#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/common/error.h"
#include "core/patterns/ring.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host two-shot all-reduce through shared memory (the technique of
// DeepSpeed's and vLLM's CPU all-reduce, without their per-call threads).
//
// Terms: the buffer is cut into chunks that fit one shared slot; chunk k uses
// slot k mod 2 of every rank's segment, and has a global number `id` (see
// ShmArea::reserveChunks). For each chunk:
//   1. copy in: copy the chunk into this rank's slot, all but this rank's
//      own portion (1/n of the chunk), which only this rank reduces;
//      counter := 2 id - 1;
//   2. reduce:  once every counter >= 2 id - 1, reduce this rank's portion
//      out of the n - 1 other slots and its own input in one fused n-way pass
//      with float32 accumulation for 16-bit types, into its own output and
//      from there into its own slot; counter := 2 id;
//   3. copy out: once every counter >= 2 id, copy every other rank's reduced
//      portion into the output.
// A slot is rewritten two chunks later, once every rank has released the
// chunk that used it last (ShmArea::slotFree): no closing barrier.
//
// Memory traffic per rank: (n-1)/n N copied in, N/n x n read and N/n written
// by the reduce, N/n copied from L1 into the slot, (n-1)/n N copied out; no
// bytes on any wire. At world 2 that reads and writes 2 N from memory, what
// an in-place pass over the tensor plus a copy of N from the peer needs.
//
// Each rank publishes its op's element count, dtype and reduce op in the
// slot's header with the copy-in; the reduce step compares every rank's
// before touching their bytes, so ranks that passed different tensors fail
// on every rank instead of reducing mismatched memory.
Schedule buildAllReduceShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  ShmArea* shm = a.shm;
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype);
  auto* buf = static_cast<std::byte*>(a.buf);
  StepId prev = premultiply(s, a, buf);
  if (a.count == 0) return s;

  const ReduceNFn reduce = reduceNFn(a.dtype, a.op);
  const DType dtype = a.dtype;
  const double avg = a.op == ReduceOp::Avg ? 1.0 / n : 1.0;
  const ShmChunks chunks(shm, a.count, shm->slotBytes() / es);
  const ShmArea::SlotHeader header = identityOf(a);

  chunks.forEach([&](uint64_t id, int which, size_t start, size_t m) {
    std::byte* chunk = buf + start * es;

    prev = shmCopyIn(
        s, shm, id, header, [=](std::byte* slot) { shmCopyInOthersPortions(slot, chunk, m, es, n, r); }, prev);
    prev = s.poll(
        [=] {
          if (!shm->allReached(2 * id - 1)) return false;
          shm->checkSameOp(which, header);
          shmReduceMyPortion(shm, which, m, reduce, dtype, avg, chunk, chunk, true);
          shm->counter(r).store(2 * id, std::memory_order_release);
          shm->ring();
          return true;
        },
        [=] { return shm->behind(2 * id - 1); }, {prev});

    prev = s.poll(
        [=] {
          if (!shm->allReached(2 * id)) return false;
          shmCopyPortionsOut(shm, which, m, es, chunk, r);
          shm->finishChunk(id);
          return true;
        },
        [=] { return shm->behind(2 * id); }, {prev});
  });
  return s;
}

}  // namespace ringx
