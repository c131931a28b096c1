// Which ranks of a group share a host, learnt once at group creation through
// the store. A host is what ranks can share memory on: the same kernel boot
// and the same /dev/shm, whatever their pid namespaces. Containers of one
// machine that share /dev/shm (one rank per container, as some launchers run
// them) are one host; ranks in network namespaces with a /dev/shm each are
// separate hosts, as they would be on a cluster.
#pragma once

#include <string>
#include <vector>

#include "core/common/store.h"

namespace ringx {

// This process's kernel boot and pid namespace: ranks with the same one see
// each other's processes (a peer's pid means the same process here).
std::string hostIdentity();

// This process's kernel boot, /dev/shm directory and user: ranks with the same
// one open the same shared-memory names.
std::string shmDomain();

// How a host's ranks reach each other, for the map RINGX_DEBUG=INFO prints.
enum class HostPath { SingleCopy, TwoCopy, Network };

struct Topology {
  // Host index of each rank; hosts are numbered in the order of their lowest
  // rank, so every rank computes the same numbering.
  std::vector<int> hostOf;
  // The ranks of each host share one pid namespace, /dev/shm and user, so
  // each can see the others' processes (UCX's shared-memory transports need
  // that: its posix one finds a peer's segment through /proc/PID). False when
  // some host was told apart by capability (containers that share /dev/shm
  // only).
  bool sameNamespacesPerHost = false;

  int hosts() const;
  std::vector<int> ranksOn(int host) const;
  bool singleHost() const { return hosts() <= 1; }
  // "2 hosts: host 0 = ranks 0-1; host 1 = ranks 2-3", and with `paths` (one
  // per host) how each host's ranks reach each other:
  // "... host 0 = ranks 0-1 (shared memory, two-copy); ...".
  std::string describe(const std::vector<HostPath>& paths = {}) const;

  // Collective over the group's ranks: each publishes its host candidates
  // under `keyPrefix` and reads everyone's. Ranks of one boot whose
  // namespaces or /dev/shm differ are told apart by capability: each opens
  // the others' probe segments, and the ranks that can open each other's are
  // one host (a second store round, only then).
  static Topology exchange(Store& store, const std::string& keyPrefix, int rank, int size);
  // The topology of a group of `ranks` (ranks of this one), in that order.
  Topology subset(const std::vector<int>& ranks) const;
};

// The path each host of `t` takes: `groupShm` when the whole group shares one
// area (single copy with `cma`), `hostShm` when each host's ranks share one
// (the hierarchical algorithms); the network otherwise, and for a rank alone
// on its host.
std::vector<HostPath> hostPaths(const Topology& t, bool groupShm, bool cma, bool hostShm);

}  // namespace ringx
