// What the hierarchical algorithms share: their inter-host phase, a flat
// algorithm among the ranks with this rank's local rank on every host.
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/algorithms/coll_args.h"
#include "core/algorithms/host_layout.h"
#include "core/algorithms/registry.h"
#include "core/engine/schedule.h"
#include "core/patterns/ring.h"
#include "core/select/select.h"

namespace ringx {

// A pipelined hierarchy's blocks: `count` elements cut into runs of whole
// chunks (HostLayout::chunkBytes, which every host agreed on, so the blocks
// match across hosts). While one block crosses the hosts' links, another's
// shared-memory phase runs; what cannot overlap (the first or the last
// block's shared-memory phase) is at most 1/kMaxBlocks of it. Blocks of fewer
// than kMinChunks chunks would add inter-host phases (each a latency) for
// little overlap.
class PipelineBlocks {
 public:
  static constexpr size_t kMaxBlocks = 16;
  static constexpr size_t kMinChunks = 2;

  PipelineBlocks(size_t count, size_t chunkElems)
      : count_(count),
        chunkElems_(std::max<size_t>(1, chunkElems)),
        chunks_(ring::numSegments(count, chunkElems_)),
        blocks_(std::max<size_t>(1, std::min(kMaxBlocks, chunks_ / kMinChunks))) {}

  size_t size() const { return blocks_; }
  // Block b: elements [start(b), start(b + 1)).
  size_t start(size_t b) const {
    return std::min(count_, ring::chunkStart(chunks_, int(blocks_), int(b)) * chunkElems_);
  }
  size_t len(size_t b) const { return start(b + 1) - start(b); }
  size_t chunkElems() const { return chunkElems_; }

 private:
  size_t count_, chunkElems_, chunks_, blocks_;
};

// Inter-host phases of a pipeline on the wire at once. UCX moves the messages
// posted to one peer side by side: with every block's phase posted at once,
// all blocks arrived together near the end and no shared-memory phase
// overlapped the link (the hierarchical broadcast, 2026-11-30). Two keep the
// link busy while one block's arrives.
constexpr size_t kBlocksInFlight = 2;

// `a`'s collective among one rank per host: this rank is its host's index,
// the op sums (AVG and PREMUL_SUM apply their factor outside), buffers and
// count are the caller's to set.
inline CollArgs acrossHostsArgs(const CollArgs& a, ReduceOp op) {
  CollArgs across(a.coll, a.hosts->host, a.hosts->hosts, a.seq);
  across.dtype = a.dtype;
  across.op = op;
  across.segmentBytes = a.segmentBytes;
  across.crossHost = true;
  return across;
}

// Appends `across`'s schedule by the cheapest flat algorithm, talking to the
// group ranks it stands for (`ranks`, one per host in host order) and
// starting after `after`. Returns its last steps and the algorithm's name. No
// identity exchange of its own: buildChecked adds the whole call's with every
// peer the schedule talks to, which are these. An op that runs `parts` such
// phases at once (a pipeline, several sub-groups) numbers them
// 0..parts-1 in `part`: phase p's message i travels as index i * parts + p,
// so no two phases' messages match each other's receives.
inline std::pair<std::vector<StepId>, std::string_view> appendAcrossHosts(
    Schedule& s, const CollArgs& a, const CollArgs& across, StepId after, const std::vector<int>& ranks,
    uint64_t part, uint64_t parts) {
  const Algorithm& alg = cheapestAlgorithm(across);
  Schedule phase = alg.build(across);
  phase.mapPeers(ranks);
  if (parts > 1) {
    phase.mapTags([&](uint64_t tag) {
      const uint64_t index = (tag & kMaxTagIndex) * parts + part;
      if (index >= kIdentityTagIndex) {
        throw std::logic_error("ringx: " + std::string(collectiveName(a.coll)) + " (rank " + std::to_string(a.rank) +
                               ", seq " + std::to_string(a.seq) + "): inter-host phase " + std::to_string(part) +
                               " of " + std::to_string(parts) + " needs more message indices than a tag holds");
      }
      return (tag & ~kMaxTagIndex) | index;
    });
  }
  return {s.appendAfter(std::move(phase), after), alg.name};
}

// The one inter-host phase of an even layout: among the ranks with this
// rank's local rank.
inline std::pair<std::vector<StepId>, std::string_view> appendAcrossHosts(Schedule& s, const CollArgs& a,
                                                                          const CollArgs& across, StepId after) {
  return appendAcrossHosts(s, a, across, after, a.hosts->across, 0, 1);
}

}  // namespace ringx
