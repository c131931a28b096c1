// Runs completion callbacks (future continuations: user code) off the
// progress thread, in the order they were posted, on a bounded set of threads.
//
// Callbacks run one after another, in post order. A callback may block on a
// later operation's future (PowerSGD waits inside .then): once the running
// callbacks have all run for a moment, the next one may start on another
// thread, up to a cap; past it, callbacks wait their turn.
//
// The state lives behind a shared_ptr the threads hold too: stop() may be
// called from one of the pool's own threads (the last reference to a group
// dropped inside a callback), which cannot join itself and outlives the
// object that owned the pool.
#pragma once

#include <functional>
#include <memory>

namespace ringx {

class CallbackPool {
 public:
  // cpu: the CPU new threads are pinned to, or -1.
  CallbackPool(int maxThreads, int cpu);
  ~CallbackPool();
  CallbackPool(const CallbackPool&) = delete;
  CallbackPool& operator=(const CallbackPool&) = delete;

  // After stop(), jobs are dropped (nothing may run once a group is gone).
  void post(std::function<void()> job);
  // Runs what is queued, then ends every thread. Called from a pool thread,
  // that thread finishes the queue itself and is left to exit on its own.
  void stop();
  // In a forked child: the threads are not there, and locks may be held by
  // threads that do not exist; forget them without touching either.
  void abandonAfterFork();

  // Stops every live pool in the process (interpreter teardown: no callback
  // may run into a Python that is being torn down).
  static void stopAll();

  struct State;

 private:
  std::shared_ptr<State> state_;
  bool abandoned_ = false;
};

}  // namespace ringx
