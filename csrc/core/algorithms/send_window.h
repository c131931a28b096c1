// Pacing of a pipeline's sends to one peer.
#pragma once

#include <cstddef>
#include <vector>

#include "core/engine/schedule.h"

namespace ringx {

// Sends one rank keeps posted to one peer. UCX moves the messages posted to
// one peer side by side: with every segment of a pipeline posted at once,
// all of them arrived near the end, and the next rank could forward none
// before then (the chain broadcast ran at half the link's rate on the test
// bed, 3 to 8 hosts). Four keep the link busy while each segment arrives
// whole in about its own time. The rings do without it: paced the same way
// they were no faster on the test bed (docs/many-hosts.md).
inline constexpr size_t kSendsInFlight = 4;

// The sends of one schedule to one peer, in the order they are meant to go:
// each waits for the one kSendsInFlight before it.
class SendWindow {
 public:
  StepId pace(Schedule& s, StepId send) {
    if (sent_.size() >= kSendsInFlight) s.addDependency(sent_[sent_.size() - kSendsInFlight], send);
    sent_.push_back(send);
    return send;
  }

 private:
  std::vector<StepId> sent_;
};

}  // namespace ringx
