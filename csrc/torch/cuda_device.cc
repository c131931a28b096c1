#include "torch/cuda_device.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/common/error.h"
#include "core/reduce/flags_cuda.h"
#include "core/reduce/reduce_cuda.h"

namespace ringx {

namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw Error(ErrorKind::Internal, std::string("ringx: CUDA ") + what + " failed: " + cudaGetErrorString(rc));
  }
}

// The guard for calls that may run on any thread (a query from the progress
// thread or from Work.isCompleted()): the event's device, so that no context
// is made on another, and thread-local capture mode, so that another
// thread's graph capture in global mode does not fail the call.
class ThreadOn {
 public:
  explicit ThreadOn(c10::DeviceIndex index) : device_(index), mode_(cudaStreamCaptureModeThreadLocal) {}

 private:
  c10::cuda::CUDAGuard device_;
  c10::cuda::CUDAStreamCaptureModeGuard mode_;
};

// Events are recycled, never destroyed. cudaEventDestroy waits for a driver
// lock that a thread blocked in a synchronous copy holds (seen on an H200,
// driver 580, in a torch tensor's .cpu() right after a collective), and the
// thread that drops an event may be the one that must progress the op that
// copy waits for. One pool per device, kept for the process's life, so that
// nothing calls into the driver while the process exits either.
class EventPool {
 public:
  static EventPool& of(c10::DeviceIndex index) {
    static std::mutex mu;
    static auto* pools = new std::map<c10::DeviceIndex, EventPool*>;
    std::lock_guard<std::mutex> lock(mu);
    auto& pool = (*pools)[index];
    if (!pool) pool = new EventPool(index);
    return *pool;
  }

  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    c10::cuda::CUDAGuard guard(index_);
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }

  void give(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }

 private:
  explicit EventPool(c10::DeviceIndex index) : index_(index) {}

  c10::DeviceIndex index_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// Every owner records an event before it queries it, so a recycled event's
// earlier recording is never what an owner sees.
class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(c10::DeviceIndex index) : index_(index), pool_(EventPool::of(index)), event_(pool_.take()) {}
  ~CudaEvent() override { pool_.give(event_); }
  bool query() override {
    ThreadOn on(index_);
    cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    check(rc, "cudaEventQuery");
    return true;
  }
  void synchronize() override {
    ThreadOn on(index_);
    check(cudaEventSynchronize(event_), "cudaEventSynchronize");
  }

  cudaEvent_t get() const { return event_; }

 private:
  c10::DeviceIndex index_;
  EventPool& pool_;
  cudaEvent_t event_ = nullptr;
};

// cuStreamWaitValue32 from the driver the runtime loaded: ringx links the
// runtime only, as torch does.
using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WaitValueFn waitValueFn() {
  static WaitValueFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &found),
          "cudaGetDriverEntryPointByVersion(cuStreamWaitValue32)");
    if (found != cudaDriverEntryPointSuccess || !p) {
      throw Error(ErrorKind::Unsupported,
                  "ringx: this CUDA driver has no cuStreamWaitValue32, which CUDA collectives need");
    }
    return reinterpret_cast<WaitValueFn>(p);
  }();
  return fn;
}

}  // namespace

void CudaStream::record(DeviceEvent& event) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  check(cudaEventRecord(static_cast<CudaEvent&>(event).get(), stream_.stream()), "cudaEventRecord");
}

void CudaStream::wait(DeviceEvent& event) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  check(cudaStreamWaitEvent(stream_.stream(), static_cast<CudaEvent&>(event).get(), 0), "cudaStreamWaitEvent");
}

namespace {

// A flag in page-locked host memory, as the device addresses it.
void* flagOnDevice(const uint32_t* flag) {
  void* onDevice = nullptr;
  check(cudaHostGetDevicePointer(&onDevice, const_cast<uint32_t*>(flag), 0), "cudaHostGetDevicePointer");
  return onDevice;
}

}  // namespace

void CudaStream::waitFlag(const uint32_t* flag, uint32_t atLeast) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  void* onDevice = flagOnDevice(flag);
  CUresult rc = waitValueFn()(reinterpret_cast<CUstream>(stream_.stream()), reinterpret_cast<CUdeviceptr>(onDevice),
                              atLeast, CU_STREAM_WAIT_VALUE_GEQ);
  if (rc != CUDA_SUCCESS) {
    throw Error(ErrorKind::Internal, "ringx: cuStreamWaitValue32 failed with CUresult " + std::to_string(int(rc)));
  }
}

void CudaStream::copy(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  c10::cuda::CUDAGuard guard(stream_.device_index());
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_.stream()), "cudaMemcpyAsync");
}

void CudaStream::copyUnlessFailed(void* dst, const void* src, size_t bytes, const uint32_t* flag) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  copyUnlessFailedCuda(dst, src, bytes, static_cast<const uint32_t*>(flagOnDevice(flag)), kFlagFailed,
                       stream_.stream());
}

void CudaStream::reduce(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  reduceCuda(dst, src, count, dtype, op, stream_.stream());
}

void CudaStream::reduceN(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  reduceNCuda(dst, srcs, nsrc, count, dtype, op, stream_.stream());
}

namespace {

// The device addresses of host flag words, for the flag kernels.
template <class T>
std::vector<T*> flagsOnDevice(T* const* words, int n) {
  std::vector<T*> out;
  for (int i = 0; i < n; ++i) out.push_back(static_cast<T*>(flagOnDevice(words[i])));
  return out;
}

}  // namespace

