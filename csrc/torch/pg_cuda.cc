// Collectives on CUDA tensors: the CollArgs every collective builds, run on
// the host-staged or the device-resident path (core/device_paths/host_staging.h),
// or handed to the ipc path (pg_ipc.cc), with ProcessGroupNCCL's stream
// semantics. Built only for CUDA.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include "core/common/log.h"
#include "torch/process_group_ringx.hpp"

namespace ringx {

namespace {

constexpr size_t kMaxPieces = 8;

// Where a staged in-place collective of `bytes` is cut: pieces of about
// `stage` bytes (element-aligned), at most kMaxPieces; empty for one piece.
std::vector<size_t> pieceCuts(size_t bytes, size_t elementBytes, size_t stage) {
  const size_t n = std::min(kMaxPieces, (bytes + stage - 1) / stage);
  if (n <= 1) return {};
  const size_t each = bytes / elementBytes / n * elementBytes;
  std::vector<size_t> cuts;
  for (size_t k = 0; k < n; ++k) cuts.push_back(k * each);
  cuts.push_back(bytes);
  return cuts;
}

}  // namespace

const char* ProcessGroupRingx::pathName(CudaPath path) {
  switch (path) {
    case CudaPath::Resident: return "device-resident";
    case CudaPath::Ipc: return "ipc";
    case CudaPath::Staged: break;
  }
  return "host-staged";
}

ProcessGroupRingx::CudaComm& ProcessGroupRingx::cudaComm(const CallContext& c, c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(cudaMu_);
  if (!cuda_) {
    CudaComm cc;
    cc.device = std::make_unique<CudaDevice>(index);
    cc.order = std::make_unique<DeviceOrder>(*cc.device);
    cc.compute = cc.device->newStream();
    // Here, on the issuing thread, not lazily at a first launch on the
    // progress thread (Device::loadKernels).
    cc.device->loadKernels();
    RINGX_LOG(Info, "ringx: rank " << rank_ << " runs CUDA tensors on " << cc.device->name() << ", "
                                   << pathName(cudaPath_)
                                   << (cudaPath_ != CudaPath::Ipc ? std::string()
                                       : ipcGroupRefusal_.empty()
                                           ? std::string(" where it applies, host-staged elsewhere")
                                           : " asked for, but every op host-staged: " + ipcGroupRefusal_));
    cuda_ = std::move(cc);
  } else if (cuda_->device->index() != index) {
    throwValueError(c, "this group runs on " + cuda_->device->name() + " in this process, got a tensor on cuda:" +
                           std::to_string(index) + " (one device per process and group, as with NCCL)");
  }
  return *cuda_;
}

// Enqueues the op's ordering (and, staged, its copies) on the order stream:
// `regions` are the tensors' memory; resident, none are copied.
ProcessGroupRingx::CudaCall ProcessGroupRingx::beginCuda(Call& call, const std::vector<at::Tensor>& keepAlive,
                                                         std::vector<DeviceRegion> regions, CudaPath path,
                                                         const CollArgs* args, const std::string& note) {
  CudaCall cuda;
  std::optional<c10::DeviceIndex> index;
  for (const at::Tensor& t : keepAlive) {
    if (!t.defined()) continue;
    if (!t.is_cuda()) throwTypeError(call.ctx, "mixes CPU and CUDA tensors; pass tensors of one device");
    if (index && *index != t.device().index()) {
      throwValueError(call.ctx, "has tensors on cuda:" + std::to_string(*index) + " and " + t.device().str() +
                                    "; pass tensors of one device");
    }
    index = t.device().index();
  }
  cuda.index = *index;
  // An earlier op's failure that no wait() raised (it returned before the
  // op ended) is raised here, as NCCL's async error handling does.
  if (auto failed = comm_->error()) {
    throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)},
                                call.ctx.prefix() + "an earlier collective of this group failed: " + failed->what());
  }
  // Before anything touches a stream: waiting for a capturing stream would
  // make ringx's order stream join the capture.
  CudaStream caller(c10::cuda::getCurrentCUDAStream(cuda.index));
  try {
    refuseCapture(caller, call.ctx.prefix());
  } catch (const Error& e) {
    throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
  }
  cuda.comm = &cudaComm(call.ctx, cuda.index);
  // wait() returns without driving the op (the stream waits, not the host):
  // the progress thread must run it.
  call.callerWaits = call.callerWaits && blockingWait_;
  const bool resident = path == CudaPath::Resident;
  cuda.resident = resident;
  const bool inPlace = args && (args->coll == Collective::AllReduce || args->coll == Collective::Broadcast ||
                                args->coll == Collective::Reduce);
  std::vector<size_t> cuts;
  if (path == CudaPath::Staged && inPlace) cuts = pieceCuts(args->bytes(), dtypeSize(args->dtype), cudaStageBytes_);
  // Resident, the tensors are only ordered against the ops in flight on
  // the same memory, not copied.
  if (resident) {
    for (DeviceRegion& r : regions) r.in = r.out = false;
  }
  // The ipc path orders its op itself (IpcCollective).
  if (path != CudaPath::Ipc) cuda.staging.emplace(*cuda.comm->order, caller, std::move(regions), std::move(cuts));
  RINGX_LOG(Info, call.ctx.prefix() << "CUDA tensors on " << cuda.comm->device->name() << ", " << pathName(path)
                                    << note);
  return cuda;
}

