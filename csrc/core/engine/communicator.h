// A communicator owns one transport and is progressed by one thread at a
// time: whoever holds progressMu_. Progressing means posting each op's ready
// steps, running reductions inline, watching deadlines and publishing
// completions. A small pool (callback_pool.h) runs completion callbacks so
// user code never runs on (or blocks) a progressing thread.
//
// Who progresses: the caller first. submit() runs the new op inline as far
// as it goes without waiting (a small collective whose peers are already
// there completes before submit returns), and a thread that waits for an op
// drives the communicator itself until its op is done (drive(), as MPI_Wait
// does) instead of sleeping until another thread wakes it. The progress
// thread covers ops nobody waits on (asynchronous ones, DDP's buckets) and
// deadlines; it stands aside while any caller drives, and a driver that
// leaves unfinished ops behind wakes it.
//
// Idle policy, for whichever thread progresses: after options.spin of
// finding nothing to do (RINGX_SPIN_US; `auto` spins only where the host's
// ranks have a CPU each, spin_policy.h) it sleeps: on this rank's shared-memory doorbell when all
// it waits for is peers' counters, having said for which peer (one that
// each poll's waitingOn names), so that only its counter moves wake it; otherwise on the
// transport's event fd (plus an eventfd that submit() writes), and with no op
// pending on that eventfd and the hand-off timer alone. Many ranks on
// few cores then neither starve each other nor wake each other for nothing.
// The exit of a peer process on this host ends either sleep at once where
// Linux gives a pidfd (exit_watch.h), and brings the next peer check forward;
// otherwise the check runs every 100 ms.
//
// Failure policy: the first failed op (timeout, closed peer, size mismatch, a
// step that threw) poisons the communicator, as in NCCL: ranks may no longer
// agree on what is in flight, so every pending and later op fails with that
// cause.
//
// Failure handling cannot re-enter itself: a transfer callback, a deadline or
// a peer check only marks an op failed (fail() records the error and sets a
// flag, nothing more); settle(), called from the top of the progress loop and
// never from inside a transport call, then cancels the marked ops' transfers
// by id and fails the rest of the poisoned communicator. The caller hears of
// the failure once nothing of the op can still write into its buffers: its
// receives' cancellations have completed and its device work has finished;
// at the latest at the op's deadline (100 ms after it, for a timeout), since
// a cancelled receive from a live peer may run on once matched. The
// transport in turn runs callbacks only from progress(), never from cancel(),
// so no list is walked while a callback can change it.
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
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/common/futex_bell.h"
#include "core/engine/callback_pool.h"
#include "core/engine/op.h"
#include "core/engine/spin_gauge.h"
#include "core/transport/transport.h"

namespace ringx {

struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::chrono::microseconds spin{50};
  // RINGX_SPIN_US=auto: a wait for the network alone spins only while such
  // waits mostly end within the spin (spin_gauge.h).
  bool gaugeNetworkSpin = false;
  // The CPU the progress and completion threads run on; -1 leaves them to
  // the scheduler.
  int cpu = -1;
  // This rank's doorbell in the shared-memory area, whose algorithms ring
  // the peers waiting for them when they move a counter; null without shared
  // memory (waits on peers' counters then spin).
  FutexBell* bell = nullptr;
};

// A rank waiting on shared-memory peers and the network at once (the
// hierarchical algorithms' pipelines) sleeps on its doorbell for at most this
// long, then looks at the network: no one sleep ends for both. It used to
// yield in a loop, which on the 4 x 2 test bed (8 ranks on 2 cores) took the
// cores from the ranks with work: a 64 MiB all_reduce took 1.36x the time.
inline constexpr std::chrono::microseconds kMixedNapSlice{200};

class Communicator {
 public:
  Communicator(std::unique_ptr<Transport> transport, CommOptions options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }

  // Never blocks on the network: runs the op inline only as far as it goes
  // without waiting. If the communicator already failed, the op fails at
  // once. Throws in a forked child: the engine's threads live in the parent.
  void submit(std::unique_ptr<Op> op);

