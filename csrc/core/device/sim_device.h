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
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>

#include "core/device/device.h"

namespace ringx {

struct SimDeviceOptions {
  int index = 0;
  // Each enqueued item waits a uniform random time in [0, maxDelayUs] first.
  int maxDelayUs = 200;
  uint64_t seed = 1;
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(SimDeviceOptions options = {}) : options_(options) {}

  std::string name() const override { return "sim:" + std::to_string(options_.index); }
  MemoryKind memoryKind() const override { return MemoryKind::Host; }
  std::unique_ptr<DeviceStream> newStream() override;
  std::unique_ptr<DeviceEvent> newEvent() override;
  std::shared_ptr<std::byte> allocDevice(size_t bytes) override;
  std::shared_ptr<std::byte> allocPinned(size_t bytes) override;

 private:
  SimDeviceOptions options_;
  std::atomic<uint64_t> streams_{0};
  std::shared_ptr<std::shared_mutex> driver_ = std::make_shared<std::shared_mutex>();
};

}  // namespace ringx
