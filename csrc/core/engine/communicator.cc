#include "core/engine/communicator.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "core/common/exit_watch.h"
#include "core/common/fork_generation.h"
#include "core/common/log.h"
#include "core/engine/communicator_active.h"

namespace ringx {

using Clock = std::chrono::steady_clock;

namespace {

// Enough for callbacks that block on a few later futures each (PowerSGD's
// hooks wait on one); beyond it callbacks queue instead of taking threads.
constexpr int kMaxCallbackThreads = 4;

// What a caller's submit() may run inline: a latency-bound op.
constexpr size_t kInlineBytes = 64 * 1024;

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

Communicator::Communicator(std::unique_ptr<Transport> transport, CommOptions options)
    : transport_(std::move(transport)),
      options_(options),
      rank_(transport_->rank()),
      size_(transport_->size()),
      netSpin_(options.spin),
      creatorPid_(processId()),
      creatorFork_(forkGeneration()),
      callbacks_(kMaxCallbackThreads, options.cpu) {
  wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timerFd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  idleEpollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (wakeFd_ < 0 || timerFd_ < 0 || epollFd_ < 0 || idleEpollFd_ < 0) {
    throw Error(ErrorKind::Internal, "ringx: eventfd/timerfd/epoll creation failed");
  }
  nextPeerCheck_ = Clock::now();
  peerExitsChecked_ = exitsSeen();
  for (auto [set, fd] : {std::pair{epollFd_, wakeFd_}, {epollFd_, timerFd_},
                         {epollFd_, transport_->eventFd()}, {idleEpollFd_, wakeFd_},
                         {idleEpollFd_, timerFd_}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(set, EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw Error(ErrorKind::Internal, std::string("ringx: epoll_ctl failed: ") + std::strerror(errno));
    }
  }
  exitListener_ = listenForExits([this] { wakeProgressThread(); });
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
  exitListener_.reset();
  ::close(idleEpollFd_);
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
  if (bellSleepers_ > 0 && options_.bell) options_.bell->wakeOwn();
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
  if (bellSleepers_ > 0 && options_.bell) options_.bell->wakeOwn();
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
  Wait wait;
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
    if (pass()) {
      idleSince = Clock::now();
      endWait(wait, idleSince);
      continue;
    }
    if (done()) break;
    Nap nap = planNap(idleSince, until);
    noteNap(wait, nap);
    if (bool moved = false; nap.kind == Nap::Kind::Bell && !armBell(nap, moved)) {
      if (moved) idleSince = Clock::now();
      continue;
    }
    takeNap(nap);
    if (nap.restartsSpin()) idleSince = Clock::now();
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
      if (options_.bell && bellSleepers_ > 0) options_.bell->wakeOwn();
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

}  // namespace ringx
