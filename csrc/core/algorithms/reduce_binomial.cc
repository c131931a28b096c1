#include <vector>

#include "core/algorithms/registry.h"
#include "core/patterns/ring.h"
#include "core/patterns/tree.h"

namespace ringx {

// Pipelined binomial-tree reduce: the mirror of the binomial broadcast.
//
// Terms: every rank accumulates into `acc` (the root into its own buffer,
// others into a scratch copy, so their inputs stay as they were). For each
// segment g, a rank receives segment g from each child into that child's
// small ring of receive slots, folds it into acc, and sends acc's segment g
// to its parent once every child's contribution is in.
//
// Bytes on the wire: N per non-root rank; steps: ceil(log2 n) + segments - 1.
Schedule buildReduceBinomial(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("binomial");
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype), bytes = a.bytes();
  if (a.count == 0) return s;
  const int parent = tree::binomialParent(r, a.root, n);
  const std::vector<int> children = tree::binomialChildren(r, a.root, n);
  const bool isRoot = parent < 0;
  const bool premul = a.op == ReduceOp::PremulSum;

  auto* acc = static_cast<std::byte*>(a.buf);
  StepId pre = kNoStep;
  if (!isRoot && (!children.empty() || premul)) {
    acc = s.scratch(bytes);
    pre = s.copy(acc, a.buf, bytes);
  }
  if (premul) {
    s.setScaleFactor(a.premulFactor);
    pre = s.scale(acc, bytes, {pre});
  }
  if (n == 1) return s;
  if (a.op == ReduceOp::Avg) s.setScaleFactor(1.0 / n);

  size_t segElems = std::max<size_t>(1, a.segmentBytes / es);
  while (ring::numSegments(a.count, segElems) > kMaxTagIndex) segElems *= 2;
  const size_t nseg = ring::numSegments(a.count, segElems);
  const size_t slotsPerChild = std::min<size_t>(nseg, 4);
  std::byte* slots = s.scratch(children.size() * slotsPerChild * segElems * es);
  std::vector<StepId> slotFree(children.size() * slotsPerChild, kNoStep);

  for (size_t g = 0; g < nseg; ++g) {
    const size_t off = g * segElems * es, len = ring::segmentLen(a.count, segElems, g) * es;
    StepId last = pre;
    for (size_t ci = 0; ci < children.size(); ++ci) {
      const size_t k = ci * slotsPerChild + g % slotsPerChild;
      std::byte* slot = slots + k * segElems * es;
      StepId in = s.recv(children[ci], collTag(a.seq, g), slot, len, {slotFree[k]});
      last = s.reduce(acc + off, slot, len, {in, last});
      slotFree[k] = last;
    }
    if (!isRoot) {
      s.send(parent, collTag(a.seq, g), acc + off, len, {last});
    } else if (a.op == ReduceOp::Avg) {
      s.scale(acc + off, len, {last});
    }
  }
  return s;
}

}  // namespace ringx
