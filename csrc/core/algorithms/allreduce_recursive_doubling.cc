#include "core/algorithms/fold.h"
#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"

namespace ringx {

// Recursive-doubling all-reduce, the latency algorithm: log2(p) rounds in
// which every rank exchanges its whole buffer with the partner whose rank
// differs in one bit and reduces the partner's copy into its own.
//
// Terms: p is the largest power of two <= n. The n-p "extra" ranks (r >= p)
// first fold their data into rank r-p and at the end receive the result back
// from it. Both partners of a round combine the same two values with a
// commutative op, so every rank ends with bit-identical results.
//
// Bytes on the wire per rank: N log2(p) (+2N on folded ranks); steps:
// log2(p) (+2 where n is not a power of two).
Schedule buildAllReduceRecursiveDoubling(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("recursive_doubling");
  const int n = a.size, r = a.rank;
  const size_t bytes = a.bytes();
  auto* buf = static_cast<std::byte*>(a.buf);

  const Fold fold = foldIn(s, a, buf, premultiply(s, a, buf));
  if (fold.done) return s;
  StepId last = fold.last;
  std::byte* tmp = fold.tmp;
  const int p = fold.p;
  uint64_t msg = 2;
  for (int mask = 1; mask < p; mask <<= 1, ++msg) {
    const int partner = r ^ mask;
    // The receive may land only after the previous round's reduce read tmp.
    StepId in = s.recv(partner, collTag(a.seq, msg), tmp, bytes, {last});
    StepId out = s.send(partner, collTag(a.seq, msg), buf, bytes, {last});
    last = s.reduce(buf, tmp, bytes, {in, out});
  }
  if (a.op == ReduceOp::Avg) {
    s.setScaleFactor(1.0 / n);
    last = s.scale(buf, bytes, {last});
  }
  foldOut(s, a, fold, buf, last);
  return s;
}

}  // namespace ringx