  enum class Drive { Done, Busy, Stopped, TimedOut };
  // Progresses the communicator on the calling thread until done() holds
  // (Done). Returns Busy at once when another caller is driving (wait for
  // the op's own notification, then call again), Stopped once the
  // communicator is shutting down (the progress thread ends every op), and
  // TimedOut at `until`. done() is called with progressMu_ held and must
  // not call into the communicator.
  Drive drive(const std::function<bool()>& done,
              std::optional<std::chrono::steady_clock::time_point> until = std::nullopt);

  // Fails pending ops with ErrorKind::Aborted and stops the threads.
  void abort(const std::string& why);
  // Lets pending ops finish (each bounded by its own deadline), then stops.
  void shutdown();

  // The error that poisoned the communicator, if any.
  std::optional<Error> error() const;

  // Ops submitted and not yet ended (completed or failed).
  int opsInFlight() const { return inFlight_.load(); }

  // Whether a thread that waits for the network alone spins now, or sleeps
  // at once (CommOptions::gaugeNetworkSpin).
  bool spinsOnNetwork() {
    std::lock_guard<std::mutex> pl(progressMu_);
    return options_.spin.count() > 0 && (!options_.gaugeNetworkSpin || netSpin_.worthSpinning());
  }

  // Stops like abort(why), but hands the transport over instead of closing
  // it, with nothing of this communicator's ops left in it: the connections
  // then serve a group shrunk from this one. Null when the communicator was
  // already stopped (the transport is gone).
  std::unique_ptr<Transport> release(const std::string& why);

 private:
  struct Active;

  using Clock = std::chrono::steady_clock;

  void progressLoop();
  void park();
  void wakeProgressThread();
  bool pass();
  bool hasPending() const;
  bool noDeviceWork() const;
  bool transfersInFlight() const;
  struct Nap {
    // Idle: no op of this communicator is pending. It sleeps on its own
    // wake-ups alone, not on the network's events: peers' data for ops not
    // yet posted (a root that sends before this rank calls scatter) woke it
    // for each message, and each wake cost a spin. The nap's limit (100 ms,
    // untilNextDeadline) still has it look at the network now and then, as
    // a peer needs of a rank busy elsewhere (UCX making a connection).
    enum class Kind { None, Yield, Bell, Events, Idle } kind = Kind::None;
    std::chrono::microseconds max{0};
    bool slice = false;  // Bell for at most kMixedNapSlice: transfers in flight too
    uint64_t waitsFor = 0;  // Bell: FutexBell's bits of the ranks awaited
    uint32_t bellSeen = 0;
    uint64_t workGen = 0;
    uint64_t exits = 0;  // exitsSeen() at the last peer check
    // Woken from a sleep, the thread spins again; a slice that ran out
    // proves nothing moved, so it sleeps again at once, and so does an idle
    // thread after its look at the network (work handed to it moves, which
    // restarts the spin).
    bool restartsSpin() const { return (kind == Kind::Bell && !slice) || kind == Kind::Events; }
    // Gauged (CommOptions::gaugeNetworkSpin): ops are pending and wait for
    // the network alone.
    bool networkOnly = false;
  };
  // One idle spell of a progressing thread, from the last pass that moved
  // something: scored by netSpin_ when every nap of it waited for the network alone.
  struct Wait {
    Clock::time_point since = Clock::now();
    bool napped = false;
    bool networkOnly = true;
  };
  Nap planNap(Clock::time_point idleSince, std::optional<Clock::time_point> until);
  void noteNap(Wait& wait, const Nap& nap) const;
  void endWait(Wait& wait, Clock::time_point now);
  uint64_t awaitedBells() const;
  bool bellsCover(uint64_t waitsFor) const;
  bool armBell(Nap& nap, bool& moved);
  void takeNap(const Nap& nap);
  void handOffSoon();
  bool startSubmitted();
  bool runReady(Active& a);
  bool runPolls(Active& a);
  void enqueueOnDevice(Active& a, StepId id);
  bool poll(Active& a, StepId id);
  bool advance();
  bool aPeerDiedUnseen() const;
  void failOnDeadPeer();
  bool stillNeeds(const Active& a, int peer) const;
  void post(Active& a, StepId id);
  void stepDone(Active& a, StepId id);
  void onTransfer(Active& a, StepId id, const TransferResult& r);
  void runStep(Active& a, StepId id);
  void fail(Active& a, ErrorKind kind, const std::string& what, std::vector<int> awaited = {});
  void failCommunicator(const std::string& what);
  void settle();
  void publish(Active& a, const Error* err);
  void tellFailure(Active& a, bool evenIfWriting);
  static bool receiving(const Active& a);
  static bool stillWriting(const Active& a);
  static void waitForDeviceWork(Active& a);
  void finish(Active& a);
  bool wantsCallbacks(Active& a);
  bool reapFinished();
  void checkDeadlines();
  std::chrono::microseconds untilNextDeadline(std::optional<Clock::time_point> until) const;
  void pinThisThread() const;
  bool forkedChild() const;
  std::string describeAwaited(const Active& a) const;
  std::vector<int> awaitedPeers(const Active& a) const;
  static std::vector<int> withClosedPeers(const Active& a, std::vector<int> awaited);
  std::string prefix(const Op& op) const;

