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
#include <vector>

#include "core/common/error.h"
#include "core/common/shm_segment.h"
#include "core/reduce/flags.h"
#include "core/reduce/reduce.h"

namespace ringx {

namespace {

// A CUDA runtime's per-thread state, and its process-wide count of captures
// in global mode.
constexpr int kCaptureGlobal = 0, kCaptureThreadLocal = 1;
thread_local int currentDevice = 0;
thread_local int captureMode = kCaptureGlobal;
std::atomic<int> globalCaptures{0};

}  // namespace

// What a device's streams, events and memory share with it and may outlive
// it with.
struct SimShared {
  explicit SimShared(int index) : index(index) {}

  // A call from the host. An `unsafe` one fails, as in CUDA, while a capture
  // in global mode is under way and this thread is in global mode too.
  void note(const char* what, bool unsafe = false) {
    ++calls;
    if (currentDevice != index && offDevice++ == 0) {
      std::lock_guard<std::mutex> lock(mu);
      firstOffDevice = std::string(what) + " on a thread whose current device is sim:" +
                       std::to_string(currentDevice) + ", for sim:" + std::to_string(index);
    }
    if (unsafe && globalCaptures.load() > 0 && captureMode == kCaptureGlobal) {
      throw Error(ErrorKind::Internal, std::string("sim device: ") + what +
                                           ": operation not permitted when a stream is capturing in global mode");
    }
  }
  // A kernel launch, which loads the kernels if nothing did before.
  void launch(const char* what) {
    note(what);
    std::lock_guard<std::mutex> lock(mu);
    if (!loadedBy) {
      loadedBy = std::this_thread::get_id();
      loadedLazily = true;
    }
  }

  const int index;
  std::shared_mutex driver;
  std::atomic<uint64_t> calls{0}, offDevice{0}, captured{0};
  mutable std::mutex mu;  // guards the three below
  std::string firstOffDevice;
  std::optional<std::thread::id> loadedBy;
  bool loadedLazily = false;
};

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

using Shared = std::shared_ptr<SimShared>;

class SimEvent final : public DeviceEvent {
 public:
  explicit SimEvent(Shared shared) : shared_(std::move(shared)) { shared_->note("cudaEventCreate"); }
  ~SimEvent() override {
    shared_->note("cudaEventDestroy");
    std::unique_lock<std::shared_mutex> lock(shared_->driver);
  }

  bool query() override {
    shared_->note("cudaEventQuery", true);
    std::lock_guard<std::mutex> lock(state->mu);
    return state->reached >= state->recorded;
  }
  void synchronize() override {
    shared_->note("cudaEventSynchronize", true);
    std::unique_lock<std::mutex> lock(state->mu);
    const uint64_t mark = state->recorded;
    state->cv.wait(lock, [&] { return state->reached >= mark; });
  }

  std::shared_ptr<EventState> state = std::make_shared<EventState>();

 private:
  Shared shared_;
};

class SimStream final : public DeviceStream {
 public:
  SimStream(int maxDelayUs, uint64_t seed, Shared shared)
      : shared_(std::move(shared)), maxDelayUs_(maxDelayUs), rng_(seed), worker_([this] { run(); }) {}
  ~SimStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void record(DeviceEvent& event) override {
    call("cudaEventRecord");
    auto state = static_cast<SimEvent&>(event).state;
    uint64_t mark;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      mark = ++state->recorded;
    }
    enqueue([state, mark] { state->reach(mark); });
  }

