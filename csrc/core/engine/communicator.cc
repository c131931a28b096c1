#include "core/engine/communicator.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/common/fork_generation.h"
#include "core/common/log.h"

namespace ringx {

using Clock = std::chrono::steady_clock;

namespace {

// Enough for callbacks that block on a few later futures each (PowerSGD's
// hooks wait on one); beyond it callbacks queue instead of taking threads.
constexpr int kMaxCallbackThreads = 4;

// What a caller's submit() may run inline: a latency-bound op.
constexpr size_t kInlineBytes = 64 * 1024;
// How long a failed op's cancelled receives may take to complete before the
// caller hears of the failure anyway, when its deadline has passed.
constexpr auto kTellFailureGrace = std::chrono::milliseconds(100);

const char* stepKindName(StepKind k) {
  switch (k) {
    case StepKind::Send: return "send";
    case StepKind::Recv: return "recv";
    case StepKind::Reduce: return "reduce";
    case StepKind::Copy: return "copy";
    case StepKind::Scale: return "scale";
    case StepKind::Poll: return "poll";
  }
  return "step";
}

}  // namespace

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

Communicator::Communicator(std::unique_ptr<Transport> transport, CommOptions options)
    : transport_(std::move(transport)),
      options_(options),
      rank_(transport_->rank()),
      size_(transport_->size()),
      creatorPid_(processId()),
      creatorFork_(forkGeneration()),
      callbacks_(kMaxCallbackThreads, options.cpu) {
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timerFd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (wakeFd_ < 0 || timerFd_ < 0 || epollFd_ < 0) {
    throw Error(ErrorKind::Internal, "ringx: eventfd/timerfd/epoll creation failed");
  }
  nextPeerCheck_ = Clock::now();
  for (int fd : {wakeFd_, timerFd_, transport_->eventFd()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw Error(ErrorKind::Internal, std::string("ringx: epoll_ctl failed: ") + std::strerror(errno));
    }
  }
  progressThread_ = std::thread([this] { progressLoop(); });
}

Communicator::~Communicator() {
  if (forkedChild()) {
    // The parent's threads are not in this process and its locks may be held
    // forever; UCX state is not usable after fork. Leak all of it.
    progressThread_.detach();
    callbacks_.abandonAfterFork();
    (void)transport_.release();
    return;
  }
  shutdown();
  ::close(epollFd_);
  ::close(timerFd_);
  ::close(wakeFd_);
}

bool Communicator::forkedChild() const { return forkGeneration() != creatorFork_; }

void Communicator::submit(std::unique_ptr<Op> op) {
  if (forkedChild()) {
    throw Error(ErrorKind::InvalidArgument,
                prefix(*op) + "this process group was created by process " + std::to_string(creatorPid_) +
                    " and cannot be used in a forked child (pid " + std::to_string(processId()) +
                    "); create a new process group in the child");
  }
  op->schedule.makeStepEvents();
  const bool small = op->bytes <= kInlineBytes;
  const bool callerWaits = op->callerWaits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      throw Error(ErrorKind::Aborted, prefix(*op) + "the process group was shut down or aborted" +
                                          (abortReason_.empty() ? "" : " (" + abortReason_ + ")") +
                                          "; create a new group to communicate again");
    }
    submitted_.push_back(std::move(op));
    inFlight_.fetch_add(1);
  }
  // A small op on an idle communicator runs inline, as far as it goes
  // without waiting and for at most one spin budget: an asynchronous call
  // never blocks its caller for long, and a large one (a DDP bucket) leaves
  // the caller free to compute while other threads move it.
  bool pending = true;
  std::unique_lock<std::mutex> pl(progressMu_, std::defer_lock);
  if (small && pl.try_lock() && active_.empty()) {
    const auto stop = Clock::now() + options_.spin;
    while (pass() && Clock::now() < stop) {
    }
    pending = hasPending();
  }
  if (pl.owns_lock()) pl.unlock();
  if (pending && !callerWaits && drivers_.load() == 0) handOffSoon();
}

