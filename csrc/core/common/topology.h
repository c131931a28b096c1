// Which ranks of a group share a host, learnt once at group creation through
// the store. A host is a kernel boot and pid namespace: ranks in different
// containers or network namespaces of one machine that cannot see each
// other's processes count as different hosts, as they would on a cluster.
#pragma once

#include <string>
#include <vector>

#include "core/common/store.h"

namespace ringx {

// This process's host, as compared between ranks.
std::string hostIdentity();

struct Topology {
  // Host index of each rank; hosts are numbered in the order of their lowest
  // rank, so every rank computes the same numbering.
  std::vector<int> hostOf;

  int hosts() const;
  std::vector<int> ranksOn(int host) const;
  bool singleHost() const { return hosts() <= 1; }
  // "2 hosts: host 0 = ranks 0-1, host 1 = ranks 2-3".
  std::string describe() const;

  // Collective over the group's ranks: each publishes its host identity under
  // `keyPrefix` and reads everyone's.
  static Topology exchange(Store& store, const std::string& keyPrefix, int rank, int size);
  // The topology of a group of `ranks` (ranks of this one), in that order.
  Topology subset(const std::vector<int>& ranks) const;
};

}  // namespace ringx
