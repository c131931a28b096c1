#include <cstring>
#include <vector>

#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host one-shot all-reduce through shared memory, for small buffers.
//
// Terms as in the two-shot all-reduce (allreduce_shm.cc): slot-sized chunks,
// chunk k in slot k mod 2 of every rank's segment, with a global number `id`.
// For each chunk:
//   1. copy in: the whole chunk into this rank's slot; counter := 2 id - 1;
//   2. reduce:  once every counter >= 2 id - 1, compare the headers, reduce
//      the whole chunk out of all n slots in one fused n-way pass into the
//      output, and release the chunk (counter := 2 id).
// One hand-off per chunk where the two-shot needs two: when ranks outnumber
// cores each hand-off waits for every rank to be scheduled, so that is what
// a small all-reduce costs. The price is n times the reduce work, which the
// cost model (select.cc) weighs against the hand-off it saves.
//
// Every rank reads the same n slots in the same order, its own included
// rather than its input, so every rank computes the same bits.
//
// Memory traffic per rank: N copied in, n N read and N written by the reduce.
Schedule buildAllReduceOneShot(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("oneshot");
  auto* buf = static_cast<std::byte*>(a.buf);
  StepId prev = premultiply(s, a, buf);
  if (a.count == 0) return s;

  ShmArea* shm = a.shm;
  const ShmReduce reduce(a);
  const size_t es = dtypeSize(a.dtype);
  const ShmChunks chunks(shm, a.count, shm->slotBytes() / es);
  const ShmArea::SlotHeader header = identityOf(a);
  chunks.forEach([&](uint64_t id, int, size_t start, size_t m) {
    std::byte* chunk = buf + start * es;
    prev = shmCopyIn(s, shm, id, header, [=](std::byte* slot) { std::memcpy(slot, chunk, m * es); }, prev);
    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          std::vector<const void*> srcs(shm->size());
          for (int q = 0; q < shm->size(); ++q) srcs[q] = shm->slot(q, which);
          reduce(chunk, srcs.data(), shm->size(), m);
        },
        prev);
  });
  return s;
}

}  // namespace ringx