// An op left unfinished goes to the progress thread one spin budget later
// unless a caller starts driving first, which is what a synchronous call
// does at once: the progress thread is not woken for it. Asleep on the
// doorbell it cannot see the timer, so it is rung at once; parked after a
// driver left, it is woken at once too, or the op would wait for the park's
// timeout.
void Communicator::handOffSoon() {
  std::lock_guard<std::mutex> lock(mu_);
  ++workGen_;
  if (parked_) parkCv_.notify_all();
  if (bellSleepers_ > 0 && options_.bell) options_.bell->ring();
  if (eventSleepers_ == 0) return;
  itimerspec t{};
  t.it_value.tv_nsec = long(std::max<int64_t>(1, options_.spin.count())) * 1000;
  ::timerfd_settime(timerFd_, 0, &t, nullptr);
  timerArmed_ = true;
}

void Communicator::wakeProgressThread() {
  std::lock_guard<std::mutex> lock(mu_);
  ++workGen_;
  if (parked_) parkCv_.notify_all();
  if (eventSleepers_ > 0) {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wakeFd_, &one, sizeof(one));
  }
  if (bellSleepers_ > 0 && options_.bell) options_.bell->ring();
}

Communicator::Drive Communicator::drive(const std::function<bool()>& done, std::optional<Clock::time_point> until) {
  if (stopping_ || forkedChild()) return Drive::Stopped;
  drivers_.fetch_add(1);
  if (timerArmed_.exchange(false)) {
    itimerspec off{};
    ::timerfd_settime(timerFd_, 0, &off, nullptr);
  }
  // The lock is held for one pass at a time by the progress thread, which
  // then stands aside; for long only by another driver. (Not a timed mutex:
  // ThreadSanitizer does not see pthread_mutex_clocklock take it.)
  std::unique_lock<std::mutex> pl(progressMu_, std::try_to_lock);
  for (auto giveUp = Clock::now() + std::chrono::microseconds(200); !pl.owns_lock(); pl.try_lock()) {
    if (Clock::now() >= giveUp) {
      if (drivers_.fetch_sub(1) == 1) wakeProgressThread();
      return Drive::Busy;
    }
    std::this_thread::yield();
  }
  Drive result = Drive::Done;
  auto idleSince = Clock::now();
  for (;;) {
    if (done()) break;
    if (stopping_ || closed_) {
      result = Drive::Stopped;
      break;
    }
    if (until && Clock::now() >= *until) {
      result = Drive::TimedOut;
      break;
    }
    const uint32_t seen = options_.bell ? options_.bell->seen() : 0;
    if (pass()) {
      idleSince = Clock::now();
      continue;
    }
    if (done()) break;
    Nap nap = planNap(idleSince, seen, until);
    takeNap(nap);
    if (nap.kind == Nap::Kind::Bell || nap.kind == Nap::Kind::Events) idleSince = Clock::now();
  }
  const bool pending = !closed_ && hasPending();
  pl.unlock();
  if (drivers_.fetch_sub(1) == 1 && pending) wakeProgressThread();
  return result;
}

void Communicator::abort(const std::string& why) {
  if (forkedChild()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      abortReason_ = why;
      uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(wakeFd_, &one, sizeof(one));
      parkCv_.notify_all();
      if (options_.bell && bellSleepers_ > 0) options_.bell->ring();
    }
  }
  if (progressThread_.joinable()) progressThread_.join();
  // The progress thread posted its last callbacks before it ended: these run
  // now, and none after this returns.
  callbacks_.stop();
}

std::unique_ptr<Transport> Communicator::release(const std::string& why) {
  if (forkedChild()) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keepTransport_ = true;
  }
  abort(why);
  std::lock_guard<std::mutex> pl(progressMu_);
  return std::move(transport_);
}

void Communicator::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    drain_ = true;
  }
  abort("shut down");
}

std::optional<Error> Communicator::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::string Communicator::prefix(const Op& op) const {
  return "ringx: " + op.name + " (rank " + std::to_string(rank_) + ", seq " + std::to_string(op.seq) + "): ";
}

