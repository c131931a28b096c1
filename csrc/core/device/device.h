// What the core needs from an accelerator, and nothing of torch: streams that
// run enqueued work in order, events that say when a stream got somewhere,
// asynchronous copies and the reduce and scale launches, and memory. CUDA
// implements it for GPUs (cuda_device.cc) and SimDevice (sim_device.h) on
// the CPU, so that the ordering the engine relies on is tested without one.
//
// Every call that takes a stream only enqueues: it returns before the work
// runs. Nothing here blocks except synchronize().
//
// A device runtime keeps state per thread: the current device (CUDA's starts
// at 0, and a thread's first call makes a context there) and the graph-capture
// mode. Every call into a device is made inside an OnDevice guard for it, on
// whichever thread: the caller's, the progress thread, the callback pool.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "core/common/types.h"
#include "core/reduce/flags.h"

namespace ringx {

class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Whether the work enqueued before the last record() has finished; true
  // for an event never recorded, as in CUDA. Never blocks: the progress
  // thread polls it.
  virtual bool query() = 0;
  virtual void synchronize() = 0;

  // Blocks the calling thread until the event fires (true) or `until` passes
  // (false): a device op's Work.wait(timeout), which blocks the host as
  // NCCL's does. A deadline is kept by polling, since synchronize() takes
  // none.
  bool waitUntil(std::optional<std::chrono::steady_clock::time_point> until) {
    if (!until) {
      synchronize();
      return true;
    }
    while (!query()) {
      if (std::chrono::steady_clock::now() >= *until) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return true;
  }
};

// A host flag a stream waits on (DeviceStream::waitFlag) counts pieces of an
// op done; this bit says the op failed. It compares above every count, so
// it also lets the stream past its waits.
inline constexpr uint32_t kFlagFailed = flags::kFailed;

// What a process on this host needs to map a buffer of another process's
// device (Device::allocShared): CUDA's cudaIpcMemHandle_t, the simulated
// device's segment name. Plain bytes, published through the store.
struct IpcHandle {
  std::array<char, 64> bytes{};
};

class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  virtual void record(DeviceEvent& event) = 0;
  // Later work on this stream waits for `event` as last recorded.
  virtual void wait(DeviceEvent& event) = 0;
  // Later work on this stream waits until the host sets *flag to `atLeast`
  // or more: how a stream waits for a schedule the host runs, enqueued when
  // the collective is issued so that neither the caller nor a later wait()
  // blocks the host. `flag` lies in memory from Device::allocPinned().
  virtual void waitFlag(const uint32_t* flag, uint32_t atLeast) = 0;
  // Host or device memory, either way.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Device to device, unless *flag (as waitFlag's) has kFlagFailed set when
  // the stream gets there: the device decides, since the host enqueued the
  // copy long before it knew.
  virtual void copyUnlessFailed(void* dst, const void* src, size_t bytes, const uint32_t* flag) = 0;
  // reduce.h's semantics, on device memory.
  virtual void reduce(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) = 0;
  // reduceNFn's, one kernel reading every source (peers' mapped buffers
  // among them); `srcs` is read before the call returns.
  virtual void reduceN(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op) = 0;
  // The ipc path's flags (core/reduce/flags.h), all in memory from
  // allocPinned() or mapHost(), at most flags::kMaxFlags of them.
  // waitFlags: later work waits until every *flags[i] >= atLeast, or until
  // *cancel has kFlagFailed (the host sets it when the op fails, so that no
  // wait outlives the op); then *taint gets kFlagFailed if any of them had
  // it. signalFlags: once the stream's earlier writes are visible to the
  // whole system (other devices, the host), writes flags::signalValue(round,
  // *taint) to each target.
  virtual void waitFlags(const uint32_t* const* flags, int n, uint32_t atLeast, const uint32_t* cancel,
                         uint32_t* taint) = 0;
  virtual void signalFlags(uint32_t* const* targets, int n, uint32_t round, const uint32_t* taint) = 0;
  virtual void scale(void* buf, size_t count, DType dtype, double factor) = 0;
  virtual void synchronize() = 0;
  // Whether the stream is capturing a graph: work enqueued on it (or on a
  // stream that waits for an event recorded on it) joins the capture instead
  // of running.
  virtual bool capturing() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // For messages: "cuda:0", "sim:1".
  virtual std::string name() const = 0;
  // What the transport is told device buffers are: Cuda for a GPU, Host
  // for the simulated device, whose memory is the host's.
  virtual MemoryKind memoryKind() const = 0;
  virtual std::unique_ptr<DeviceStream> newStream() = 0;
  virtual std::unique_ptr<DeviceEvent> newEvent() = 0;
  virtual std::shared_ptr<std::byte> allocDevice(size_t bytes) = 0;
  // Page-locked host memory the device copies to and from asynchronously
  // and can read a flag in (waitFlag).
  virtual std::shared_ptr<std::byte> allocPinned(size_t bytes) = 0;
  // Device memory that processes on this host map through `handle`
  // (openShared), for the ipc path's buffer per rank; it is ringx's own, not
  // an allocator's block, so the handle names exactly it.
  virtual std::shared_ptr<std::byte> allocShared(size_t bytes, IpcHandle& handle) = 0;
  // A peer's allocShared buffer, mapped into this process for this device's
  // streams, until the pointer goes.
  virtual std::shared_ptr<std::byte> openShared(const IpcHandle& handle, size_t bytes) = 0;
  // Makes host memory (a shared-memory segment) usable by this device's
  // flag operations, until the returned guard goes.
  virtual std::shared_ptr<void> mapHost(void* p, size_t bytes) = 0;

  // The calling thread's runtime state, as enter() found it.
  struct ThreadState {
    int device = 0;
    int captureMode = 0;
  };
  // Makes this device the calling thread's current one and its graph-capture
  // mode thread-local (so that another thread's capture does not fail its
  // event queries); leave() restores what enter() returned, without making a
  // context on a device the thread never used. Through OnDevice only.
  virtual ThreadState enter() = 0;
  virtual void leave(const ThreadState& before) = 0;
  // Loads every kernel ringx launches on this device, on the calling thread.
  // A runtime that loads kernels lazily would otherwise do it at the first
  // launch, on the thread that progresses the op, while a stream may be
  // waiting on a flag only that thread sets. Idempotent.
  virtual void loadKernels() = 0;
};

// The calling thread runs on `device` (null: nothing) until this goes.
class OnDevice {
 public:
  explicit OnDevice(Device* device) : device_(device) {
    if (device_) before_ = device_->enter();
  }
  ~OnDevice() {
    if (device_) device_->leave(before_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  Device* device_;
  Device::ThreadState before_;
};

// Where a device-resident schedule runs its reduce, copy and scale steps.
struct DeviceQueue {
  Device* device = nullptr;
  DeviceStream* stream = nullptr;
  explicit operator bool() const { return stream != nullptr; }
};

}  // namespace ringx
