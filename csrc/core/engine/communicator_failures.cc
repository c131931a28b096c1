// How a Communicator's ops fail: recording and telling a failure, settling
// what it leaves in flight, a dead peer, a passed deadline.
#include <algorithm>
#include <set>

#include "core/common/log.h"
#include "core/engine/communicator_active.h"

namespace ringx {

namespace {

// How long a failed op's cancelled receives may take to complete before the
// caller hears of the failure anyway, when its deadline has passed.
constexpr auto kTellFailureGrace = std::chrono::milliseconds(100);

}  // namespace

// Records the failure and publishes it; what must be undone (transfers in
// flight, the other pending ops) is left to settle().
void Communicator::fail(Active& a, ErrorKind kind, const std::string& what, std::vector<int> awaited) {
  if (a.ended) return;
  a.ended = true;
  inFlight_.fetch_sub(1);
  a.cancelTransfers = !a.inflight.empty();
  cancelPending_ |= a.cancelTransfers;
  Error err(kind, prefix(*a.op) + what, std::move(awaited));
  RINGX_LOG(Warn, err.what());
  a.op->schedule.abandon(err.what());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) {
      error_ = err;
      poisonPending_ = err;
    }
  }
  a.untold = std::move(err);
  a.tellBy = std::max(a.deadline, Clock::now() + kTellFailureGrace);
  tellFailure(a, false);
}

bool Communicator::receiving(const Active& a) {
  return std::any_of(a.inflight.begin(), a.inflight.end(), [&](const auto& entry) {
    return a.op->schedule.steps()[entry.first].kind == StepKind::Recv;
  });
}

bool Communicator::stillWriting(const Active& a) { return receiving(a) || !a.onDevice.empty(); }

// Device work needs no peer to finish, so waiting for it cannot hang.
void Communicator::waitForDeviceWork(Active& a) {
  if (a.onDevice.empty()) return;
  OnDevice on(a.op->schedule.device().device);
  for (StepId step : a.onDevice) a.op->schedule.stepEvent(step).synchronize();
  a.onDevice.clear();
}

// Forced (evenIfWriting), it still waits for the op's device work, which
// ends by itself; only a receive may be left running.
void Communicator::tellFailure(Active& a, bool evenIfWriting) {
  if (!a.untold) return;
  if (evenIfWriting) {
    waitForDeviceWork(a);
  } else if (stillWriting(a)) {
    return;
  }
  const Error err = *std::exchange(a.untold, std::nullopt);
  publish(a, &err);
  if (wantsCallbacks(a)) {
    auto cb = std::move(a.op->onCallbacks);
    callbacks_.post([cb = std::move(cb), err] { cb(&err); });
  }
}

// A failure outside any op (the transport's progress threw): poisons the
// communicator so that every pending and later op fails with it.
void Communicator::failCommunicator(const std::string& what) {
  Error err(ErrorKind::Internal, "ringx: progress (rank " + std::to_string(rank_) + "): " + what);
  RINGX_LOG(Warn, err.what());
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_) {
    error_ = err;
    poisonPending_ = err;
  }
}

// Runs at the top level of the progress loop only. cancel() runs no
// callback, so neither the ops' transfer maps nor active_ change under it.
void Communicator::settle() {
  while (cancelPending_ || poisonPending_) {
    if (poisonPending_) {
      Error cause = *std::exchange(poisonPending_, std::nullopt);
      for (auto& other : active_) {
        if (!other->ended) fail(*other, cause.kind(), std::string("the communicator failed: ") + cause.what());
      }
    }
    if (cancelPending_) {
      cancelPending_ = false;
      for (auto& a : active_) {
        if (!a->cancelTransfers) continue;
        a->cancelTransfers = false;
        std::vector<TransferId> ids;
        for (auto& [step, tid] : a->inflight) ids.push_back(tid);
        for (TransferId tid : ids) {
          try {
            transport_->cancel(tid);
          } catch (const std::exception& e) {
            RINGX_LOG(Warn, "ringx: cancelling a transfer failed: " << e.what());
          }
        }
      }
    }
  }
}

bool Communicator::reapFinished() {
  bool did = false;
  for (auto it = active_.begin(); it != active_.end();) {
    Active& a = **it;
    if (!a.ended || !a.inflight.empty()) {
      ++it;
      continue;
    }
    // An op that ended early may still have device work on its buffers and
    // scratch: wait for it (failures only; a finished op has none left). Its
    // failure, held back for that work, can then be told.
    waitForDeviceWork(a);
    tellFailure(a, false);
    // An op on device buffers is released off this thread: freeing its
    // events, staging buffers and tensors (its Work, and so the tensors, may
    // go with it) can wait for a GPU driver lock that a thread blocked in a
    // synchronous copy holds until a later op, which this thread must
    // progress, has ended. That deadlock was seen on an H200.
    if (Device* device = a.op->schedule.touchedDevice()) {
      callbacks_.post([device, released = std::shared_ptr<Active>(std::move(*it))]() mutable {
        OnDevice on(device);
        released.reset();
      });
    }
    it = active_.erase(it);
    did = true;
  }
  return did;
}

// The peers an op that waits out closed connections never heard from: those
// it still waits for, and those that closed.
std::vector<int> Communicator::withClosedPeers(const Active& a, std::vector<int> awaited) {
  awaited.insert(awaited.end(), a.closedPeers.begin(), a.closedPeers.end());
  std::sort(awaited.begin(), awaited.end());
  awaited.erase(std::unique(awaited.begin(), awaited.end()), awaited.end());
  return awaited;
}

