#include <algorithm>

#include "core/algorithms/fold.h"
#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"
#include "core/patterns/ring.h"

namespace ringx {

// Rabenseifner's all-reduce: a reduce-scatter by recursive halving, then an
// all-gather by recursive doubling. Bandwidth of the ring in 2 log2(p) steps
// instead of 2(n-1).
//
// Terms: p is the largest power of two <= n; the n-p "extra" ranks (r >= p)
// fold their data into rank r-p first and get the result back from it at
// the end, as in recursive doubling. The buffer is cut into p blocks.
// Halving: in the round with bit `mask` (p/2 down to 1) a rank keeps the half
// of its current block range on its side of that bit, sends the other half to
// the partner r ^ mask and reduces the partner's copy of the kept half into
// its own; rank r ends owning block r, fully reduced (and scaled for AVG).
// Doubling: the same rounds in reverse order exchange owned ranges, which
// double each round, straight into the buffer. Each block is reduced by one
// rank only, so every rank ends with the same bits.
//
// Bytes on the wire per rank: 2 (p-1)/p N (+2N on folded ranks); steps:
// 2 log2(p) (+2 where n is not a power of two).
Schedule buildAllReduceRabenseifner(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("rabenseifner");
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype);
  auto* buf = static_cast<std::byte*>(a.buf);

  const Fold fold = foldIn(s, a, buf, premultiply(s, a, buf));
  if (fold.done) return s;
  StepId last = fold.last;
  std::byte* tmp = fold.tmp;
  const int p = fold.p;

  // Byte offset of block b, and of the end of blocks [lo, hi).
  auto at = [&](int b) { return ring::chunkStart(a.count, p, b) * es; };
  uint64_t msg = 2;
  int lo = 0, hi = p;
  for (int mask = p / 2; mask >= 1; mask /= 2, ++msg) {
    const int partner = r ^ mask, mid = (lo + hi) / 2;
    const bool lower = (r & mask) == 0;
    const int keepLo = lower ? lo : mid, keepHi = lower ? mid : hi;
    const int sendLo = lower ? mid : lo, sendHi = lower ? hi : mid;
    // The receive may land only after the previous round's reduce read tmp.
    StepId in = s.recv(partner, collTag(a.seq, msg), tmp + at(keepLo), at(keepHi) - at(keepLo), {last});
    StepId out = s.send(partner, collTag(a.seq, msg), buf + at(sendLo), at(sendHi) - at(sendLo), {last});
    last = s.reduce(buf + at(keepLo), tmp + at(keepLo), at(keepHi) - at(keepLo), {in, out});
    lo = keepLo;
    hi = keepHi;
  }
  if (a.op == ReduceOp::Avg) {
    s.setScaleFactor(1.0 / n);
    last = s.scale(buf + at(r), at(r + 1) - at(r), {last});
  }
  for (int mask = 1; mask < p; mask *= 2, ++msg) {
    const int partner = r ^ mask, width = hi - lo;
    const int theirLo = (r & mask) == 0 ? hi : lo - width;
    // Each round sends what the previous ones gathered: chain on the receives.
    s.send(partner, collTag(a.seq, msg), buf + at(lo), at(hi) - at(lo), {last});
    last = s.recv(partner, collTag(a.seq, msg), buf + at(theirLo), at(theirLo + width) - at(theirLo), {last});
    lo = std::min(lo, theirLo);
    hi = lo + 2 * width;
  }
  foldOut(s, a, fold, buf, last);
  return s;
}

}  // namespace ringx