// After the op is submitted: keeps the tensors' memory from being handed
// out again before the streams are done with it, enqueues the copies into
// the user's tensors, and gives the Work its device end.
void ProcessGroupRingx::endCuda(CudaCall& cuda, const std::vector<at::Tensor>& keepAlive,
                                const std::function<void()>& publish, WorkRingx& work) {
  CudaComm& cc = *cuda.comm;
  const auto in = static_cast<CudaStream&>(cc.order->in()).stream();
  const auto out = static_cast<CudaStream&>(cc.order->out()).stream();
  const auto compute = static_cast<CudaStream&>(*cc.compute).stream();
  for (const at::Tensor& t : keepAlive) {
    if (!t.defined() || !t.storage().data_ptr()) continue;
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), in);
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), out);
    if (cuda.resident) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), compute);
  }
  if (publish) {
    c10::cuda::CUDAStreamGuard guard(out);
    publish();
  }
  std::shared_ptr<DeviceEvent> finished = cc.device->newEvent();
  cc.order->out().record(*finished);
  CudaDevice* device = cc.device.get();
  work.onDevice({c10::Device(c10::kCUDA, cuda.index), finished,
                 [device, finished] { device->currentStream().wait(*finished); },
                 [device, finished](const std::function<void()>& fn) {
                   auto stream = device->newStream();
                   stream->wait(*finished);
                   c10::cuda::CUDAStreamGuard guard(static_cast<CudaStream&>(*stream).stream());
                   fn();
                 },
                 blockingWait_, asyncTeardown_});
}

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitOnCuda(Call& call, const CollArgs& args,
                                                              std::vector<at::Tensor> keepAlive,
                                                              std::vector<at::Tensor> outputs,
                                                              std::function<void()> publish) {
  std::string note;
  if (cudaPath_ == CudaPath::Ipc) {
    note = ipcRefusal(args);
    if (note.empty()) return submitOnIpc(call, args, std::move(keepAlive), std::move(outputs), std::move(publish));
    note = " (not ipc: " + note + ")";
  }
  c10::cuda::OptionalCUDAGuard guard;
  const CudaPath path = cudaPath_ == CudaPath::Resident ? CudaPath::Resident : CudaPath::Staged;
  CudaCall cuda = beginCuda(call, keepAlive, regionsOf(args), path, &args, note);
  guard.set_index(cuda.index);
  CollArgs a = args;
  if (cuda.resident) {
    a.device = {cuda.comm->device.get(), cuda.comm->compute.get()};
  } else {
    pointAtHost(a, *cuda.staging);
  }
  auto work = submitArgs(call, a, &*cuda.staging, keepAlive, std::move(outputs), nullptr);
  // Inside a coalescing block the call's Work is held, not returned.
  endCuda(cuda, keepAlive, publish, work ? *work : *held_->back().work);
  return work;
}

// Always host-staged: the schedules built here (send, recv) name no device,
// and the ipc path takes collectives only.
c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitScheduleOnCuda(Call& call, std::vector<DeviceRegion> regions,
                                                                      const RegionBuild& build,
                                                                      std::vector<at::Tensor> keepAlive,
                                                                      std::vector<at::Tensor> outputs,
                                                                      std::function<void()> publish) {
  const size_t n = regions.size();
  c10::cuda::OptionalCUDAGuard guard;
  CudaCall cuda = beginCuda(call, keepAlive, std::move(regions), CudaPath::Staged, nullptr,
                            cudaPath_ == CudaPath::Ipc ? " (not ipc: point-to-point)" : "");
  guard.set_index(cuda.index);
  std::vector<void*> buffers;
  for (size_t i = 0; i < n; ++i) buffers.push_back(cuda.staging->host(i));
  Schedule schedule = cuda.staging->wrap(build(buffers));
  auto work = submitBuilt(
      call, [&](uint64_t) { return std::move(schedule); }, keepAlive, std::move(outputs), nullptr);
  // Inside a coalescing block the call's Work is held, not returned.
  endCuda(cuda, keepAlive, publish, work ? *work : *held_->back().work);
  return work;
}

}  // namespace ringx
