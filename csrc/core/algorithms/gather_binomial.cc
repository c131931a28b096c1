#include <vector>

#include "core/algorithms/registry.h"
#include "core/patterns/tree.h"

namespace ringx {

// Binomial-tree gather.
//
// Terms: each rank collects the blocks of its subtree into a run ordered by
// virtual rank (its own block first, then each child's run at offset
// vchild - v), and sends the whole run to its parent once all children's runs
// are in. The root finally copies the run into the output in real rank order.
//
// Bytes on the wire: each block travels once per tree level above it, at most
// ceil(log2 n) times; steps: ceil(log2 n).
Schedule buildGatherBinomial(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("binomial");
  const int n = a.size, r = a.rank;
  const size_t block = a.bytes();
  const int v = tree::toVirtual(r, a.root, n);
  const int parent = tree::binomialParent(r, a.root, n);
  const int mine = tree::binomialSubtreeSize(v, n);
  std::byte* run = s.scratch(mine * block);
  std::vector<StepId> arrived{block ? s.copy(run, a.input, block) : kNoStep};
  for (int c : tree::binomialChildren(r, a.root, n)) {
    const int vc = tree::toVirtual(c, a.root, n);
    const size_t runBytes = tree::binomialSubtreeSize(vc, n) * block;
    arrived.push_back(s.recv(c, collTag(a.seq, 0), run + (vc - v) * block, runBytes));
  }
  if (parent >= 0) {
    s.add({StepKind::Send, parent, collTag(a.seq, 0), nullptr, run, mine * block}, arrived);
    return s;
  }
  auto* out = static_cast<std::byte*>(a.buf);
  for (int q = 0; q < n && block; ++q) {
    s.add({StepKind::Copy, -1, 0, out + q * block, run + tree::toVirtual(q, a.root, n) * block, block}, arrived);
  }
  return s;
}

// Binomial-tree scatter, the mirror of the gather: the root lays the blocks
// out by virtual rank, each rank receives its subtree's run from its parent,
// forwards each child's sub-run and keeps its own (first) block.
Schedule buildScatterBinomial(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("binomial");
  const int n = a.size, r = a.rank;
  const size_t block = a.bytes();
  const int v = tree::toVirtual(r, a.root, n);
  const int parent = tree::binomialParent(r, a.root, n);
  const int mine = tree::binomialSubtreeSize(v, n);
  std::byte* run = s.scratch(mine * block);
  std::vector<StepId> ready;
  if (parent >= 0) {
    ready.push_back(s.recv(parent, collTag(a.seq, 0), run, mine * block));
  } else {
    const auto* in = static_cast<const std::byte*>(a.input);
    for (int q = 0; q < n && block; ++q) {
      ready.push_back(s.copy(run + tree::toVirtual(q, a.root, n) * block, in + q * block, block));
    }
  }
  for (int c : tree::binomialChildren(r, a.root, n)) {
    const int vc = tree::toVirtual(c, a.root, n);
    const size_t runBytes = tree::binomialSubtreeSize(vc, n) * block;
    s.add({StepKind::Send, c, collTag(a.seq, 0), nullptr, run + (vc - v) * block, runBytes}, ready);
  }
  if (block) s.add({StepKind::Copy, -1, 0, a.buf, run, block}, ready);
  return s;
}

}  // namespace ringx
