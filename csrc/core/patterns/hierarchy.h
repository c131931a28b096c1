// How much of the narrow inter-host links a broadcast, gather or scatter
// uses: pure arithmetic over which host each rank is on, for the cost model
// to compare the flat trees, the flat chain and the hierarchical algorithms.
#pragma once

#include <algorithm>
#include <vector>

#include "core/patterns/tree.h"

namespace ringx::hierarchy {

// The most of a broadcast's edges that cross one host's link in one
// direction (into the host or out of it), ranks on hosts as `hostOf` says;
// `forEachEdge(edge)` calls edge(from, to) for every edge between ranks, or
// edge(from, to, blocks) for one that carries that many blocks. Pipelined, a
// broadcast of N bytes takes at least that many times N over the link's
// rate.
template <typename ForEachEdge>
int busiestLink(const std::vector<int>& hostOf, ForEachEdge forEachEdge) {
  const int n = int(hostOf.size());
  const int hosts = n ? *std::max_element(hostOf.begin(), hostOf.end()) + 1 : 0;
  std::vector<int> out(size_t(hosts), 0), in(size_t(hosts), 0);
  forEachEdge([&](int from, int to, int weight = 1) {
    if (hostOf[size_t(from)] == hostOf[size_t(to)]) return;
    out[size_t(hostOf[size_t(from)])] += weight;
    in[size_t(hostOf[size_t(to)])] += weight;
  });
  int most = 0;
  for (int h = 0; h < hosts; ++h) most = std::max({most, out[size_t(h)], in[size_t(h)]});
  return most;
}

// The binomial broadcast tree over ranks 0..n-1 rooted at `root`.
inline int busiestLinkEdges(const std::vector<int>& hostOf, int root) {
  const int n = int(hostOf.size());
  return busiestLink(hostOf, [&](auto edge) {
    for (int r = 0; r < n; ++r) {
      for (int c : tree::binomialChildren(r, root, n)) edge(r, c);
    }
  });
}

// The chain root, root+1, ..., root-1: on hosts of consecutive ranks once
// each way, on interleaved ones more often.
inline int chainBusiestLinkEdges(const std::vector<int>& hostOf, int root) {
  const int n = int(hostOf.size());
  return busiestLink(hostOf, [&](auto edge) {
    for (int i = 0; i + 1 < n; ++i) edge((root + i) % n, (root + i + 1) % n);
  });
}

// The blocks of the binomial gather (or, the other way, scatter) over ranks
// 0..n-1 rooted at `root`: every rank's subtree run travels over the edge to
// its parent, so a link can carry a block more than once.
inline int binomialGatherBusiestLinkBlocks(const std::vector<int>& hostOf, int root) {
  const int n = int(hostOf.size());
  return busiestLink(hostOf, [&](auto edge) {
    for (int r = 0; r < n; ++r) {
      const int parent = tree::binomialParent(r, root, n);
      if (parent >= 0) edge(r, parent, tree::binomialSubtreeSize(tree::toVirtual(r, root, n), n));
    }
  });
}

// The direct gather or scatter, every block between its rank and the root:
// the root host's link carries the other hosts' blocks once, the least any
// gather can.
inline int directGatherBusiestLinkBlocks(const std::vector<int>& hostOf, int root) {
  const int n = int(hostOf.size());
  return busiestLink(hostOf, [&](auto edge) {
    for (int r = 0; r < n; ++r) {
      if (r != root) edge(r, root);
    }
  });
}

// The same for a binomial tree among one rank per host, rooted at the root's
// host: every edge crosses a link, and the root's host sends the most.
inline int busiestLinkEdgesAcrossHosts(int hosts, int rootHost) {
  std::vector<int> one(static_cast<size_t>(hosts));
  for (int h = 0; h < hosts; ++h) one[size_t(h)] = h;
  return busiestLinkEdges(one, rootHost);
}

}  // namespace ringx::hierarchy