bool Communicator::startSubmitted() {
  std::optional<Error> poisoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (submitted_.empty()) return false;
    for (auto& op : submitted_) starting_.push_back(std::move(op));
    submitted_.clear();
    poisoned = error_;
  }
  // Emptied however the loop ends, as a local batch would be.
  struct Clear {
    std::vector<std::unique_ptr<Op>>& v;
    ~Clear() { v.clear(); }
  } clear{starting_};
  for (auto& op : starting_) {
    auto a = std::make_unique<Active>();
    const Schedule& s = op->schedule;
    a->remaining = s.depCounts();
    a->done.assign(a->remaining.size(), false);
    for (StepId i = 0; i < a->remaining.size(); ++i) {
      if (a->remaining[i] == 0) a->ready.push_back(i);
    }
    auto timeout = op->timeout.count() > 0 ? op->timeout : options_.timeout;
    a->deadline = Clock::now() + timeout;
    a->op = std::move(op);
    Active& ref = *a;
    active_.push_back(std::move(a));
    RINGX_LOG(Trace, prefix(*ref.op) << "start, " << ref.op->schedule.steps().size() << " steps, algorithm "
                                     << ref.op->schedule.algorithm());
    if (poisoned) {
      fail(ref, poisoned->kind(), std::string("the communicator failed earlier: ") + poisoned->what());
    } else if (ref.remaining.empty()) {
      finish(ref);
    }
  }
  return true;
}

bool Communicator::runReady(Active& a) {
  bool did = false;
  while (a.readyNext < a.ready.size() && !a.ended) {
    StepId id = a.ready[a.readyNext++];
    did = true;
    try {
      runStep(a, id);
    } catch (const std::exception& e) {
      const Step& s = a.op->schedule.steps()[id];
      fail(a, ErrorKind::Internal,
           std::string(stepKindName(s.kind)) + " step " + std::to_string(id) + " failed: " + e.what());
    }
  }
  return did;
}

void Communicator::runStep(Active& a, StepId id) {
  const Step& s = a.op->schedule.steps()[id];
  if (s.device && s.kind != StepKind::Send && s.kind != StepKind::Recv) {
    enqueueOnDevice(a, id);
    return;
  }
  switch (s.kind) {
    case StepKind::Send:
    case StepKind::Recv:
      post(a, id);
      return;
    case StepKind::Reduce:
      if (!a.reduce) a.reduce = reduceFn(a.op->schedule.dtype(), a.op->schedule.op());
      a.reduce(s.dst, s.src, s.bytes / dtypeSize(a.op->schedule.dtype()));
      break;
    case StepKind::Copy:
      if (s.bytes) std::memmove(s.dst, s.src, s.bytes);
      break;
    case StepKind::Scale:
      scale(s.dst, s.bytes / dtypeSize(a.op->schedule.dtype()), a.op->schedule.dtype(),
            a.op->schedule.scaleFactor());
      break;
    case StepKind::Poll:
      if (!poll(a, id)) {
        if (!a.ended) a.polling.push_back(id);
        return;
      }
      break;
  }
  stepDone(a, id);
}

void Communicator::enqueueOnDevice(Active& a, StepId id) {
  const Schedule& sched = a.op->schedule;
  const Step& s = sched.steps()[id];
  OnDevice on(sched.device().device);
  DeviceStream& stream = *sched.device().stream;
  const size_t count = s.bytes / dtypeSize(sched.dtype());
  if (s.kind == StepKind::Reduce) stream.reduce(s.dst, s.src, count, sched.dtype(), sched.op());
  if (s.kind == StepKind::Copy) stream.copy(s.dst, s.src, s.bytes);
  if (s.kind == StepKind::Scale) stream.scale(s.dst, count, sched.dtype(), sched.scaleFactor());
  stream.record(sched.stepEvent(id));
  a.onDevice.push_back(id);
}

