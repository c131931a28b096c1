#include "core/device/sim_device.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>

#include "core/reduce/reduce.h"

namespace ringx {

namespace {

// Shared by the event and the work that records or waits for it, so that
// either may outlive the other.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;  // bumped by record()
  uint64_t reached = 0;   // the last recording its stream got to

  void reach(uint64_t mark) {
    std::lock_guard<std::mutex> lock(mu);
    if (mark > reached) reached = mark;
    cv.notify_all();
  }
};

using DriverLock = std::shared_ptr<std::shared_mutex>;

class SimEvent final : public DeviceEvent {
 public:
  explicit SimEvent(DriverLock driver) : driver_(std::move(driver)) {}
  ~SimEvent() override { std::unique_lock<std::shared_mutex> lock(*driver_); }

  bool query() override {
    std::lock_guard<std::mutex> lock(state->mu);
    return state->reached >= state->recorded;
  }
  void synchronize() override {
    std::unique_lock<std::mutex> lock(state->mu);
    const uint64_t mark = state->recorded;
    state->cv.wait(lock, [&] { return state->reached >= mark; });
  }

  std::shared_ptr<EventState> state = std::make_shared<EventState>();

 private:
  DriverLock driver_;
};

class SimStream final : public DeviceStream {
 public:
  SimStream(int maxDelayUs, uint64_t seed, DriverLock driver)
      : driver_(std::move(driver)), maxDelayUs_(maxDelayUs), rng_(seed), worker_([this] { run(); }) {}
  ~SimStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void record(DeviceEvent& event) override {
    auto state = static_cast<SimEvent&>(event).state;
    uint64_t mark;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      mark = ++state->recorded;
    }
    enqueue([state, mark] { state->reach(mark); });
  }

  void wait(DeviceEvent& event) override {
    auto state = static_cast<SimEvent&>(event).state;
    uint64_t mark;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      mark = state->recorded;
    }
    enqueue([this, state, mark] {
      std::unique_lock<std::mutex> lock(state->mu);
      while (state->reached < mark && !stopping()) state->cv.wait_for(lock, std::chrono::milliseconds(10));
    });
  }

  void waitFlag(const uint32_t* flag, uint32_t atLeast) override {
    enqueue([this, flag, atLeast] {
      std::atomic_ref<const uint32_t> word(*flag);
      while (word.load(std::memory_order_acquire) < atLeast && !stopping()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    enqueue([dst, src, bytes] {
      if (bytes) std::memmove(dst, src, bytes);
    });
  }

  void reduce(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) override {
    ReduceFn fn = reduceFn(dtype, op);
    enqueue([fn, dst, src, count] { fn(dst, src, count); });
  }

  void scale(void* buf, size_t count, DType dtype, double factor) override {
    enqueue([buf, count, dtype, factor] { ringx::scale(buf, count, dtype, factor); });
  }

  void synchronize() override {
    std::shared_lock<std::shared_mutex> driver(*driver_);
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t mark = enqueued_;
    idleCv_.wait(lock, [&] { return finished_ >= mark; });
  }

 private:
  void enqueue(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
      ++enqueued_;
    }
    cv_.notify_all();
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  void run() {
    std::uniform_int_distribution<int> delay(0, maxDelayUs_);
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(delay(rng_)));
      work();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++finished_;
      }
      idleCv_.notify_all();
    }
  }

  DriverLock driver_;
  const int maxDelayUs_;
  std::mt19937_64 rng_;
  std::mutex mu_;
  std::condition_variable cv_, idleCv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, finished_ = 0;
  bool stopping_ = false;
  std::thread worker_;  // last: starts once the rest is built
};

// Uninitialised device memory is not zero on a GPU either.
std::shared_ptr<std::byte> allocFilled(size_t bytes, DriverLock driver) {
  std::shared_ptr<std::byte> p(new std::byte[bytes ? bytes : 1], [driver = std::move(driver)](std::byte* b) {
    std::unique_lock<std::shared_mutex> lock(*driver);
    delete[] b;
  });
  std::memset(p.get(), 0xa5, bytes);
  return p;
}

}  // namespace

std::unique_ptr<DeviceStream> SimDevice::newStream() {
  return std::make_unique<SimStream>(options_.maxDelayUs, options_.seed * 1000003 + ++streams_, driver_);
}

std::unique_ptr<DeviceEvent> SimDevice::newEvent() { return std::make_unique<SimEvent>(driver_); }

std::shared_ptr<std::byte> SimDevice::allocDevice(size_t bytes) { return allocFilled(bytes, driver_); }

std::shared_ptr<std::byte> SimDevice::allocPinned(size_t bytes) { return allocFilled(bytes, driver_); }

}  // namespace ringx
