// A communicator owns one transport and the one progress thread that drives
// it. Callers submit ops and return at once; the progress thread posts each
// op's ready steps, runs reductions inline, watches deadlines and publishes
// completions. A second thread runs completion callbacks so user code never
// runs on (or blocks) the progress thread.
//
// Idle policy: after RINGX_SPIN_US of finding nothing to do the progress
// thread arms the transport and sleeps on its event fd (plus an eventfd that
// submit() writes), so many ranks on few cores do not starve each other.
//
// Failure policy: the first failed op (timeout, closed peer, size mismatch)
// poisons the communicator, as in NCCL: ranks may no longer agree on what is
// in flight, so every pending and later op fails with that cause.
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
  void fail(Active& a, ErrorKind kind, const std::string& what, std::vector<int> awaited = {});
  void finish(Active& a);
  bool reapFinished();
  void checkDeadlines();
  void sleepUntilWork();
  void completionLoop();
  void pinThisThread() const;
  void schedule(std::function<void()> job);
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

  std::list<std::unique_ptr<Active>> active_;  // progress thread only

  std::mutex cbMu_;
  std::condition_variable cbCv_;
  std::deque<std::function<void()>> callbacks_;
  bool cbStop_ = false;
  bool cbBusy_ = false;

  std::thread progressThread_;
  std::thread completionThread_;
};

}  // namespace ringx
