// The core's device interface (core/device/device.h) on a CUDA GPU, through
// torch's own streams and caching allocators, so that ringx's memory is
// torch's and its streams are ones torch code can wait on. Built only when
// ringx is built for CUDA (RINGX_CUDA).
#pragma once

#include <c10/cuda/CUDAStream.h>

#include <mutex>

#include "core/device/device.h"

namespace ringx {

class CudaStream final : public DeviceStream {
 public:
  explicit CudaStream(c10::cuda::CUDAStream stream) : stream_(stream) {}

  void record(DeviceEvent& event) override;
  void wait(DeviceEvent& event) override;
  void waitFlag(const uint32_t* flag, uint32_t atLeast) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void copyUnlessFailed(void* dst, const void* src, size_t bytes, const uint32_t* flag) override;
  void reduce(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) override;
  void reduceN(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op) override;
  void waitFlags(const uint32_t* const* flags, int n, uint32_t atLeast, const uint32_t* cancel,
                 uint32_t* taint) override;
  void signalFlags(uint32_t* const* targets, int n, uint32_t round, const uint32_t* taint) override;
  void scale(void* buf, size_t count, DType dtype, double factor) override;
  void synchronize() override;
  bool capturing() override;

  c10::cuda::CUDAStream stream() const { return stream_; }

 private:
  c10::cuda::CUDAStream stream_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(c10::DeviceIndex index) : index_(index) {}

  std::string name() const override { return "cuda:" + std::to_string(index_); }
  MemoryKind memoryKind() const override { return MemoryKind::Cuda; }
  // A stream of torch's pool: the communicator's.
  std::unique_ptr<DeviceStream> newStream() override;
  std::unique_ptr<DeviceEvent> newEvent() override;
  std::shared_ptr<std::byte> allocDevice(size_t bytes) override;
  std::shared_ptr<std::byte> allocPinned(size_t bytes) override;
  // cudaMalloc'd (not the caching allocator's: a handle names a whole
  // allocation, and torch's blocks are pieces of larger ones, expandable
  // segments included), exported with cudaIpcGetMemHandle.
  std::shared_ptr<std::byte> allocShared(size_t bytes, IpcHandle& handle) override;
  std::shared_ptr<std::byte> openShared(const IpcHandle& handle, size_t bytes) override;
  // cudaHostRegister, mapped and portable.
  std::shared_ptr<void> mapHost(void* p, size_t bytes) override;
  ThreadState enter() override;
  void leave(const ThreadState& before) override;
  void loadKernels() override;

  // The calling thread's current stream on this device, as torch sees it.
  CudaStream currentStream() const;
  c10::DeviceIndex index() const { return index_; }

 private:
  c10::DeviceIndex index_;
  std::once_flag kernelsLoaded_;
};

}  // namespace ringx
