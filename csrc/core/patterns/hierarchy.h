// How much of the narrow inter-host links a broadcast uses: pure arithmetic
// over which host each rank is on, for the cost model to compare the flat
// binomial tree, the flat chain and the hierarchical broadcast.
#pragma once

#include <algorithm>
#include <vector>

#include "core/patterns/tree.h"

namespace ringx::hierarchy {

// The most edges of the binomial broadcast tree over ranks 0..n-1 rooted at
// `root` that cross one host's link in one direction (into the host or out of
// it), ranks on hosts as `hostOf` says. Pipelined, a broadcast of N bytes
// takes at least that many times N over the link's rate.
inline int busiestLinkEdges(const std::vector<int>& hostOf, int root) {
  const int n = int(hostOf.size());
  const int hosts = n ? *std::max_element(hostOf.begin(), hostOf.end()) + 1 : 0;
  std::vector<int> out(size_t(hosts), 0), in(size_t(hosts), 0);
  for (int r = 0; r < n; ++r) {
    for (int c : tree::binomialChildren(r, root, n)) {
      if (hostOf[size_t(c)] == hostOf[size_t(r)]) continue;
      ++out[size_t(hostOf[size_t(r)])];
      ++in[size_t(hostOf[size_t(c)])];
    }
  }
  int most = 0;
  for (int h = 0; h < hosts; ++h) most = std::max({most, out[size_t(h)], in[size_t(h)]});
  return most;
}

// The same for the chain root, root+1, ..., root-1: on hosts of consecutive
// ranks once each way, on interleaved ones more often.
inline int chainBusiestLinkEdges(const std::vector<int>& hostOf, int root) {
  const int n = int(hostOf.size());
  const int hosts = n ? *std::max_element(hostOf.begin(), hostOf.end()) + 1 : 0;
  std::vector<int> out(size_t(hosts), 0), in(size_t(hosts), 0);
  for (int i = 0; i + 1 < n; ++i) {
    const int from = hostOf[size_t((root + i) % n)], to = hostOf[size_t((root + i + 1) % n)];
    if (from == to) continue;
    ++out[size_t(from)];
    ++in[size_t(to)];
  }
  int most = 0;
  for (int h = 0; h < hosts; ++h) most = std::max({most, out[size_t(h)], in[size_t(h)]});
  return most;
}

// The same for a binomial tree among one rank per host, rooted at the root's
// host: every edge crosses a link, and the root's host sends the most.
inline int busiestLinkEdgesAcrossHosts(int hosts, int rootHost) {
  std::vector<int> one(static_cast<size_t>(hosts));
  for (int h = 0; h < hosts; ++h) one[size_t(h)] = h;
  return busiestLinkEdges(one, rootHost);
}

}  // namespace ringx::hierarchy
