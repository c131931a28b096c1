// Binomial tree arithmetic rooted anywhere: ranks are renumbered so the root
// is virtual rank 0; a virtual rank's parent clears its lowest set bit and
// its children add each lower power of two that stays inside the group.
#pragma once

#include <algorithm>
#include <vector>

namespace ringx::tree {

inline int toVirtual(int rank, int root, int size) { return (rank - root + size) % size; }
inline int toReal(int vrank, int root, int size) { return (vrank + root) % size; }

// -1 for the root.
inline int binomialParent(int rank, int root, int size) {
  int v = toVirtual(rank, root, size);
  if (v == 0) return -1;
  return toReal(v & (v - 1), root, size);
}

// Largest subtree first, so the deepest branch starts earliest.
inline std::vector<int> binomialChildren(int rank, int root, int size) {
  int v = toVirtual(rank, root, size);
  int limit = v == 0 ? size : (v & -v);
  int mask = 1;
  while (mask < limit) mask <<= 1;
  std::vector<int> children;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (mask < limit && v + mask < size) children.push_back(toReal(v + mask, root, size));
  }
  return children;
}

// How many virtual ranks the subtree of virtual rank v holds: the contiguous
// run [v, v + binomialSubtreeSize(v, size)).
inline int binomialSubtreeSize(int v, int size) {
  return v == 0 ? size : std::min(v & -v, size - v);
}

}  // namespace ringx::tree