  std::unique_ptr<Transport> transport_;
  const CommOptions options_;
  const int rank_;
  const int size_;
  int wakeFd_ = -1;
  int timerFd_ = -1;  // hands an op nobody drives to the progress thread
  int epollFd_ = -1;
  int idleEpollFd_ = -1;  // wakeFd_ and timerFd_ only: an idle nap
  std::atomic<bool> timerArmed_{false};

  mutable std::mutex mu_;  // guards submitted_, the sleep state below, error_, stopping_
  std::deque<std::unique_ptr<Op>> submitted_;
  int eventSleepers_ = 0;  // threads asleep on the event fds
  int bellSleepers_ = 0;   // threads asleep on the doorbell
  bool parked_ = false;    // the progress thread stands aside for a driver
  // Bumped whenever work is handed to the progress thread; a nap planned
  // before the bump is not taken.
  uint64_t workGen_ = 0;
  std::condition_variable parkCv_;
  std::atomic<int> drivers_{0};
  std::optional<Error> error_;
  std::atomic<bool> stopping_{false};
  bool drain_ = false;
  bool keepTransport_ = false;  // release(): the progress thread leaves the transport open
  std::string abortReason_;
  std::atomic<int> inFlight_{0};

  // Whoever holds progressMu_ progresses; everything below up to the
  // creator pid is touched only by that thread.
  std::mutex progressMu_;
  // Ops are added by startSubmitted() and removed by reapFinished(), both at
  // the top level of a pass, never in a callback.
  std::list<std::unique_ptr<Active>> active_;
  // startSubmitted()'s batch, kept between passes so that a pass with
  // nothing submitted (every pass of a waiting driver) allocates nothing.
  std::vector<std::unique_ptr<Op>> starting_;
  // The error that poisoned the communicator, once settle() has still to
  // fail the other pending ops with it.
  std::optional<Error> poisonPending_;
  bool cancelPending_ = false;
  Clock::time_point nextPeerCheck_;
  // exitsSeen() when the peer check was last brought forward for an exit.
  uint64_t peerExitsChecked_ = 0;
  // When each closed peer was first seen closed (progress thread only).
  std::map<int, Clock::time_point> deadSince_;
  bool closed_ = false;  // the progress thread has ended every op and dropped the transport
  SpinGauge netSpin_;  // whether the spin pays on network-only waits

  const int creatorPid_;
  const int creatorFork_;  // forkGeneration() at creation
  CallbackPool callbacks_;
  std::thread progressThread_;
  // Wakes this communicator's sleepers when a watched peer process exits.
  std::shared_ptr<void> exitListener_;
};

}  // namespace ringx
