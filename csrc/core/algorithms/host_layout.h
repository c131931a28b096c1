// Where a group's ranks sit when it spans hosts: what the hierarchical
// algorithms need to split a collective into an intra-host part (shared
// memory among this host's ranks) and an inter-host part (sub-groups of one
// rank per host).
#pragma once

#include <algorithm>
#include <vector>

#include "core/common/topology.h"

namespace ringx {

class ShmArea;

struct HostLayout {
  int hosts = 0;
  int host = 0;            // this rank's host
  int localRank = 0;       // this rank's index among its host's ranks
  std::vector<int> local;  // the group ranks on this host, by local rank
  std::vector<int> across; // the group rank with this local rank on each host (even layouts)
  std::vector<std::vector<int>> hostRanks;  // the group ranks on host h, by local rank
  // Every host has the same number of ranks: all_gather and reduce_scatter
  // need that (every host cuts a buffer into the same pieces); all_reduce
  // cuts into `portions()` pieces whatever the counts.
  bool even = false;
  ShmArea* shm = nullptr;  // shared by `local`, area rank = local rank; null when alone on its host
  // The chunk every host cuts all_reduce's buffer into (its inter-host
  // phases must agree on counts): at most every host's slot.
  size_t chunkBytes = 0;

  int localSize() const { return int(local.size()); }
  int groupRank(int host, int localRank) const { return hostRanks[size_t(host)][size_t(localRank)]; }
  // all_reduce's pieces of a chunk: as many as the largest host has ranks.
  // Local rank q of host h owns the pieces p with p % (ranks on h) == q, so
  // every piece has one owner on every host, and a host with fewer ranks
  // gives each of them more pieces.
  int portions() const {
    size_t most = 0;
    for (const auto& on : hostRanks) most = std::max(most, on.size());
    return int(most);
  }
  // The group ranks owning piece p, one per host, in host order: piece p's
  // inter-host sub-group.
  std::vector<int> ownersOf(int p) const {
    std::vector<int> owners;
    for (const auto& on : hostRanks) owners.push_back(on[size_t(p) % on.size()]);
    return owners;
  }

  // The layout of `rank` when the hierarchical algorithms apply: more than
  // one host, and some host with at least two of the group's ranks (else
  // there is nothing to share). Otherwise an empty layout (hosts == 0), and
  // the flat algorithms serve the group.
  static HostLayout of(const Topology& t, int rank) {
    HostLayout h;
    const int hosts = t.hosts();
    if (hosts < 2) return h;
    size_t most = 0;
    for (int i = 0; i < hosts; ++i) most = std::max(most, t.ranksOn(i).size());
    if (most < 2) return h;
    h.hosts = hosts;
    h.host = t.hostOf[size_t(rank)];
    h.local = t.ranksOn(h.host);
    for (size_t i = 0; i < h.local.size(); ++i) {
      if (h.local[i] == rank) h.localRank = int(i);
    }
    h.even = true;
    for (int i = 0; i < hosts; ++i) {
      h.hostRanks.push_back(t.ranksOn(i));
      h.even = h.even && h.hostRanks.back().size() == h.local.size();
    }
    if (h.even) h.across = h.ownersOf(h.localRank);
    return h;
  }
};

}  // namespace ringx
