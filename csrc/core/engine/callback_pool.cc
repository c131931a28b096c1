#include "core/engine/callback_pool.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <set>
#include <mutex>
#include <thread>
#include <vector>

#include "core/common/log.h"

namespace ringx {

using Clock = std::chrono::steady_clock;

// A callback still running after this long is taken to be blocked, and the
// next one may start beside it; shorter ones run strictly one after another.
constexpr auto kBlockedAfter = std::chrono::milliseconds(2);

struct CallbackPool::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
  std::vector<std::thread> threads;
  std::multiset<Clock::time_point> running;  // start times of the callbacks running now
  int idle = 0;                              // threads free to take a job, or about to be
  bool stopping = false;
  int maxThreads = 1;
  int cpu = -1;
};

namespace {

std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}
std::vector<std::weak_ptr<CallbackPool::State>>& registry() {
  static auto* pools = new std::vector<std::weak_ptr<CallbackPool::State>>();
  return *pools;
}

// A fork never copies the registry's lock held, nor the registry half
// changed: a child that makes a group adds its pool to it.
[[maybe_unused]] const int forkHandlers = ::pthread_atfork([] { registryMutex().lock(); },
                                                           [] { registryMutex().unlock(); },
                                                           [] { registryMutex().unlock(); });

void runJob(std::function<void()>& job) {
  try {
    job();
  } catch (const std::exception& e) {
    RINGX_LOG(Warn, "ringx: a completion callback threw: " << e.what());
  } catch (...) {
    RINGX_LOG(Warn, "ringx: a completion callback threw a non-standard exception");
  }
}

void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (int err = ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set)) {
    RINGX_LOG(Warn, "ringx: could not pin a thread to CPU " << cpu << ": " << std::strerror(err));
  }
}

void workerLoop(const std::shared_ptr<CallbackPool::State>& s);

// Called with s->mu held, when a job is queued and no thread is free for it.
void addThreadIfAllowed(const std::shared_ptr<CallbackPool::State>& s) {
  if (s->stopping || s->idle > 0 || int(s->threads.size()) >= s->maxThreads) return;
  ++s->idle;
  s->threads.emplace_back([s] { workerLoop(s); });
}

// Takes the next job once no callback is running, or once every running one
// has run for kBlockedAfter; so jobs start in order, and overlap only with
// callbacks that block.
void workerLoop(const std::shared_ptr<CallbackPool::State>& s) {
  // Named so that top -H and /proc tell ringx's threads from torch's.
  ::pthread_setname_np(::pthread_self(), "ringx-callback");
  pin(s->cpu);
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    for (;;) {
      if (s->jobs.empty()) {
        if (s->stopping) {
          --s->idle;
          return;
        }
        s->cv.wait(lock);
        continue;
      }
      if (s->running.empty()) break;
      const auto youngest = *s->running.rbegin();
      if (Clock::now() - youngest >= kBlockedAfter) break;
      s->cv.wait_until(lock, youngest + kBlockedAfter);
    }
    --s->idle;
    auto job = std::move(s->jobs.front());
    s->jobs.pop_front();
    // The job may block on a later one's completion: make sure a thread waits for the next.
    if (!s->jobs.empty()) addThreadIfAllowed(s);
    // Its time starts after the thread is made, which a slow machine may take
    // most of kBlockedAfter to do: the next job must not start ahead of it.
    auto me = s->running.insert(Clock::now());
    lock.unlock();
    runJob(job);
    job = nullptr;  // what it captured goes now, outside the lock
    lock.lock();
    s->running.erase(me);
    ++s->idle;
    s->cv.notify_all();
  }
}

// Ends the threads of `s`; the calling thread, if it is one of them, runs the
// rest of the queue itself and is detached.
void stopState(const std::shared_ptr<CallbackPool::State>& s) {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->stopping && s->threads.empty()) return;
    s->stopping = true;
    threads.swap(s->threads);
  }
  s->cv.notify_all();
  bool selfIsWorker = false;
  for (auto& t : threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      selfIsWorker = true;
      t.detach();
    } else {
      t.join();
    }
  }
  if (!selfIsWorker) return;
  for (;;) {
    std::function<void()> job;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->jobs.empty()) return;
      job = std::move(s->jobs.front());
      s->jobs.pop_front();
    }
    runJob(job);
  }
}

}  // namespace

CallbackPool::CallbackPool(int maxThreads, int cpu) : state_(std::make_shared<State>()) {
  state_->maxThreads = std::max(1, maxThreads);
  state_->cpu = cpu;
  {
    // One thread from the start, pinned before the first completion needs it.
    std::lock_guard<std::mutex> lock(state_->mu);
    addThreadIfAllowed(state_);
  }
  std::lock_guard<std::mutex> lock(registryMutex());
  auto& pools = registry();
  std::erase_if(pools, [](const auto& w) { return w.expired(); });
  pools.push_back(state_);
}

CallbackPool::~CallbackPool() {
  if (!abandoned_) stop();
}

void CallbackPool::post(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->stopping) return;
  state_->jobs.push_back(std::move(job));
  addThreadIfAllowed(state_);
  state_->cv.notify_all();
}

void CallbackPool::stop() { stopState(state_); }

// No lock taken: the parent's threads may have held one at fork time.
void CallbackPool::abandonAfterFork() {
  abandoned_ = true;
  for (auto& t : state_->threads) t.detach();
  // The state stays allocated: its mutex may be locked, so it is never destroyed.
  new std::shared_ptr<State>(state_);
}

void CallbackPool::stopAll() {
  std::vector<std::shared_ptr<State>> live;
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    for (auto& w : registry()) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) stopState(s);
}

}  // namespace ringx
