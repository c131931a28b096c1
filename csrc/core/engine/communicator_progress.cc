// A Communicator's progress loop: one pass over everything pending, and how
// long to sleep, on what, when a pass moved nothing.
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/common/exit_watch.h"
#include "core/common/log.h"
#include "core/engine/communicator_active.h"

namespace ringx {

bool Communicator::hasPending() const {
  if (!active_.empty()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return !submitted_.empty();
}

// Nothing pending waits on a device, whose events ring no doorbell.
bool Communicator::noDeviceWork() const {
  for (auto& a : active_) {
    if (a->ended) continue;
    if (!a->onDevice.empty()) return false;
    for (StepId id : a->polling) {
      if (a->op->schedule.pollOnDevice(a->op->schedule.steps()[id])) return false;
    }
  }
  return true;
}

bool Communicator::transfersInFlight() const {
  return std::any_of(active_.begin(), active_.end(),
                     [](auto& a) { return !a->ended && !a->inflight.empty(); });
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

namespace {

// A poll completes only once every rank it names has moved (schedule.h), so
// a sleeper registered for any one of them is woken before the poll can
// complete. Registering for all of them woke it at each arrival, n - 1 times
// a call for a one-shot all-reduce; registering for one and, once woken,
// for one still behind, wakes it once per rank that arrives after all the
// ranks still behind when it registered. Picked at random, that is about
// ln n wake-ups whatever order the scheduler runs the ranks in; the first in
// rank order would give n - 1 again whenever ranks arrive in rank order.
int pickOne(const std::vector<int>& ranks) {
  thread_local std::minstd_rand pick(std::random_device{}());
  return ranks[size_t(pick() % ranks.size())];
}

bool registered(uint64_t waitsFor, uint64_t bits) {
  return bits == FutexBell::kAnyone ? waitsFor == FutexBell::kAnyone : (waitsFor & bits) != 0;
}

}  // namespace

// What to register on the bell for: one rank each pending poll still waits
// for, as the bell's waitsFor bits; anyone's when a poll does not say.
uint64_t Communicator::awaitedBells() const {
  uint64_t mask = 0;
  for (auto& a : active_) {
    if (a->ended) continue;
    for (StepId id : a->polling) {
      try {
        const std::vector<int> ranks = a->op->schedule.pollWaitingOn(a->op->schedule.steps()[id]);
        mask |= ranks.empty() ? FutexBell::kAnyone : options_.bell->maskOf({pickOne(ranks)});
      } catch (const std::exception&) {
        return FutexBell::kAnyone;
      }
      if (mask == FutexBell::kAnyone) return mask;
    }
  }
  return mask ? mask : FutexBell::kAnyone;
}

// Whether a sleeper registered for `waitsFor` is woken by a move that lets
// any pending poll through: each still waits for a rank registered for.
bool Communicator::bellsCover(uint64_t waitsFor) const {
  for (auto& a : active_) {
    if (a->ended) continue;
    for (StepId id : a->polling) {
      try {
        const std::vector<int> ranks = a->op->schedule.pollWaitingOn(a->op->schedule.steps()[id]);
        const bool covered =
            ranks.empty() ? waitsFor == FutexBell::kAnyone
                          : std::any_of(ranks.begin(), ranks.end(),
                                        [&](int p) { return registered(waitsFor, options_.bell->maskOf({p})); });
        if (!covered) return false;
      } catch (const std::exception&) {
        return waitsFor == FutexBell::kAnyone;
      }
    }
  }
  return true;
}

// Called with progressMu_ held after a pass that did nothing.
Communicator::Nap Communicator::planNap(Clock::time_point idleSince,
                                        std::optional<Clock::time_point> until) {
  Nap nap;
  const bool polling = std::any_of(active_.begin(), active_.end(),
                                   [](auto& a) { return !a->ended && (!a->polling.empty() || !a->onDevice.empty()); });
  nap.networkOnly = options_.gaugeNetworkSpin && !polling &&
                    std::any_of(active_.begin(), active_.end(), [](auto& a) { return !a->ended; });
  if (Clock::now() - idleSince < options_.spin && (!nap.networkOnly || netSpin_.worthSpinning())) {
    nap.kind = Nap::Kind::Yield;
  } else if (polling && options_.bell && noDeviceWork()) {
    // Polls on peers' shared-memory counters, whose moves ring the doorbell:
    // the one thing worth sleeping on, in slices while transfers are in
    // flight too.
    nap.kind = Nap::Kind::Bell;
    nap.slice = transfersInFlight();
  } else if (polling) {
    nap.kind = Nap::Kind::Yield;
  } else if (active_.empty()) {
    nap.kind = Nap::Kind::Idle;
  } else if (transport_->arm()) {
    nap.kind = Nap::Kind::Events;
  }
  if (nap.kind == Nap::Kind::Bell) nap.waitsFor = awaitedBells();
  nap.max = untilNextDeadline(until);
  if (nap.slice) nap.max = std::min(nap.max, kMixedNapSlice);
  nap.exits = peerExitsChecked_;
  std::lock_guard<std::mutex> lock(mu_);
  nap.workGen = workGen_;
  return nap;
}

// With progressMu_ held: registers on this rank's bell for the ranks the nap
// waits for, then looks again (futex_bell.h). False, and unregistered, when
// something moved meanwhile or a poll no longer waits for any rank the bell
// was told of; `moved` then says whether the look did work.
bool Communicator::armBell(Nap& nap, bool& moved) {
  nap.bellSeen = options_.bell->arm(nap.waitsFor);
  moved = pass();
  if (!moved && bellsCover(nap.waitsFor)) return true;
  options_.bell->disarm();
  return false;
}

// With progressMu_ held, for each nap planned and after each pass that
// moved something (at `now`): a wait ends with the move, and is scored if
// every nap of it waited for the network alone.
void Communicator::noteNap(Wait& wait, const Nap& nap) const {
  wait.napped = true;
  wait.networkOnly = wait.networkOnly && nap.networkOnly;
}

void Communicator::endWait(Wait& wait, Clock::time_point now) {
  if (wait.napped && wait.networkOnly) netSpin_.record(now - wait.since);
  wait = Wait{now};
}

void Communicator::takeNap(const Nap& nap) {
  if (nap.kind == Nap::Kind::None) return;
  if (nap.kind == Nap::Kind::Yield) {
    std::this_thread::yield();
    return;
  }
  const bool bell = nap.kind == Nap::Kind::Bell;
  {
    // A peer's exit counted since the last peer check ends the nap before it
    // starts; one counted after this look finds this thread among the
    // sleepers, since the count comes before the listener, which takes mu_.
    std::lock_guard<std::mutex> lock(mu_);
    if (!submitted_.empty() || stopping_ || workGen_ != nap.workGen || exitsSeen() != nap.exits) {
      if (bell) options_.bell->disarm();
      return;
    }
    ++(bell ? bellSleepers_ : eventSleepers_);
  }
  if (bell) {
    options_.bell->sleep(nap.bellSeen, nap.max);
    options_.bell->disarm();
  } else {
    epoll_event events[3];
    ::epoll_wait(nap.kind == Nap::Kind::Idle ? idleEpollFd_ : epollFd_, events, 3,
                 int((nap.max.count() + 999) / 1000));
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
    if (const uint64_t exits = exitsSeen(); exits != peerExitsChecked_) {
      peerExitsChecked_ = exits;
      nextPeerCheck_ = Clock::now();
    }
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
  ::pthread_setname_np(::pthread_self(), "ringx-progress");
  pinThisThread();
  auto idleSince = Clock::now();
  Wait wait;
  for (;;) {
    if (drivers_.load() > 0) {
      park();
      wait = Wait{};
      continue;
    }
    std::unique_lock<std::mutex> pl(progressMu_);
    if (stopping_) {
      bool pending = std::any_of(active_.begin(), active_.end(), [](auto& a) { return !a->ended; });
      std::lock_guard<std::mutex> lock(mu_);
      if (!drain_ || !(pending || !submitted_.empty())) break;
    }
    if (pass()) {
      idleSince = Clock::now();
      endWait(wait, idleSince);
      continue;
    }
    if (drivers_.load() > 0) continue;
    Nap nap = planNap(idleSince, std::nullopt);
    noteNap(wait, nap);
    if (bool moved = false; nap.kind == Nap::Kind::Bell && !armBell(nap, moved)) {
      if (moved) idleSince = Clock::now();
      continue;
    }
    pl.unlock();
    takeNap(nap);
    if (nap.restartsSpin()) idleSince = Clock::now();
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
