// ringx as a c10d::Backend.
//
// Execution model. Every collective call runs on the caller's thread only as
// far as validating its arguments, choosing an algorithm and emitting the
// algorithm's schedule; it then submits the schedule to this group's
// Communicator and returns a WorkRingx at once. The communicator's progress
// thread drives the schedule over UCX; the Work completes as described in
// work.hpp.
//
// Why tags line up across ranks: collectives are numbered by a per-group
// sequence counter that every rank advances identically, because torch
// requires all ranks of a group to issue the same collectives in the same
// order. Each message of a collective is tagged (seq, index within the
// schedule), with the sender's rank in the tag, so concurrent collectives and
// segments never match each other's messages. Point-to-point messages carry
// the user's tag instead (and a bit that keeps them apart from collectives):
// between two ranks, equal tags match in the order they were sent.
//
// Coalescing (startCoalescing ... endCoalescing, what torch's
// _coalescing_manager(device=...) and batch_isend_irecv call): the calls in
// between are checked and numbered as usual, but their schedules are held
// back and the calls return no Work; endCoalescing appends them into one
// schedule, submits it as one op and returns its Work, which completes once
// every call's outputs are in place.
//
// Profiling: each call's Work opens a torch profiler record named
// "ringx:<name>" whose inputs are the tensors the user passed in, with the
// names and inputs ProcessGroupGloo records for the same call.
//
// The methods are spread over files by kind: reductions
// (pg_reductions.cc), sparse all_reduce (pg_sparse.cc), data movement
// (pg_data_movement.cc), point-to-point (pg_p2p.cc), coalescing
// (pg_coalescing.cc), shrinking (pg_shrink.cc) and synchronisation plus
// plumbing (process_group_ringx.cc).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <exception>
#include <mutex>
#include <memory>
#include <optional>
#include <tuple>

#include "core/algorithms/coll_args.h"
#include "core/algorithms/host_layout.h"
#include "core/common/topology.h"
#include "core/engine/communicator.h"
#include "core/select/select.h"
#include "core/transport/shm/cma.h"
#include "core/transport/shm/shm_area.h"
#include "core/device_paths/host_staging.h"
#include "core/device_paths/ipc_cost.h"
#include "core/device_paths/ipc_peers.h"
#include "torch/tensor_args.h"
#include "torch/work.hpp"
#ifdef RINGX_WITH_CUDA
#include "torch/cuda_device.h"
#endif

namespace ringx {

class ProcessGroupRingx : public c10d::Backend {
 public:
  ProcessGroupRingx(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout);
  // The group of `ranks` (ranks of `parent`) that shrink() builds: over
  // `transport`, the subset of the parent's connections, with the parent's
  // shared-memory areas and settings re-indexed, and no store (pg_shrink.cc).
  ProcessGroupRingx(const ProcessGroupRingx& parent, std::unique_ptr<Transport> transport,
                    const std::vector<int>& ranks, std::chrono::milliseconds timeout);
  ~ProcessGroupRingx() override;

  const std::string getBackendName() const override { return "ringx"; }

  // ProcessGroup.split_group: a new ringx group over `ranks` (ranks of this
  // group) on the store torch prepared for it; ranks outside it get nullptr.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  // dist.shrink_group: a new ringx group over the ranks not excluded, built
  // over this group's connections without its store (pg_shrink.cc). This
  // group stops: its ops fail, and it can only be destroyed; what the new
  // group shares with it (UCX worker and endpoints, shared-memory segments)
  // lasts as long as either does.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude, int flags = 0,
                                           const c10::intrusive_ptr<Options>& opts = nullptr) override;
  // A store for a shrunk group's later subgroups (null for others), served
  // by its first rank: alive as long as a survivor's group is, unlike the
  // parent's, which an excluded rank may have taken with it. The group
  // itself was built without it.
  c10::intrusive_ptr<c10d::Store> bootstrapStore() const { return bootstrapStore_; }

  // Reductions.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;

  // Data movement.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;

