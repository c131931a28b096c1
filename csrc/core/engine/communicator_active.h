// The engine's record of an op in progress, shared by the files that
// implement Communicator: submitting and running steps (communicator.cc),
// failing ops (communicator_failures.cc) and the progress loop
// (communicator_progress.cc).
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/engine/communicator.h"

namespace ringx {

struct Communicator::Active {
  std::unique_ptr<Op> op;
  std::vector<uint32_t> remaining;
  std::vector<bool> done;
  // Steps whose dependencies are done, in the order they became ready;
  // those from readyNext on are still to run. (A vector: a deque allocates
  // even empty, and every step enters once.)
  std::vector<StepId> ready;
  size_t readyNext = 0;
  std::unordered_map<StepId, TransferId> inflight;
  std::vector<StepId> polling;
  // Steps enqueued on the device, done when their event fires.
  std::vector<StepId> onDevice;
  size_t stepsDone = 0;
  // Receives ended by their peer's closed connection, in an op that waits
  // them out (Schedule::setWaitOutClosedPeers), and the first one's error.
  std::vector<int> closedPeers;
  std::string closedError;
  Clock::time_point deadline;
  ReduceFn reduce = nullptr;
  bool ended = false;
  bool cancelTransfers = false;  // failed with transfers in flight; settle() cancels them
  // The failure, until it is told: a caller that hears of it may free the
  // buffers, which a receive still in flight would then write into.
  std::optional<Error> untold;
  Clock::time_point tellBy;  // told then even with a receive still in flight
};

}  // namespace ringx
