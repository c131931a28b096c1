// The ipc path (RINGX_CUDA_PATH=ipc, core/device_paths/ipc_collective.h) in
// the process group: which calls it takes, its set-up at the group's first
// collective that takes it, and the call. Built only for CUDA.
//
// Every rank must send the same call down the same path, or one rank waits
// in shared memory for a peer that runs the call staged (until the timeout,
// naming that peer). So the choice reads only what every rank of a correct
// program shares: the group (one host, at most flags::kMaxFlags + 1 ranks),
// the collective and its shape (coalescing block or not, even all_to_all or
// not), never this rank's tensors or memory.
#include <c10/cuda/CUDAGuard.h>

#include "core/common/log.h"
#include "core/device_paths/ipc_collective.h"
#include "torch/process_group_ringx.hpp"
#include "torch/store_adapter.h"
#include "torch/without_gil.h"

namespace ringx {

namespace {

[[noreturn]] void rethrowForTorch(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::InvalidArgument: throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
    case ErrorKind::Unsupported: throw c10::TypeError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
    default: throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
  }
}

}  // namespace

std::string ProcessGroupRingx::ipcRefusal(const CollArgs& args) const {
  if (!ipcGroupRefusal_.empty()) return ipcGroupRefusal_;
  // One op for the whole block: the block's calls are held and appended,
  // and the ipc path enqueues its device work when called.
  if (held_) return "a coalescing block";
  if (IpcCollective::supports(args)) return {};
  if (args.coll == Collective::AllToAll) return "all_to_all with split sizes";
  if (args.coll == Collective::Barrier) return "barrier";
  return "separate tensors in place";
}

// Collective: every rank gets here at the same collective (the first the
// ipc path takes, the same on every rank), so the exchange through the
// store cannot wait on a rank that went elsewhere.
IpcPeers& ProcessGroupRingx::ipcPeers(const CallContext& c, CudaComm& cc) {
  std::lock_guard<std::mutex> lock(cudaMu_);
  if (!cc.ipc) {
    C10dStoreAdapter adapter(store_);
    try {
      withoutGil([&] { cc.ipc = IpcPeers::create(*cc.device, adapter, storePrefix_, rank_, size_, cudaIpcBytes_); });
    } catch (const std::exception& e) {
      throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)},
                                  c.prefix() + "setting up the ipc path (RINGX_CUDA_PATH=ipc) failed: " + e.what() +
                                      "; unset RINGX_CUDA_PATH to run staged");
    }
    RINGX_LOG(Info, c.prefix() << "the ipc path is set up: " << size_ << " ranks on " << cc.device->name()
                               << " and its peers' devices, " << cudaIpcBytes_ << "-byte buffers");
  }
  return *cc.ipc;
}

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitOnIpc(Call& call, const CollArgs& args,
                                                             std::vector<at::Tensor> keepAlive,
                                                             std::vector<at::Tensor> outputs,
                                                             std::function<void()> publish) {
  c10::cuda::OptionalCUDAGuard guard;
  CudaCall cuda = beginCuda(call, keepAlive, {}, CudaPath::Ipc, &args);
  guard.set_index(cuda.index);
  IpcPeers& peers = ipcPeers(call.ctx, *cuda.comm);
  CudaStream caller(c10::cuda::getCurrentCUDAStream(cuda.index));
  call.bytes = args.bytes();
  std::unique_ptr<IpcCollective> op;
  // Built under submitMu_ with its sequence number: ops enqueue their device
  // work and take their rounds in the order every rank numbers them.
  auto build = [&](uint64_t seq) {
    CollArgs a = args;
    a.seq = seq;
    try {
      op = std::make_unique<IpcCollective>(*cuda.comm->order, caller, peers, a, ipcAlgo_);
    } catch (const Error& e) {
      rethrowForTorch(e);
    }
    RINGX_LOG(Info, call.ctx.prefix() << "algorithm " << op->algorithm() << ", " << a.bytes() << " bytes");
    return op->schedule();
  };
  auto work = submitBuilt(call, build, keepAlive, std::move(outputs), nullptr);
  endCuda(cuda, keepAlive, publish, *work);
  return work;
}

}  // namespace ringx
