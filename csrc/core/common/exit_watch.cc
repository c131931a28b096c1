#include "core/common/exit_watch.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <list>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

namespace ringx {

namespace {

// pidfd_open has this number on every architecture (Linux 5.3 gave new
// system calls one table); headers older than the kernel may lack the name.
constexpr long kPidfdOpen = 434;

// The epoll data of the eventfd that stops the thread; a pidfd's is its pid.
constexpr uint64_t kStop = 0;

struct Watcher {
  int epfd = -1;
  int stopFd = -1;
  std::thread thread;
};

struct Watched {
  int pidfd;
  int tokens;
};

struct State {
  std::mutex mu;
  std::unordered_map<int, Watched> pids;
  std::unique_ptr<Watcher> watcher;  // while any pid is watched
  std::atomic<uint64_t> exits{0};
  std::mutex listenMu;  // held while the listeners are called
  std::list<std::function<void()>> listeners;
};

// A forked child gets a state of its own; the parent's is left as it was
// copied (its locks may be held by threads the child does not have), and
// the tokens made there release nothing. Its descriptors stay open in the
// child, as the rest of what the parent's groups held does.
std::atomic<State*> current{nullptr};

State& state() {
  [[maybe_unused]] static const int made = [] {
    current.store(new State);
    return ::pthread_atfork(nullptr, nullptr, [] { current.store(new State); });
  }();
  return *current.load();
}

void watchLoop(State& s, int epfd) {
  for (;;) {
    epoll_event events[16];
    const int n = ::epoll_wait(epfd, events, 16, -1);
    if (n < 0 && errno != EINTR) return;
    uint64_t exited = 0;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kStop) return;
      ++exited;
    }
    if (exited == 0) continue;
    s.exits.fetch_add(exited);
    std::lock_guard<std::mutex> lock(s.listenMu);
    for (auto& onExit : s.listeners) onExit();
  }
}

void stop(std::unique_ptr<Watcher> w) {
  if (!w) return;
  const uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(w->stopFd, &one, sizeof(one));
  w->thread.join();
  ::close(w->epfd);
  ::close(w->stopFd);
}

std::unique_ptr<Watcher> start(State& s) {
  auto w = std::make_unique<Watcher>();
  w->epfd = ::epoll_create1(EPOLL_CLOEXEC);
  w->stopFd = ::eventfd(0, EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kStop;
  if (w->epfd >= 0 && w->stopFd >= 0 && ::epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->stopFd, &ev) == 0) {
    try {
      w->thread = std::thread(watchLoop, std::ref(s), w->epfd);
      // Named here, not by the thread: once watchExit returns, the thread is
      // there to be found by its name (in ps, top, a test's count).
      ::pthread_setname_np(w->thread.native_handle(), "ringx-exits");
      return w;
    } catch (const std::system_error&) {
    }
  }
  if (w->epfd >= 0) ::close(w->epfd);
  if (w->stopFd >= 0) ::close(w->stopFd);
  return nullptr;
}

// With s.mu held: whether `pidfd` is now on the watcher's list, the watcher
// started if there was none.
bool add(State& s, int pid, int pidfd) {
  if (!s.watcher) s.watcher = start(s);
  if (!s.watcher) return false;
  // One-shot: an exited process's pidfd stays readable, and one wake-up says
  // all there is to say.
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = uint64_t(pid);
  return ::epoll_ctl(s.watcher->epfd, EPOLL_CTL_ADD, pidfd, &ev) == 0;
}

void unwatch(State* owner, int pid) {
  State& s = *owner;
  std::unique_ptr<Watcher> idle;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.pids.find(pid);
    if (it == s.pids.end() || --it->second.tokens > 0) return;
    ::close(it->second.pidfd);
    s.pids.erase(it);
    if (s.pids.empty()) idle = std::move(s.watcher);
  }
  stop(std::move(idle));
}

}  // namespace

std::shared_ptr<void> watchExit(int pid) {
  if (pid <= 0) return nullptr;
  State& s = state();
  bool watched = true;
  std::unique_ptr<Watcher> idle;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.pids.find(pid); it != s.pids.end()) {
      ++it->second.tokens;
    } else if (const int pidfd = int(::syscall(kPidfdOpen, pid, 0));
               pidfd >= 0 && add(s, pid, pidfd)) {
      s.pids.emplace(pid, Watched{pidfd, 1});
    } else {
      watched = false;
      if (pidfd >= 0) ::close(pidfd);
      if (s.pids.empty()) idle = std::move(s.watcher);
    }
  }
  stop(std::move(idle));
  if (!watched) return nullptr;
  State* owner = &s;
  return std::shared_ptr<void>(owner, [owner, pid](void*) {
    if (current.load() == owner) unwatch(owner, pid);
  });
}

std::shared_ptr<void> listenForExits(std::function<void()> onExit) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.listenMu);
  auto it = s.listeners.insert(s.listeners.end(), std::move(onExit));
  State* owner = &s;
  return std::shared_ptr<void>(owner, [owner, it](void*) {
    if (current.load() != owner) return;
    std::lock_guard<std::mutex> lock(owner->listenMu);
    owner->listeners.erase(it);
  });
}

uint64_t exitsSeen() { return state().exits.load(); }

}  // namespace ringx
