// Where a group's ranks sit when it spans hosts: what the hierarchical
// algorithms need to split a collective into an intra-host part (shared
// memory among this host's ranks) and an inter-host part (one sub-group per
// local rank, made of the ranks with that local rank on every host).
#pragma once

#include <vector>

#include "core/common/topology.h"

namespace ringx {

class ShmArea;

struct HostLayout {
  int hosts = 0;
  int host = 0;            // this rank's host
  int localRank = 0;       // this rank's index among its host's ranks
  std::vector<int> local;  // the group ranks on this host, by local rank
  std::vector<int> across; // the group rank with this local rank on each host
  std::vector<int> rankAt;  // the group rank of local rank q on host h: [h * L + q]
  ShmArea* shm = nullptr;  // shared by `local`, area rank = local rank

  int localSize() const { return int(local.size()); }
  int groupRank(int host, int localRank) const { return rankAt[size_t(host * localSize() + localRank)]; }

  // The layout of `rank` when the hierarchical algorithms apply: more than
  // one host, and the same number of ranks (at least two) on every host, so
  // that every host cuts a buffer into the same pieces. Otherwise an empty
  // layout (hosts == 0), and the flat algorithms serve the group.
  static HostLayout of(const Topology& t, int rank) {
    HostLayout h;
    const int hosts = t.hosts();
    if (hosts < 2) return h;
    const size_t perHost = t.ranksOn(0).size();
    if (perHost < 2) return h;
    for (int i = 1; i < hosts; ++i) {
      if (t.ranksOn(i).size() != perHost) return h;
    }
    h.hosts = hosts;
    h.host = t.hostOf[size_t(rank)];
    h.local = t.ranksOn(h.host);
    for (size_t i = 0; i < h.local.size(); ++i) {
      if (h.local[i] == rank) h.localRank = int(i);
    }
    for (int i = 0; i < hosts; ++i) {
      const std::vector<int> on = t.ranksOn(i);
      h.across.push_back(on[size_t(h.localRank)]);
      h.rankAt.insert(h.rankAt.end(), on.begin(), on.end());
    }
    return h;
  }
};

}  // namespace ringx
