// Dropping the last C++ reference to a tensor that has a Python wrapper
// takes the GIL (torch decrefs the wrapper). The engine's threads do that
// when an op ends. Once the interpreter has begun to finalize, a thread
// that is not the finalizing one and waits for the GIL is ended by
// pthread_exit, and its unwinding through torch's noexcept release aborts
// the process ("terminate called without an active exception"): a rank that
// exits with an op still completing dies after its work is done.
//
// The atexit hook runs before finalization starts. From then on nothing an
// op holds is released; the process is about to end, so that costs nothing.
// Releases already under way are waited for, with the GIL free for them.
#include "torch/exit_safe_release.h"

#include <atomic>
#include <chrono>
#include <thread>

namespace ringx {

namespace {

// Sequentially consistent: a release either sees `exiting`, or the hook sees
// it counted in `releasing` and waits for it.
std::atomic<bool> exiting{false};
std::atomic<int> releasing{0};

}  // namespace

namespace detail {

void destroyUnlessExiting(void (*destroy)(void*), void* p) {
  releasing.fetch_add(1);
  if (!exiting.load()) destroy(p);
  releasing.fetch_sub(1);
}

}  // namespace detail

void stopReleasingAtExit() {
  exiting.store(true);
  while (releasing.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace ringx