bool Communicator::runPolls(Active& a) {
  bool did = false;
  OnDevice on(a.onDevice.empty() ? nullptr : a.op->schedule.device().device);
  for (size_t i = 0; i < a.onDevice.size() && !a.ended;) {
    if (a.op->schedule.stepEvent(a.onDevice[i]).query()) {
      StepId id = a.onDevice[i];
      a.onDevice.erase(a.onDevice.begin() + long(i));
      stepDone(a, id);
      did = true;
    } else {
      ++i;
    }
  }
  for (size_t i = 0; i < a.polling.size() && !a.ended;) {
    StepId id = a.polling[i];
    pollProgressed = false;
    if (poll(a, id)) {
      a.polling.erase(a.polling.begin() + long(i));
      stepDone(a, id);
      did = true;
    } else {
      did |= pollProgressed;
      ++i;
    }
  }
  return did;
}

bool Communicator::poll(Active& a, StepId id) {
  try {
    return a.op->schedule.runPoll(a.op->schedule.steps()[id]);
  } catch (const Error& e) {
    fail(a, e.kind(), e.what());
  } catch (const std::exception& e) {
    fail(a, ErrorKind::Internal, std::string("poll step ") + std::to_string(id) + " failed: " + e.what());
  }
  return false;
}

void Communicator::post(Active& a, StepId id) {
  const Step& s = a.op->schedule.steps()[id];
  Active* ap = &a;
  // Runs inside transport_->progress(): it may only record (see the header).
  auto done = [this, ap, id](const TransferResult& r) { onTransfer(*ap, id, r); };
  const MemoryKind mem = s.device ? a.op->schedule.device().device->memoryKind() : MemoryKind::Host;
  TransferId tid = s.kind == StepKind::Send
                       ? transport_->isend(s.peer, s.tag, s.sendData(), s.transferBytes(), mem, std::move(done))
                       : transport_->irecv(s.peer, s.tag, s.recvData(), s.transferBytes(), mem, std::move(done));
  // Callbacks run only from progress(), so the entry is here before its
  // callback looks it up.
  a.inflight.emplace(id, tid);
}

void Communicator::onTransfer(Active& a, StepId id, const TransferResult& r) {
  a.inflight.erase(id);
  if (a.ended) {
    tellFailure(a, false);
    return;
  }
  const Step& st = a.op->schedule.steps()[id];
  if (!r.ok && r.errorKind == ErrorKind::PeerClosed && st.kind == StepKind::Recv && st.peer >= 0 &&
      a.op->schedule.waitsOutClosedPeers()) {
    if (a.closedPeers.empty()) a.closedError = r.error;
    a.closedPeers.insert(std::lower_bound(a.closedPeers.begin(), a.closedPeers.end(), st.peer), st.peer);
    stepDone(a, id);
  } else if (!r.ok) {
    // Who the op still waited for, the failed transfer's peer included: a
    // monitored barrier names them as the ranks that did not pass.
    std::vector<int> awaited = awaitedPeers(a);
    if (st.kind == StepKind::Recv && !std::binary_search(awaited.begin(), awaited.end(), st.peer)) {
      awaited.insert(std::lower_bound(awaited.begin(), awaited.end(), st.peer), st.peer);
    }
    fail(a, r.errorKind, r.error, std::move(awaited));
  } else if (st.kind == StepKind::Recv && r.bytes != st.transferBytes()) {
    fail(a, ErrorKind::InvalidArgument,
         "rank " + std::to_string(r.source) + " sent " + std::to_string(r.bytes) + " bytes where " +
             std::to_string(st.transferBytes()) + " were expected: the ranks passed tensors of different sizes");
  } else {
    if (st.kind == StepKind::Recv) a.op->recvSource = r.source;
    stepDone(a, id);
  }
}

void Communicator::stepDone(Active& a, StepId id) {
  ++a.stepsDone;
  a.done[id] = true;
  for (StepId d : a.op->schedule.dependents()[id]) {
    if (--a.remaining[d] == 0) a.ready.push_back(d);
  }
  if (a.stepsDone < a.remaining.size()) return;
  if (a.closedPeers.empty()) {
    finish(a);
  } else {
    fail(a, ErrorKind::PeerClosed, a.closedError, a.closedPeers);
  }
}

