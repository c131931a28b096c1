// What the hierarchical algorithms share: their inter-host phase, a flat
// algorithm among the ranks with this rank's local rank on every host.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/algorithms/coll_args.h"
#include "core/algorithms/host_layout.h"
#include "core/algorithms/registry.h"
#include "core/engine/schedule.h"
#include "core/select/select.h"

namespace ringx {

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
