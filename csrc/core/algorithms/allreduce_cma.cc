#include "core/algorithms/cma_exchange.h"
#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"
#include "core/patterns/ring.h"

namespace ringx {

// Intra-host two-shot all-reduce with one copy per byte (Linux CMA).
//
// Terms: the buffer is cut into n slices; rank r owns slice r. Two
// single-copy exchanges (core/algorithms/cma_exchange.h), one after the other:
//   1. reduce-scatter: rank r reads slice r of every peer's buffer, a piece
//      at a time into scratch, and reduces the pieces with its own in one
//      n-way pass (rank order, float32 accumulation for 16-bit types, as the
//      slot algorithm) into slice r of its buffer. The exchange ends once
//      every peer has read what it needs of this rank's buffer, so every
//      slice is then reduced and the rest of the buffer no longer read.
//   2. all-gather: rank r reads every peer q's reduced slice q straight into
//      slice q of its buffer.
//
// Memory traffic per rank: (n-1)/n N read into scratch, an n-way reduce of
// N/n, (n-1)/n N read into place; against the slot algorithm's N copied in,
// the same reduce and N copied out. Four counter hand-offs for the whole op.
Schedule buildAllReduceCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  auto* buf = static_cast<std::byte*>(a.buf);
  const StepId prev = premultiply(s, a, buf);
  if (a.count == 0 || a.size == 1) return s;
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype), count = a.count;
  auto sliceStart = [=](int q) { return ring::chunkStart(count, n, q) * es; };
  auto sliceBytes = [=](int q) { return ring::chunkLen(count, n, q) * es; };
  const ReduceNFn reduce = reduceNFn(a.dtype, a.op);
  const DType dtype = a.dtype;
  const double avg = a.op == ReduceOp::Avg ? 1.0 / n : 1.0;
  const CmaRecord mine{reinterpret_cast<uint64_t>(buf), a.bytes(), 0};
  const CollIdentity identity = cmaIdentity(a, &buildAllReduceCma);

  const StepId reduced = addCmaExchange(
      s, a.shm, a.cma, identity, mine,
      [=](CmaExchange& x) {
        x.addReduce({sliceStart(r), buf + sliceStart(r), sliceBytes(r), reduce, dtype, avg});
      },
      prev);
  addCmaExchange(
      s, a.shm, a.cma, identity, mine,
      [=](CmaExchange& x) {
        for (int k = 1; k < n; ++k) {
          const int q = (r + k) % n;
          x.addRead(q, x.record(q).addr + sliceStart(q), buf + sliceStart(q), sliceBytes(q));
        }
      },
      reduced);
  return s;
}

}  // namespace ringx
