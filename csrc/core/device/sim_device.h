// A device made of host memory and threads, for tests: each stream is a
// worker thread that runs its enqueued work in order, each item after a
// random delay, so the host sees work finish late and in the gaps a real GPU
// leaves. A collective that reads a buffer before the caller's stream wrote
// it, or hands back a buffer the device still writes, gives wrong numbers
// (or a sanitizer report) here instead of only on a GPU.
//
// It also has a GPU driver's lock: a stream's synchronize() holds it shared
// while it waits, as a synchronous copy does, and destroying an event or
// freeing memory takes it exclusively, as cudaEventDestroy did on an H200. A
// thread that must progress an op and frees either while another thread
// waits for that op deadlocks here as it did there.
//
// And a CUDA runtime's per-thread state and its lazy kernel loading:
//   - each thread has a current device (0 until set, as in CUDA) and every
//     call from the host notes whether it ran on the device it was made for,
//     the wrong one being where CUDA would make a stray context;
//   - a stream may be capturing (beginCapture): work enqueued on it is
//     counted as joining the capture, and while a capture in global mode is
//     under way anywhere in the process, event queries and synchronizations
//     from threads in global mode fail, as cudaEventQuery does then;
//   - the ipc path's flag waits spin on the words as a kernel would, and
//     its shared buffers are POSIX shared memory named by the handle;
//   - the first reduce or scale launched before loadKernels() loads the
//     kernels itself, on the launching thread, as CUDA's lazy loading does.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>

#include "core/device/device.h"

namespace ringx {

struct SimDeviceOptions {
  int index = 0;
  // Each enqueued item waits a uniform random time in [0, maxDelayUs] first.
  int maxDelayUs = 200;
  uint64_t seed = 1;
};

struct SimShared;

class SimDevice final : public Device {
 public:
  explicit SimDevice(SimDeviceOptions options = {});

  std::string name() const override { return "sim:" + std::to_string(options_.index); }
  MemoryKind memoryKind() const override { return MemoryKind::Host; }
  std::unique_ptr<DeviceStream> newStream() override;
  std::unique_ptr<DeviceEvent> newEvent() override;
  std::shared_ptr<std::byte> allocDevice(size_t bytes) override;
  std::shared_ptr<std::byte> allocPinned(size_t bytes) override;
  // Device memory in a shared-memory segment, the handle its name: peers
  // map it as another process would (they are threads here, but nothing
  // but the name passes between them).
  std::shared_ptr<std::byte> allocShared(size_t bytes, IpcHandle& handle) override;
  std::shared_ptr<std::byte> openShared(const IpcHandle& handle, size_t bytes) override;
  std::shared_ptr<void> mapHost(void* p, size_t bytes) override;
  ThreadState enter() override;
  void leave(const ThreadState& before) override;
  void loadKernels() override;

  // Calls from the host so far, and those made while another device was the
  // thread's current one (the first of them named in offDevice()).
  uint64_t calls() const;
  uint64_t offDeviceCalls() const;
  std::string offDevice() const;
  // Work enqueued on a stream while it was capturing.
  uint64_t capturedCalls() const;
  // The thread that loaded the kernels, and whether a launch did it lazily.
  std::optional<std::thread::id> kernelsLoadedBy() const;
  bool kernelsLoadedLazily() const;

  // What cudaStreamBeginCapture and cudaStreamEndCapture do to `stream` (one
  // of this device's): `global` as cudaStreamCaptureModeGlobal, else
  // thread-local.
  void beginCapture(DeviceStream& stream, bool global);
  void endCapture(DeviceStream& stream);

  // Every later allocShared throws Error(Internal) saying `why`, as
  // cudaMalloc or cudaIpcGetMemHandle failing would. Called before the
  // threads that allocate start.
  void failAllocShared(std::string why) { allocSharedFailure_ = std::move(why); }

 private:
  SimDeviceOptions options_;
  std::atomic<uint64_t> streams_{0};
  std::shared_ptr<SimShared> shared_;
  std::string allocSharedFailure_;
};

}  // namespace ringx