  // Point-to-point.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // Coalescing.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // Synchronisation and lifetime.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  // Backend.set_timeout, which ringx's wrapper of torch's _set_pg_timeout
  // calls: later calls without a timeout of their own take it, from whichever
  // thread they come.
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_.store(timeout); }
  void abort() override;
  void shutdown() override;
  c10d::ErrorType getError() override;

 private:
  // What a reducing collective reduces: dtype, op and PREMUL_SUM factor.
  using Reduction = std::tuple<DType, ReduceOp, double>;
  // Builds a schedule over the buffers it is given (submitSchedule).
  using RegionBuild = std::function<Schedule(const std::vector<void*>& buffers)>;

  struct Call {
    CallContext ctx;
    c10d::OpType type;
    std::chrono::milliseconds timeout;
    std::atomic<uint64_t>* numbering;  // seq_ or p2pSeq_
    // The profiler record: "ringx:" + title (none when empty) over the
    // user's input tensors, as ProcessGroupGloo records the same call.
    std::string title;
    std::vector<at::Tensor> recorded;
    // What a reducing collective reduces; one op reduces one way only, so
    // coalesced reductions must agree on it. Set from the call's arguments,
    // not its schedule, so that every rank decides alike (a tree's leaves
    // never reduce).
    std::optional<Reduction> reduction;
    // The payload, when known: a small one may run inline in submit.
    size_t bytes = SIZE_MAX;
    // torch's async_op=False: the caller waits on the Work at once.
    bool callerWaits = false;
    // Set while a coalescing block is open: a call that raises then ends
    // the block as its exception unwinds (endBlockEarly).
    ProcessGroupRingx* coalescing = nullptr;
    int uncaught = std::uncaught_exceptions();
    // The algorithm chosen for the call's arguments to see whether it takes
    // separate blocks in place (inPlaceAlgorithm); submit does not choose again.
    const Algorithm* algorithm = nullptr;
    ~Call() {
      if (coalescing && std::uncaught_exceptions() > uncaught) coalescing->endBlockEarly();
    }
  };

  // A call's schedule held back between startCoalescing and endCoalescing.
  struct Held {
    c10::intrusive_ptr<WorkRingx> work;
    std::unique_ptr<Op> op;
    std::optional<Reduction> reduction;
  };

  // A collective call. Its sequence number is taken only when it is
  // submitted, so a call rejected for bad input on every rank leaves the
  // ranks' numbering (and so their message tags) in step; ctx.seq is the
  // number it would get, for messages until then.
  Call begin(const char* op, c10d::OpType type, std::chrono::milliseconds timeout, bool asyncOp);
  // A point-to-point call: numbered on its own, since ranks issue different
  // point-to-point traffic.
  Call beginP2P(const char* op, c10d::OpType type);
  // Selects the algorithm for `args` and submits its schedule. Returns the
  // call's Work, or none while coalescing (the Work of endCoalescing covers
  // the call).
  c10::intrusive_ptr<WorkRingx> submit(Call& call, const CollArgs& args, std::vector<at::Tensor> keepAlive,
                                       std::vector<at::Tensor> outputs, std::function<void()> publish);
  // submit() once the buffers are what the schedule works on: with
  // `staging`, its schedule runs inside the device ordering (host_staging.h).
  c10::intrusive_ptr<WorkRingx> submitArgs(Call& call, const CollArgs& args, const HostStaging* staging,
                                           std::vector<at::Tensor> keepAlive, std::vector<at::Tensor> outputs,
                                           std::function<void()> publish);
  // Refuses CUDA tensors where the call has no device path.
  void checkHostOnly(const CallContext& c, const std::vector<at::Tensor>& tensors) const;
