#include "core/common/fork_generation.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace ringx {

namespace {

std::atomic<int> generation{0};
std::atomic<int> pid{int(::getpid())};

// Registered once, when the library is loaded, so every later fork counts.
const int registered = ::pthread_atfork(nullptr, nullptr, [] {
  generation.fetch_add(1);
  pid.store(int(::getpid()));
});

}  // namespace

int forkGeneration() {
  (void)registered;
  return generation.load(std::memory_order_relaxed);
}

int processId() {
  (void)registered;
  return pid.load(std::memory_order_relaxed);
}

}  // namespace ringx
