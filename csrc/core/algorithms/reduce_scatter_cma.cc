#include "core/algorithms/cma_exchange.h"
#include "core/algorithms/registry.h"

namespace ringx {

// Intra-host reduce-scatter with one copy per byte (Linux CMA): the first
// exchange of the single-copy all-reduce, reducing into the output.
//
// Every rank publishes its input (n blocks); once every rank has published
// the same call, rank r reads block r of every peer's input, a piece at a
// time into scratch, and reduces the pieces with its own block r into its
// output in one n-way pass (rank order, float32 accumulation for 16-bit
// types, as the slot algorithm). A rank returns only once every peer has
// read its block out of this rank's input (core/algorithms/cma_exchange.h).
//
// Memory traffic per rank: (n-1)/n N read into scratch and an n-way reduce
// of N/n (N the input), against the slot algorithm's N copied in and the
// same reduce. PREMUL_SUM is left to the slot algorithm, which scales each
// rank's input by that rank's own factor as it copies it in.
Schedule buildReduceScatterCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  if (a.count == 0) return s;
  const int n = a.size, r = a.rank;
  const size_t blockBytes = a.bytes();
  const auto* in = static_cast<const std::byte*>(a.input);
  auto* out = static_cast<std::byte*>(a.buf);
  const ReduceNFn reduce = reduceNFn(a.dtype, a.op);
  const DType dtype = a.dtype;
  const double avg = a.op == ReduceOp::Avg ? 1.0 / n : 1.0;
  const CmaRecord mine{reinterpret_cast<uint64_t>(in), size_t(n) * blockBytes, 0};
  addCmaExchange(s, a.shm, a.cma, cmaIdentity(a, &buildReduceScatterCma), mine, [=](CmaExchange& x) {
    x.addReduce({uint64_t(r) * blockBytes, out, blockBytes, reduce, dtype, avg});
  });
  return s;
}

}  // namespace ringx
