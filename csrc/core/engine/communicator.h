// A communicator owns one transport and the one progress thread that drives
// it. Callers submit ops and return at once; the progress thread posts each
// op's ready steps, runs reductions inline, watches deadlines and publishes
// completions. A small pool (callback_pool.h) runs completion callbacks so
// user code never runs on (or blocks) the progress thread.
//
// Idle policy: after RINGX_SPIN_US of finding nothing to do the progress
// thread arms the transport and sleeps on its event fd (plus an eventfd that
// submit() writes), so many ranks on few cores do not starve each other.
//
// Failure policy: the first failed op (timeout, closed peer, size mismatch, a
// step that threw) poisons the communicator, as in NCCL: ranks may no longer
// agree on what is in flight, so every pending and later op fails with that
// cause.
//
// Failure handling cannot re-enter itself: a transfer callback, a deadline or
// a peer check only marks an op failed (fail() publishes the error and sets a
// flag, nothing more); settle(), called from the top of the progress loop and
// never from inside a transport call, then cancels the marked ops' transfers
// by id and fails the rest of the poisoned communicator. The transport in turn
// runs callbacks only from progress(), never from cancel(), so no list is
// walked while a callback can change it.
//
// No exception leaves the progress thread: a step, a poll predicate or a
// transport call that throws fails its op (or, outside any op, the whole
// communicator) with the exception's message.
//
// Fork: a communicator belongs to the process that created it; a forked child
// that submits gets an error at once, and its copy is abandoned, not joined.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/callback_pool.h"
#include "core/engine/op.h"
#include "core/transport/transport.h"

namespace ringx {

struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::chrono::microseconds spin{50};
  // The CPU the progress and completion threads run on; -1 leaves them to
  // the scheduler.
  int cpu = -1;
};

class Communicator {
 public:
  Communicator(std::unique_ptr<Transport> transport, CommOptions options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }

  // Never blocks on the network. If the communicator already failed, the op
  // fails at once (its callbacks still run, from the engine's threads).
  // Throws in a forked child: the engine's threads live in the parent.
  void submit(std::unique_ptr<Op> op);

  // Fails pending ops with ErrorKind::Aborted and stops the threads.
  void abort(const std::string& why);
  // Lets pending ops finish (each bounded by its own deadline), then stops.
  void shutdown();

  // The error that poisoned the communicator, if any.
  std::optional<Error> error() const;

 private:
  struct Active;

  void progressLoop();
  bool startSubmitted();
  bool runReady(Active& a);
  bool runPolls(Active& a);
  bool poll(Active& a, StepId id);
  void failOnDeadPeer();
  void post(Active& a, StepId id);
  void stepDone(Active& a, StepId id);
  void onTransfer(Active& a, StepId id, const TransferResult& r);
  void runStep(Active& a, StepId id);
  void fail(Active& a, ErrorKind kind, const std::string& what, std::vector<int> awaited = {});
  void failCommunicator(const std::string& what);
  void settle();
  void publish(Active& a, const Error* err);
  void finish(Active& a);
  bool reapFinished();
  void checkDeadlines();
  void sleepUntilWork();
  void pinThisThread() const;
  void iterate(std::chrono::steady_clock::time_point& idleSince,
               std::chrono::steady_clock::time_point& nextPeerCheck);
  bool forkedChild() const;
  std::string describeAwaited(const Active& a) const;
  std::vector<int> awaitedPeers(const Active& a) const;
  std::string prefix(const Op& op) const;

  std::unique_ptr<Transport> transport_;
  const CommOptions options_;
  const int rank_;
  const int size_;
  int wakeFd_ = -1;
  int epollFd_ = -1;

  mutable std::mutex mu_;  // guards submitted_, sleeping_, error_, stopping_
  std::deque<std::unique_ptr<Op>> submitted_;
  bool sleeping_ = false;
  std::optional<Error> error_;
  std::atomic<bool> stopping_{false};
  bool drain_ = false;
  std::string abortReason_;

  // Progress thread only. Ops are added by startSubmitted() and removed by
  // reapFinished(), both at the top level of the loop, never in a callback.
  std::list<std::unique_ptr<Active>> active_;
  // Progress thread only: the error that poisoned the communicator, once
  // settle() has still to fail the other pending ops with it.
  std::optional<Error> poisonPending_;
  bool cancelPending_ = false;

  const int creatorPid_;
  CallbackPool callbacks_;
  std::thread progressThread_;
};

}  // namespace ringx