// onDone only publishes; should it throw anyway, the op has ended and the
// exception must not reach the transport's callback chain.
void Communicator::publish(Active& a, const Error* err) {
  if (!a.op->onDone) return;
  try {
    a.op->onDone(err);
  } catch (const std::exception& e) {
    RINGX_LOG(Warn, prefix(*a.op) << "publishing the result failed: " << e.what());
  }
}

bool Communicator::wantsCallbacks(Active& a) {
  if (!a.op->onCallbacks) return false;
  if (!a.op->callbacksWanted) return true;
  try {
    return a.op->callbacksWanted();
  } catch (const std::exception& e) {
    RINGX_LOG(Warn, prefix(*a.op) << "asking for completion callbacks failed: " << e.what());
    return true;
  }
}

void Communicator::finish(Active& a) {
  a.ended = true;
  inFlight_.fetch_sub(1);
  publish(a, nullptr);
  if (wantsCallbacks(a)) {
    auto cb = std::move(a.op->onCallbacks);
    callbacks_.post([cb = std::move(cb)] { cb(nullptr); });
  }
}

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

bool Communicator::hasPending() const {
  if (!active_.empty()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return !submitted_.empty();
}

// Everything pending waits on peers' shared-memory counters, nothing on the
// transport or a device: the doorbell is then the one thing worth sleeping on.
bool Communicator::onlyPolling() const {
  bool polling = false;
  for (auto& a : active_) {
    if (a->ended) continue;
    if (!a->inflight.empty() || !a->onDevice.empty()) return false;
    for (StepId id : a->polling) {
      if (a->op->schedule.pollOnDevice(a->op->schedule.steps()[id])) return false;
    }
    polling |= !a->polling.empty();
  }
  return polling;
}

std::chrono::microseconds Communicator::untilNextDeadline(std::optional<Clock::time_point> until) const {
  const auto now = Clock::now();
  auto next = now + std::chrono::milliseconds(100);
  if (until) next = std::min(next, *until);
  for (auto& a : active_) {
    if (!a->ended) next = std::min(next, a->deadline);
    if (a->untold) next = std::min(next, a->tellBy);
  }
  return std::max(std::chrono::microseconds(0),
                  std::chrono::duration_cast<std::chrono::microseconds>(next - now) + std::chrono::microseconds(1));
}

// Called with progressMu_ held after a pass that did nothing.
Communicator::Nap Communicator::planNap(Clock::time_point idleSince, uint32_t bellSeen,
                                        std::optional<Clock::time_point> until) {
  Nap nap;
  const bool polling = std::any_of(active_.begin(), active_.end(),
                                   [](auto& a) { return !a->ended && (!a->polling.empty() || !a->onDevice.empty()); });
  if (Clock::now() - idleSince < options_.spin) {
    nap.kind = Nap::Kind::Yield;
  } else if (polling) {
    nap.kind = options_.bell && onlyPolling() ? Nap::Kind::Bell : Nap::Kind::Yield;
  } else if (transport_->arm()) {
    nap.kind = Nap::Kind::Events;
  }
  nap.max = untilNextDeadline(until);
  nap.bellSeen = bellSeen;
  std::lock_guard<std::mutex> lock(mu_);
  nap.workGen = workGen_;
  return nap;
}

void Communicator::takeNap(const Nap& nap) {
  if (nap.kind == Nap::Kind::None) return;
  if (nap.kind == Nap::Kind::Yield) {
    std::this_thread::yield();
    return;
  }
  const bool bell = nap.kind == Nap::Kind::Bell;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!submitted_.empty() || stopping_ || workGen_ != nap.workGen) return;
    ++(bell ? bellSleepers_ : eventSleepers_);
  }
  if (bell) {
    options_.bell->sleep(nap.bellSeen, nap.max);
  } else {
    epoll_event events[3];
    ::epoll_wait(epollFd_, events, 3, int((nap.max.count() + 999) / 1000));
    uint64_t v;
    while (::read(wakeFd_, &v, sizeof(v)) > 0) {
    }
    while (::read(timerFd_, &v, sizeof(v)) > 0) {
    }
    timerArmed_ = false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  --(bell ? bellSleepers_ : eventSleepers_);
}

