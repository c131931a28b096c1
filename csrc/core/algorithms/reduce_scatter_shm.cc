#include <cstring>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host reduce-scatter through shared memory: the first half of the
// two-shot all-reduce, reducing straight into the output.
//
// Terms: each of the n input blocks is cut into pieces of m elements such
// that n pieces fill one slot; chunk k holds piece k of every block, block j's
// piece at offset j m. Chunks are numbered like the all-reduce's and alternate
// between the two slots. For each chunk:
//   1. copy in: once every rank has released the chunk that last used the
//      slot, copy piece k of each block but this rank's own into it (of every
//      block, scaled by this rank's own factor, for PREMUL_SUM);
//      counter := 2 id - 1;
//   2. reduce: once every counter >= 2 id - 1, reduce piece r of the other
//      ranks' slots and of this rank's input (its slot for PREMUL_SUM) into
//      the output in one fused n-way pass (float32 accumulation for 16-bit
//      types), scale for AVG, and release the chunk.
//
// Memory traffic per rank: (n-1)/n N copied in (N for PREMUL_SUM), N/n x n
// read and N/n written.
Schedule buildReduceScatterShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  if (a.count == 0) return s;
  ShmArea* shm = a.shm;
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype);
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = static_cast<const std::byte*>(a.input);
  const ReduceNFn reduce = reduceNFn(a.dtype, a.op);
  const DType dtype = a.dtype;
  const double avg = a.op == ReduceOp::Avg ? 1.0 / n : 1.0;
  const double premul = a.op == ReduceOp::PremulSum ? a.premulFactor : 1.0;
  // PREMUL_SUM scales this rank's own piece too, which it does as it copies.
  const bool ownFromInput = premul == 1.0;
  const ShmChunks chunks(shm, a.count, shm->slotBytes() / (size_t(n) * es));
  const ShmArea::SlotHeader header = identityOf(a);

  StepId prev = kNoStep;
  chunks.forEach([&](uint64_t id, int, size_t start, size_t m) {
    const size_t pieceOff = start * es;

    prev = shmCopyIn(
        s, shm, id, header,
        [=](std::byte* slot) {
          for (int j = 0; j < n; ++j)
            if (j != r || !ownFromInput) std::memcpy(slot + j * m * es, in + j * a.count * es + pieceOff, m * es);
          if (premul != 1.0) scale(slot, size_t(n) * m, dtype, premul);
        },
        prev);

    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          std::vector<const void*> srcs(n);
          for (int q = 0; q < n; ++q) srcs[q] = shm->slot(q, which) + size_t(r) * m * es;
          if (ownFromInput) srcs[r] = in + size_t(r) * a.count * es + pieceOff;
          std::byte* dst = out + pieceOff;
          reduce(dst, srcs.data(), n, m);
          if (avg != 1.0) scale(dst, m, dtype, avg);
        },
        prev);
  });
  return s;
}

}  // namespace ringx
