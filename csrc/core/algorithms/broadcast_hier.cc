#include <algorithm>
#include <string>
#include <vector>

#include "core/algorithms/hier_steps.h"
#include "core/algorithms/registry.h"

namespace ringx {

// Hierarchical broadcast for a group on several hosts: the root's buffer
// crosses the narrow links as a broadcast among one rank per host, and each
// host's ranks take it from shared memory.
//
// Terms: the root is local rank lr of its host. Each host's "leader" is its
// rank with local rank lr (modulo its rank count: HostLayout::ownersOf), so
// the root leads its own host. The buffer is cut into PipelineBlocks; for each
// block b:
//   1. inter-host broadcast of block b from the root's host among the
//      leaders, by the cheapest flat broadcast for that many hosts (each
//      block's phase under its own tags, starting once the phase of block
//      b - kBlocksInFlight has ended);
//   2. intra-host shared-memory broadcast of block b from the leader
//      (broadcast_shm.cc), which the leader starts once its phase 1 of the
//      block is done.
// A host's shared-memory broadcast of block b runs while block b + 1 is on the
// wire, so only the last block's is not hidden behind the link.
//
// Bytes across a host's link: the binomial tree among H leaders sends N over
// the root host's link ceil(log2 H) times and into every other host once,
// where the flat tree over all n ranks may cross one link several times
// (hierarchy::busiestLinkEdges); the cost model takes this one only then.
Schedule buildBroadcastHier(const CollArgs& a) {
  const HostLayout& h = *a.hosts;
  Schedule s(a.dtype, a.op, a.device);
  if (a.count == 0) {
    s.setAlgorithm("hier");
    return s;
  }
  int rootHost = 0, rootLocal = 0;
  for (int hh = 0; hh < h.hosts; ++hh) {
    const auto& on = h.hostRanks[size_t(hh)];
    const auto at = std::find(on.begin(), on.end(), a.root);
    if (at != on.end()) rootHost = hh, rootLocal = int(at - on.begin());
  }
  const std::vector<int> leaders = h.ownersOf(rootLocal);
  const int leader = leaders[size_t(h.host)];
  const int leaderLocal = int(std::find(h.local.begin(), h.local.end(), leader) - h.local.begin());

  const size_t es = dtypeSize(a.dtype);
  auto* buf = static_cast<std::byte*>(a.buf);
  const PipelineBlocks blocks(a.count, h.chunkBytes / es);

  std::string inter = "none";
  StepId prev = kNoStep;
  std::vector<StepId> acrossDone(blocks.size(), kNoStep);
  for (size_t b = 0; b < blocks.size(); ++b) {
    std::byte* block = buf + blocks.start(b) * es;
    const size_t count = blocks.len(b);
    std::vector<StepId> ready{prev};
    if (leader == a.rank) {
      CollArgs across = acrossHostsArgs(a, a.op);
      across.root = rootHost;
      across.buf = block;
      across.count = count;
      const StepId after = b >= kBlocksInFlight ? acrossDone[b - kBlocksInFlight] : kNoStep;
      auto [ends, name] = appendAcrossHosts(s, a, across, after, leaders, b, blocks.size());
      acrossDone[b] = s.join(ends);
      ready.push_back(acrossDone[b]);
      inter = name;
    }
    if (!h.shm) continue;
    CollArgs local(Collective::Broadcast, h.localRank, h.localSize(), a.seq);
    local.dtype = a.dtype;
    local.buf = block;
    local.count = count;
    local.root = leaderLocal;
    local.shm = h.shm;
    prev = s.join(s.appendAfter(buildBroadcastShm(local), s.join(ready)));
  }
  s.setAlgorithm("hier(" + inter + ")");
  return s;
}

}  // namespace ringx