#ifdef RINGX_WITH_CUDA
  // How collectives on CUDA tensors move data (RINGX_CUDA_PATH).
  enum class CudaPath { Staged, Resident, Ipc };
  static const char* pathName(CudaPath path);
  // Collectives on CUDA tensors (pg_cuda.cc).
  c10::intrusive_ptr<WorkRingx> submitOnCuda(Call& call, const CollArgs& args, std::vector<at::Tensor> keepAlive,
                                             std::vector<at::Tensor> outputs, std::function<void()> publish);
  c10::intrusive_ptr<WorkRingx> submitScheduleOnCuda(Call& call, std::vector<DeviceRegion> regions,
                                                     const RegionBuild& build, std::vector<at::Tensor> keepAlive,
                                                     std::vector<at::Tensor> outputs, std::function<void()> publish);
  // The ipc path (pg_ipc.cc): why `args` runs staged instead (empty when
  // the ipc path takes it), and the call on that path.
  std::string ipcRefusal(const CollArgs& args) const;
  c10::intrusive_ptr<WorkRingx> submitOnIpc(Call& call, const CollArgs& args, std::vector<at::Tensor> keepAlive,
                                            std::vector<at::Tensor> outputs, std::function<void()> publish);
  struct CudaComm;
  IpcPeers& ipcPeers(const CallContext& c, CudaComm& cc);
  // A call on CUDA tensors between beginCuda and endCuda.
  struct CudaCall {
    CudaComm* comm = nullptr;
    c10::DeviceIndex index = -1;
    bool resident = false;
    std::optional<HostStaging> staging;  // none on the ipc path
  };
  // `note` follows the path's name in the INFO log (why the ipc path was
  // not taken).
  CudaCall beginCuda(Call& call, const std::vector<at::Tensor>& keepAlive, std::vector<DeviceRegion> regions,
                     CudaPath path, const CollArgs* args = nullptr, const std::string& note = "");
  void endCuda(CudaCall& cuda, const std::vector<at::Tensor>& keepAlive, const std::function<void()>& publish,
               WorkRingx& work);
  struct CudaComm {
    std::unique_ptr<CudaDevice> device;
    std::unique_ptr<DeviceOrder> order;     // the ops' ordering and, staged, their copies
    std::unique_ptr<DeviceStream> compute;  // device-resident reduce, copy and scale steps
    // The ipc path's buffers and flags, set up at the group's first
    // collective that takes it; destroyed before the device.
    std::unique_ptr<IpcPeers> ipc;
  };
  CudaComm& cudaComm(const CallContext& c, c10::DeviceIndex index);
  std::mutex cudaMu_;
  std::optional<CudaComm> cuda_;
  CudaPath cudaPath_ = CudaPath::Staged;
  // Why a group that asked for the ipc path runs every op staged (its ranks
  // span hosts, or are too many); empty otherwise.
  std::string ipcGroupRefusal_;
  size_t cudaIpcBytes_ = 0;
  std::optional<IpcAlgo> ipcAlgo_;  // RINGX_IPC_ALGO; unset: the cost model
  // The ipc set-up exchanges handles through the store at the group's first
  // collective on CUDA tensors, when the device is known (a group need not
  // name its device when built), as ProcessGroupNCCL keeps its store to
  // create communicators lazily. storePrefix_ is the group's key prefix.
  c10::intrusive_ptr<c10d::Store> store_;
  std::string storePrefix_;
  size_t cudaStageBytes_ = 0;
  bool blockingWait_ = false;
  bool asyncTeardown_ = false;  // RINGX_ASYNC_ERROR_HANDLING=teardown