  void wait(DeviceEvent& event) override {
    call("cudaStreamWaitEvent");
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
    call("cuStreamWaitValue32");
    enqueue([this, flag, atLeast] {
      std::atomic_ref<const uint32_t> word(*flag);
      while (word.load(std::memory_order_acquire) < atLeast && !stopping()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    call("cudaMemcpyAsync");
    enqueue([dst, src, bytes] {
      if (bytes) std::memmove(dst, src, bytes);
    });
  }

  void copyUnlessFailed(void* dst, const void* src, size_t bytes, const uint32_t* flag) override {
    call("copy kernel", true);
    enqueue([dst, src, bytes, flag] {
      std::atomic_ref<const uint32_t> word(*flag);
      if (bytes && !(word.load(std::memory_order_acquire) & kFlagFailed)) std::memmove(dst, src, bytes);
    });
  }

  void reduce(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) override {
    call("reduce kernel", true);
    ReduceFn fn = reduceFn(dtype, op);
    enqueue([fn, dst, src, count] { fn(dst, src, count); });
  }

  void reduceN(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op) override {
    call("reduceN kernel", true);
    ReduceNFn fn = reduceNFn(dtype, op);
    std::vector<const void*> sources(srcs, srcs + nsrc);
    enqueue([fn, dst, sources = std::move(sources), count] {
      fn(dst, sources.data(), int(sources.size()), count);
    });
  }

  // The kernel's loop (flags_cuda.cu) on the stream's thread, with a pause
  // between passes where a GPU thread would sleep; the stream stopping ends
  // it too, for a device torn down under a wait.
  void waitFlags(const uint32_t* const* words, int n, uint32_t atLeast, const uint32_t* cancel,
                 uint32_t* taint) override {
    call("wait flags kernel", true);
    checkFlagCount(n);
    std::vector<const uint32_t*> list(words, words + n);
    enqueue([this, list = std::move(list), atLeast, cancel, taint] {
      auto load = [&](int i) { return loadFlag(list[size_t(i)]); };
      const int n = int(list.size());
      while (!flags::reached(load, n, atLeast, loadFlag(cancel)) && !stopping()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      if (const uint32_t failed = flags::failureSeen(load, n, loadFlag(cancel))) {
        std::atomic_ref<uint32_t>(*taint).store(failed, std::memory_order_release);
      }
    });
  }

  void signalFlags(uint32_t* const* targets, int n, uint32_t round, const uint32_t* taint) override {
    call("signal flags kernel", true);
    checkFlagCount(n);
    std::vector<uint32_t*> list(targets, targets + n);
    enqueue([list = std::move(list), round, taint] {
      const uint32_t value = flags::signalValue(round, loadFlag(taint));
      for (uint32_t* t : list) std::atomic_ref<uint32_t>(*t).store(value, std::memory_order_release);
    });
  }

  void scale(void* buf, size_t count, DType dtype, double factor) override {
    call("scale kernel", true);
    enqueue([buf, count, dtype, factor] { ringx::scale(buf, count, dtype, factor); });
  }

  void synchronize() override {
    shared_->note("cudaStreamSynchronize", true);
    std::shared_lock<std::shared_mutex> driver(shared_->driver);
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t mark = enqueued_;
    idleCv_.wait(lock, [&] { return finished_ >= mark; });
  }

  bool capturing() override {
    shared_->note("cudaStreamIsCapturing");
    return capturing_;
  }

  std::atomic<bool> capturing_{false};
  bool captureGlobal_ = false;

 private:
  static uint32_t loadFlag(const uint32_t* word) {
    return std::atomic_ref<const uint32_t>(*word).load(std::memory_order_acquire);
  }
  static void checkFlagCount(int n) {
    if (n < 0 || n > flags::kMaxFlags) {
      throw Error(ErrorKind::InvalidArgument, "sim device: a flag wait or signal takes at most " +
                                                  std::to_string(flags::kMaxFlags) + " words, got " +
                                                  std::to_string(n));
    }
  }

  // Work enqueued from the host: a launch (`kernel`) may load the kernels.
  void call(const char* what, bool kernel = false) {
    if (kernel) {
      shared_->launch(what);
    } else {
      shared_->note(what);
    }
    if (capturing_) ++shared_->captured;
  }

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

  Shared shared_;
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
constexpr int kUninitialised = 0xa5;

std::shared_ptr<std::byte> allocFilled(size_t bytes, Shared shared) {
  shared->note("cudaMalloc");
  std::shared_ptr<std::byte> p(new std::byte[bytes ? bytes : 1], [shared = std::move(shared)](std::byte* b) {
    shared->note("cudaFree");
    std::unique_lock<std::shared_mutex> lock(shared->driver);
    delete[] b;
  });
  std::memset(p.get(), kUninitialised, bytes);
  return p;
}

}  // namespace

SimDevice::SimDevice(SimDeviceOptions options)
    : options_(options), shared_(std::make_shared<SimShared>(options.index)) {}

std::unique_ptr<DeviceStream> SimDevice::newStream() {
  shared_->note("cudaStreamCreate");
  return std::make_unique<SimStream>(options_.maxDelayUs, options_.seed * 1000003 + ++streams_, shared_);
}

std::unique_ptr<DeviceEvent> SimDevice::newEvent() { return std::make_unique<SimEvent>(shared_); }

std::shared_ptr<std::byte> SimDevice::allocDevice(size_t bytes) { return allocFilled(bytes, shared_); }

std::shared_ptr<std::byte> SimDevice::allocPinned(size_t bytes) { return allocFilled(bytes, shared_); }

namespace {

// A mapped segment as device memory: unmapped (and, for its creator,
// unlinked) under the driver's lock, as cudaFree and cudaIpcCloseMemHandle
// take it.
std::shared_ptr<std::byte> segmentMemory(std::unique_ptr<ShmSegment> segment, const Shared& shared,
                                         const char* release) {
  std::byte* data = segment->data();
  auto holder = std::make_shared<std::unique_ptr<ShmSegment>>(std::move(segment));
  return std::shared_ptr<std::byte>(data, [holder, shared, release](std::byte*) {
    shared->note(release);
    std::unique_lock<std::shared_mutex> lock(shared->driver);
    holder->reset();
  });
}

}  // namespace

std::shared_ptr<std::byte> SimDevice::allocShared(size_t bytes, IpcHandle& handle) {
  shared_->note("cudaMalloc");
  shared_->note("cudaIpcGetMemHandle");
  if (!allocSharedFailure_.empty()) throw Error(ErrorKind::Internal, name() + ": " + allocSharedFailure_);
  auto segment = ShmSegment::create(bytes, name() + " allocShared");
  if (segment->name().size() >= handle.bytes.size()) {
    throw Error(ErrorKind::Internal, "sim device: segment name " + segment->name() + " too long for a handle");
  }
  handle = IpcHandle{};
  std::memcpy(handle.bytes.data(), segment->name().data(), segment->name().size());
  std::memset(segment->data(), kUninitialised, bytes);
  return segmentMemory(std::move(segment), shared_, "cudaFree");
}

std::shared_ptr<std::byte> SimDevice::openShared(const IpcHandle& handle, size_t bytes) {
  shared_->note("cudaIpcOpenMemHandle");
  const std::string segmentName(handle.bytes.data(), strnlen(handle.bytes.data(), handle.bytes.size()));
  return segmentMemory(ShmSegment::open(segmentName, bytes, name() + " openShared"), shared_,
                       "cudaIpcCloseMemHandle");
}

std::shared_ptr<void> SimDevice::mapHost(void* p, size_t) {
  shared_->note("cudaHostRegister");
  Shared shared = shared_;
  return std::shared_ptr<void>(p, [shared](void*) { shared->note("cudaHostUnregister"); });
}

Device::ThreadState SimDevice::enter() {
  const ThreadState before{currentDevice, captureMode};
  currentDevice = options_.index;
  captureMode = kCaptureThreadLocal;
  return before;
}

void SimDevice::leave(const ThreadState& before) {
  currentDevice = before.device;
  captureMode = before.captureMode;
}

void SimDevice::loadKernels() {
  shared_->note("cudaFuncGetAttributes");
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (!shared_->loadedBy) shared_->loadedBy = std::this_thread::get_id();
}

uint64_t SimDevice::calls() const { return shared_->calls; }
uint64_t SimDevice::offDeviceCalls() const { return shared_->offDevice; }
uint64_t SimDevice::capturedCalls() const { return shared_->captured; }

std::string SimDevice::offDevice() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->firstOffDevice;
}

std::optional<std::thread::id> SimDevice::kernelsLoadedBy() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->loadedBy;
}

bool SimDevice::kernelsLoadedLazily() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->loadedLazily;
}

void SimDevice::beginCapture(DeviceStream& stream, bool global) {
  auto& s = static_cast<SimStream&>(stream);
  s.capturing_ = true;
  s.captureGlobal_ = global;
  if (global) ++globalCaptures;
}

void SimDevice::endCapture(DeviceStream& stream) {
  auto& s = static_cast<SimStream&>(stream);
  if (s.capturing_ && s.captureGlobal_) --globalCaptures;
  s.capturing_ = false;
}

}  // namespace ringx