void CudaStream::waitFlags(const uint32_t* const* flags, int n, uint32_t atLeast, const uint32_t* cancel,
                           uint32_t* taint) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  const auto words = flagsOnDevice(flags, n);
  waitFlagsCuda(words.data(), n, atLeast, static_cast<const uint32_t*>(flagOnDevice(cancel)),
                static_cast<uint32_t*>(flagOnDevice(taint)), stream_.stream());
}

void CudaStream::signalFlags(uint32_t* const* targets, int n, uint32_t round, const uint32_t* taint) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  const auto words = flagsOnDevice(targets, n);
  signalFlagsCuda(words.data(), n, round, static_cast<const uint32_t*>(flagOnDevice(taint)), stream_.stream());
}

void CudaStream::scale(void* buf, size_t count, DType dtype, double factor) {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  scaleCuda(buf, count, dtype, factor, stream_.stream());
}

void CudaStream::synchronize() {
  ThreadOn on(stream_.device_index());
  check(cudaStreamSynchronize(stream_.stream()), "cudaStreamSynchronize");
}

bool CudaStream::capturing() {
  c10::cuda::CUDAGuard guard(stream_.device_index());
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t rc = cudaStreamIsCapturing(stream_.stream(), &status);
  // The legacy default stream while another thread captures in global mode.
  if (rc == cudaErrorStreamCaptureImplicit) {
    (void)cudaGetLastError();
    return true;
  }
  check(rc, "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

std::unique_ptr<DeviceStream> CudaDevice::newStream() {
  return std::make_unique<CudaStream>(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, index_));
}

std::unique_ptr<DeviceEvent> CudaDevice::newEvent() { return std::make_unique<CudaEvent>(index_); }

std::shared_ptr<std::byte> CudaDevice::allocDevice(size_t bytes) {
  c10::cuda::CUDAGuard guard(index_);
  auto data = std::make_shared<c10::DataPtr>(c10::cuda::CUDACachingAllocator::get()->allocate(bytes));
  return std::shared_ptr<std::byte>(data, static_cast<std::byte*>(data->get()));
}

std::shared_ptr<std::byte> CudaDevice::allocPinned(size_t bytes) {
  // Page-locking is done in the current device's context.
  c10::cuda::CUDAGuard guard(index_);
  auto data = std::make_shared<c10::DataPtr>(at::getHostAllocator(at::kCUDA)->allocate(bytes));
  return std::shared_ptr<std::byte>(data, static_cast<std::byte*>(data->get()));
}

static_assert(sizeof(cudaIpcMemHandle_t) <= sizeof(IpcHandle::bytes));

std::shared_ptr<std::byte> CudaDevice::allocShared(size_t bytes, IpcHandle& handle) {
  c10::cuda::CUDAGuard guard(index_);
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc (ipc buffer)");
  cudaIpcMemHandle_t h{};
  const cudaError_t rc = cudaIpcGetMemHandle(&h, p);
  if (rc != cudaSuccess) {
    C10_CUDA_CHECK_WARN(cudaFree(p));
    check(rc, "cudaIpcGetMemHandle");
  }
  handle = IpcHandle{};
  std::memcpy(handle.bytes.data(), &h, sizeof h);
  const c10::DeviceIndex index = index_;
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [index](std::byte* b) {
    c10::cuda::CUDAGuard guard(index);
    C10_CUDA_CHECK_WARN(cudaFree(b));
  });
}

std::shared_ptr<std::byte> CudaDevice::openShared(const IpcHandle& handle, size_t) {
  c10::cuda::CUDAGuard guard(index_);
  cudaIpcMemHandle_t h{};
  std::memcpy(&h, handle.bytes.data(), sizeof h);
  void* p = nullptr;
  check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  const c10::DeviceIndex index = index_;
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [index](std::byte* b) {
    c10::cuda::CUDAGuard guard(index);
    C10_CUDA_CHECK_WARN(cudaIpcCloseMemHandle(b));
  });
}

std::shared_ptr<void> CudaDevice::mapHost(void* p, size_t bytes) {
  c10::cuda::CUDAGuard guard(index_);
  check(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable), "cudaHostRegister");
  const c10::DeviceIndex index = index_;
  return std::shared_ptr<void>(p, [index](void* q) {
    c10::cuda::CUDAGuard guard(index);
    C10_CUDA_CHECK_WARN(cudaHostUnregister(q));
  });
}

CudaStream CudaDevice::currentStream() const { return CudaStream(c10::cuda::getCurrentCUDAStream(index_)); }

Device::ThreadState CudaDevice::enter() {
  ThreadState before;
  before.device = c10::cuda::ExchangeDevice(index_);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
  before.captureMode = int(mode);
  return before;
}

// As c10's CUDAGuard restores: MaybeSetDevice makes no context on a device
// that has none (a thread that never used device 0 is not moved back there).
void CudaDevice::leave(const ThreadState& before) {
  auto mode = cudaStreamCaptureMode(before.captureMode);
  C10_CUDA_CHECK_WARN(cudaThreadExchangeStreamCaptureMode(&mode));
  C10_CUDA_CHECK_WARN(c10::cuda::MaybeSetDevice(c10::DeviceIndex(before.device)));
}

void CudaDevice::loadKernels() {
  std::call_once(kernelsLoaded_, [this] {
    c10::cuda::CUDAGuard guard(index_);
    loadCudaKernels();
  });
}

}  // namespace ringx