std::vector<int> Communicator::awaitedPeers(const Active& a) const {
  std::set<int> recvFrom, sendTo;
  for (auto& [step, tid] : a.inflight) {
    const Step& s = a.op->schedule.steps()[step];
    (s.kind == StepKind::Recv ? recvFrom : sendTo).insert(s.peer);
  }
  std::set<int> polledFor;
  for (StepId step : a.polling) {
    for (int p : a.op->schedule.pollWaitingOn(a.op->schedule.steps()[step])) polledFor.insert(p);
  }
  const std::set<int>& peers = !recvFrom.empty() ? recvFrom : !polledFor.empty() ? polledFor : sendTo;
  return {peers.begin(), peers.end()};
}

std::string Communicator::describeAwaited(const Active& a) const {
  std::vector<int> peers = awaitedPeers(a);
  if (peers.empty() && !a.polling.empty()) return "waiting in shared memory for peers to reach the same step";
  if (peers.empty()) return "no transfer in flight";
  std::string list;
  for (int p : peers) {
    if (!list.empty()) list += ", ";
    list += p == kAnySource ? std::string("any rank") : std::to_string(p);
  }
  if (receiving(a)) return "waiting for data from rank(s) " + list;
  if (!a.polling.empty()) return "waiting for rank(s) " + list + " to reach the same step in shared memory";
  return "waiting for rank(s) " + list + " to receive";
}

// A dead peer fails not only the transfers that name it: shared-memory steps
// and sends to a same-host peer get no signal of their own, and the ranks
// that wait on a survivor would otherwise sit out the timeout for a
// collective that can no longer complete. An op that still has something to
// do with the peer fails at once; the others after a grace period, because a
// rank that finished its part and left (destroy_process_group right after its
// last call) closes its connections while slower peers complete that call
// among themselves. The failure then poisons the rest, as any other.
void Communicator::failOnDeadPeer() {
  const auto now = Clock::now();
  const auto grace = std::min<Clock::duration>(std::chrono::seconds(1), options_.timeout / 4);
  for (int dead : transport_->failedPeers()) {
    const auto since = deadSince_.try_emplace(dead, now).first->second;
    for (auto& a : active_) {
      // Its receive from the dead peer ends by itself (the transport's), and
      // it waits for the others whatever happened to this one.
      if (a->op->schedule.waitsOutClosedPeers()) continue;
      if (!a->ended && (stillNeeds(*a, dead) || now - since >= grace)) {
        fail(*a, ErrorKind::PeerClosed, closedConnection(dead),
             awaitedPeers(*a));
        return;
      }
    }
  }
}

// A peer's death that has just been recorded (by the pid watch, between two
// progress() calls) is judged only after one more advance(): what the peer
// sent before it died (a receive's data, a send's acknowledgement) is
// delivered first, so an op whose last messages from it have arrived is not
// failed for their being unread.
bool Communicator::aPeerDiedUnseen() const {
  const auto dead = transport_->failedPeers();
  return std::any_of(dead.begin(), dead.end(), [this](int p) { return deadSince_.count(p) == 0; });
}

// Receives that name the dead peer do not count: the transport ends each
// one itself, with the message the peer sent before it died if there is one,
// else with the peer's failure. A shared-memory step counts when it is under
// way and waits on the peer (the peer's counter has not reached it, or the
// peer still holds the slot it needs). What the peer wrote before it exited
// stays in the area, mapped by every rank, so a step it has already served
// completes; steps not under way yet are judged when they start, within
// the 100 ms between checks.
bool Communicator::stillNeeds(const Active& a, int peer) const {
  const auto& schedule = a.op->schedule;
  const auto& steps = schedule.steps();
  for (size_t i = 0; i < steps.size(); ++i) {
    if (a.done[i]) continue;
    const Step& st = steps[i];
    if (st.kind == StepKind::Send && st.peer == peer) return true;
    if (st.kind == StepKind::Recv && st.peer == kAnySource) return true;
  }
  return std::any_of(a.polling.begin(), a.polling.end(), [&](StepId id) {
    const std::vector<int> waited = schedule.pollWaitingOn(steps[id]);
    return std::find(waited.begin(), waited.end(), peer) != waited.end();
  });
}

void Communicator::checkDeadlines() {
  auto now = Clock::now();
  for (auto& a : active_) {
    if (a->ended) {
      // A receive that its cancellation did not stop (UCX lets a matched
      // transfer run on) holds the failure back no longer than the op's
      // limit, or a moment after a timeout.
      if (a->untold && now >= a->tellBy) tellFailure(*a, true);
      continue;
    }
    if (now < a->deadline) continue;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        (a->op->timeout.count() > 0 ? a->op->timeout : options_.timeout));
    fail(*a, ErrorKind::Timeout,
         "Timed out after " + std::to_string(ms.count()) + " ms, " + describeAwaited(*a) + " (algorithm " +
             a->op->schedule.algorithm() + ", " + std::to_string(a->stepsDone) + "/" +
             std::to_string(a->remaining.size()) +
             " steps done). Every rank must call the same collectives in the same order; a peer may "
             "have stalled or died. Raise the limit with init_process_group(timeout=...).",
         withClosedPeers(*a, awaitedPeers(*a)));
  }
}

}  // namespace ringx
