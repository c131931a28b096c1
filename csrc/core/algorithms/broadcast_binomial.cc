#include <vector>

#include "core/algorithms/registry.h"
#include "core/patterns/ring.h"
#include "core/patterns/tree.h"

namespace ringx {

// Pipelined binomial-tree broadcast.
//
// Terms: the root's buffer is cut into segments of at most segmentBytes;
// each non-root rank receives segment g from its binomial parent straight
// into its buffer and forwards it to each of its children (largest subtree
// first) as soon as it has arrived, so segments stream down the tree.
//
// Bytes on the wire: N per non-root rank (the root sends N to each of its
// ceil(log2 n) children); steps: ceil(log2 n) + segments - 1.
Schedule buildBroadcastBinomial(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("binomial");
  if (a.size == 1 || a.count == 0) return s;
  const size_t es = dtypeSize(a.dtype);
  const size_t seg =
      ring::segmentWithin(a.count, std::max<size_t>(1, a.segmentBytes / es), kMaxTagIndex);
  const size_t nseg = ring::numSegments(a.count, seg);
  auto* buf = static_cast<std::byte*>(a.buf);
  const int parent = tree::binomialParent(a.rank, a.root, a.size);
  const std::vector<int> children = tree::binomialChildren(a.rank, a.root, a.size);
  for (size_t g = 0; g < nseg; ++g) {
    std::byte* p = buf + g * seg * es;
    const size_t bytes = ring::segmentLen(a.count, seg, g) * es;
    StepId have = parent >= 0 ? s.recv(parent, collTag(a.seq, g), p, bytes) : kNoStep;
    for (int c : children) s.send(c, collTag(a.seq, g), p, bytes, {have});
  }
  return s;
}

}  // namespace ringx