void Communicator::park() {
  std::unique_lock<std::mutex> lock(mu_);
  parked_ = true;
  parkCv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return drivers_.load() == 0 || stopping_; });
  parked_ = false;
}

void Communicator::pinThisThread() const {
  if (options_.cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(options_.cpu, &set);
  if (int err = ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set)) {
    RINGX_LOG(Warn, "ringx: could not pin a thread to CPU " << options_.cpu << ": " << std::strerror(err));
  }
}

// The transport's completions, then every op's polls and ready steps.
bool Communicator::advance() {
  bool did = false;
  try {
    did = transport_->progress();
  } catch (const std::exception& e) {
    failCommunicator(std::string("the transport's progress failed: ") + e.what());
  }
  settle();
  for (auto& a : active_) {
    did |= runPolls(*a);
    did |= runReady(*a);
  }
  return did;
}

// One pass over everything pending, with progressMu_ held. Each phase that
// can fail an op is followed by settle(), and ops are reaped only after it,
// so a failed op's transfers are cancelled before anything forgets them.
// Returns whether anything moved.
bool Communicator::pass() {
  if (closed_) return false;
  bool did = false;
  try {
    did = startSubmitted();
    did |= advance();
    checkDeadlines();
    if (!active_.empty() && Clock::now() >= nextPeerCheck_) {
      try {
        transport_->checkPeers();
      } catch (const std::exception& e) {
        failCommunicator(std::string("checking peers failed: ") + e.what());
      }
      if (aPeerDiedUnseen()) did |= advance();
      failOnDeadPeer();
      nextPeerCheck_ = Clock::now() + std::chrono::milliseconds(100);
    }
    settle();
    did |= reapFinished();
  } catch (const std::exception& e) {
    failCommunicator(std::string("the progress loop failed: ") + e.what());
    settle();
    did = true;
  }
  return did;
}

void Communicator::progressLoop() {
  pinThisThread();
  auto idleSince = Clock::now();
  for (;;) {
    if (drivers_.load() > 0) {
      park();
      continue;
    }
    std::unique_lock<std::mutex> pl(progressMu_);
    if (stopping_) {
      bool pending = std::any_of(active_.begin(), active_.end(), [](auto& a) { return !a->ended; });
      std::lock_guard<std::mutex> lock(mu_);
      if (!drain_ || !(pending || !submitted_.empty())) break;
    }
    const uint32_t seen = options_.bell ? options_.bell->seen() : 0;
    if (pass()) {
      idleSince = Clock::now();
      continue;
    }
    if (drivers_.load() > 0) continue;
    Nap nap = planNap(idleSince, seen, std::nullopt);
    pl.unlock();
    takeNap(nap);
    if (nap.kind == Nap::Kind::Bell || nap.kind == Nap::Kind::Events) idleSince = Clock::now();
  }
  std::lock_guard<std::mutex> pl(progressMu_);
  startSubmitted();
  for (auto& a : active_) {
    fail(*a, ErrorKind::Aborted,
         "aborted: the process group was " + (abortReason_.empty() ? std::string("aborted") : abortReason_) +
             " while this operation was pending");
  }
  // Destroying the transport cancels and closes everything it still holds,
  // after which no buffer of any op is referenced and the ops can go. A
  // transport handed over (release) only forgets them: a cancelled receive
  // that a peer's rendezvous already matched may still write into its
  // buffer, which is why a group is shrunk only once its ops have ended or
  // the caller asked to abort them.
  bool keep = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keep = keepTransport_;
  }
  if (keep) {
    transport_->forgetPending();
  } else {
    transport_.reset();
  }
  for (auto& a : active_) tellFailure(*a, true);
  active_.clear();
  closed_ = true;
}

}  // namespace ringx