#endif
  // A schedule of the caller's own over `regions`, the tensors' memory it
  // reads and writes: `build` gets the pointers to use in their place (the
  // same on the CPU, page-locked copies for CUDA tensors).
  c10::intrusive_ptr<WorkRingx> submitSchedule(Call& call, std::vector<DeviceRegion> regions, const RegionBuild& build,
                                               std::vector<at::Tensor> keepAlive, std::vector<at::Tensor> outputs,
                                               std::function<void()> publish);
  // Numbers the call, builds its schedule for that number and hands it to
  // the communicator, all under submitMu_: sequence numbers, shared-memory
  // chunk ids and the communicator's queue then follow one order even when
  // several threads issue collectives on this group.
  c10::intrusive_ptr<WorkRingx> submitBuilt(Call& call, const std::function<Schedule(uint64_t seq)>& build,
                                            std::vector<at::Tensor> keepAlive, std::vector<at::Tensor> outputs,
                                            std::function<void()> publish, uint64_t seqs = 1);
  // Runs argument checks that only this rank makes (a root's lists). If one
  // throws, the call still takes its sequence number, so the ranks'
  // numbering stays aligned, and the group is poisoned on this rank with the
  // error; the ranks that exchange data with this one in that call are told
  // and fail too (core/algorithms/identity.h: buildRejection). Then the
  // check's exception propagates.
  c10::intrusive_ptr<WorkRingx> submitRecv(Call& call, const at::Tensor& t, int srcRank, int tag);
  void checkOnThisRankOnly(Call& call, Collective coll, int root, const std::function<void()>& check);
  CollArgs argsFor(const Call& call, Collective coll) const;
  // Sets args.blocks to the addresses of `ts` (one block each) when they are
  // separate CPU tensors, none overlapping another or `other`, and the
  // algorithm chosen for `args` reads or writes them in place: then no
  // staging buffer is packed or unpacked, and call.algorithm is that
  // algorithm. Otherwise false, args unchanged.
  bool takeBlocksInPlace(Call& call, CollArgs& args, const std::vector<at::Tensor>& ts,
                         const at::Tensor& other) const;
  // The algorithm chosen for `args` when it reads or writes separate blocks
  // in place (takesSeparateBlocks), else null.
  const Algorithm* inPlaceAlgorithm(const CollArgs& args) const;
  // Submits a call whose output is `targets`, one block of `args` each, the
  // input being `src`: written straight into them when they are row views of
  // one tensor or a single copy writes them in place, else into a buffer
  // unpacked into them once the call is done.
  c10::intrusive_ptr<c10d::Work> submitIntoList(Call& call, CollArgs& args, const std::vector<at::Tensor>& targets,
                                                const at::Tensor& src, std::vector<at::Tensor> keep);
  // Throws when a reduction may not join the open coalescing block.
  void checkCoalescible(const Call& call) const;
  // Holds a call's op back for endCoalescing.
  void hold(Call& call, c10::intrusive_ptr<WorkRingx> work, std::unique_ptr<Op> op);
  // A call raised inside an open coalescing block. torch's
  // _coalescing_manager does not end a block that its body leaves by an
  // exception, so nothing would ever submit the calls held so far: they are
  // submitted now, as one op, as if the block had ended before the raising
  // call (every rank that raised alike stays in step). Later calls run on
  // their own; endCoalescing, if it still comes, returns that op's Work.
  void endBlockEarly();
  // The held calls as one op, submitted; its Work covers them all. If the
  // group refuses it, their Works fail too and DistBackendError is thrown.
  c10::intrusive_ptr<WorkRingx> submitHeld(std::vector<Held> held);
  // submitHeld for a block nobody will wait on: a refusal (the group is shut
  // down or poisoned) is already in the held Works, and gives no Work.
  c10::intrusive_ptr<WorkRingx> submitHeldQuietly(std::vector<Held> held);
  // all_reduce(SUM) of a sparse COO tensor: the ranks' indices and values
  // gathered and coalesced, as gloo does, all of it in the background.
  c10::intrusive_ptr<c10d::Work> allreduceSparse(at::Tensor& t, const c10d::AllreduceOptions& opts);
  CollArgs allToAllArgs(const Call& call, const at::Tensor& src, const at::Tensor& dst,
                        const std::vector<int64_t>& outputSplitSizes,
                        const std::vector<int64_t>& inputSplitSizes) const;
  std::chrono::milliseconds timeoutFor(std::chrono::milliseconds requested) const;
  // "ringx: rank r/n up (<phases>) ...", at INFO.
  void logUp(const std::string& phases) const;

  // Declared before comm_ so that they outlive the progress thread. shm_
  // when every rank is on this host; hostShm_ (this host's ranks only) when
  // the group spans hosts with the same number of ranks on each.
  std::unique_ptr<ShmArea> shm_;
  std::unique_ptr<ShmArea> hostShm_;
  std::unique_ptr<Cma> cma_;
  // Which ranks share a host (learnt once, at creation).
  Topology topology_;
  // For the hierarchical algorithms; hosts == 0 where they do not apply.
  HostLayout hostLayout_;
  // Shared with the Works, whose wait() drives it.
  std::shared_ptr<Communicator> comm_;
  std::atomic<std::chrono::milliseconds> timeout_;
  std::mutex submitMu_;
  // Settings read once, when the group is built (the ranks agreed on them).
  size_t segmentBytes_ = 0;
  AlgoOverride algo_{""};
  SelectionMemo selection_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> p2pSeq_{0};
  // Set between startCoalescing and endCoalescing: the calls held back.
  std::optional<std::vector<Held>> held_;
  // The Work of a block that a raising call ended early, for endCoalescing
  // (none if the group refused it).
  std::optional<c10::intrusive_ptr<WorkRingx>> ended_;

  // torch calls split once per device type this backend serves (cpu and
  // cuda), with the same store: the second call gets the group the first
  // built instead of a second communicator. Two communicators per group
  // cost a UCX context and threads each, and failed to connect in about one
  // run in four of the split tests (UCX "ep_create failed"). Holding the
  // store keeps its address from being reused by a later split.
  std::mutex splitMu_;
  c10::intrusive_ptr<c10d::Store> lastSplitStore_;
  std::vector<int> lastSplitRanks_;
  c10::weak_intrusive_ptr<c10d::Backend> lastSplit_{c10::intrusive_ptr<c10d::Backend>()};

  // Shrink: the connections the communicator handed over (kept so that a
  // failed shrink can be retried; handed on to the group a shrink built),
  // the attempts so far (each exchanges under a tag of its own), whether a
  // shrink built a group and, in a shrunk group, its subgroups' store.
  std::mutex shrinkMu_;
  std::unique_ptr<Transport> shrinkTransport_;
  uint64_t shrinkAttempts_ = 0;
  bool shrunk_ = false;
  c10::intrusive_ptr<c10d::Store> bootstrapStore_;
};

}  // namespace ringx
