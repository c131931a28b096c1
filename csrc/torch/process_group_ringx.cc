#include "torch/process_group_ringx.hpp"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iomanip>
#include <sstream>

#include <sched.h>
#include <unistd.h>

#include "core/algorithms/identity.h"
#include "core/common/log.h"
#include "core/common/settings.h"
#include "core/common/spin_policy.h"
#include "core/common/topology.h"
#include "core/reduce/flags.h"
#include "core/select/select.h"
#include "core/transport/ucx/ucx_transport.h"
#include "torch/exit_safe_release.h"
#include "torch/staging.h"
#include "torch/store_adapter.h"
#include "torch/without_gil.h"

namespace ringx {

namespace {

// What RINGX_DEBUG=INFO names a call's algorithm: the schedule's own name,
// which says what a hierarchical one runs between hosts ("hier(chain)").
std::string_view algorithmLabel(const Schedule& built, const Algorithm& chosen) {
  return built.algorithm().empty() ? chosen.name : std::string_view(built.algorithm());
}

[[noreturn]] void throwBackendError(const std::string& what) {
  throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, what);
}

// When this host's ranks have no core to spare (LOCAL_WORLD_SIZE >= the CPUs
// this process may use), a rank's progress thread shares a core anyway, and
// the scheduler moving it and the rank's own thread between cores, apart or
// onto the same one as another rank's, made small collectives 1-5x slower
// from one run to the next. Pinned to CPU LOCAL_RANK (mod CPUs), the threads
// of a rank stay together and those of different ranks apart; the thread
// that calls ringx, woken by them, tends to follow. RINGX_PIN_THREADS=0 turns
// it off; a process already confined to one CPU is left as it is.
int threadCpu() {
  if (!settingFlag("RINGX_PIN_THREADS")) return -1;
  const char* localRank = std::getenv("LOCAL_RANK");
  const char* localSize = std::getenv("LOCAL_WORLD_SIZE");
  if (!localRank || !localSize) return -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  const long ranks = std::atol(localSize), rank = std::atol(localRank);
  if (cpus.size() < 2 || ranks < long(cpus.size()) || rank < 0) return -1;
  return cpus[size_t(rank) % cpus.size()];
}

// The job's ranks on this host (torchrun's LOCAL_WORLD_SIZE), or this
// group's if more: other groups' ranks compete for the same CPUs.
int ranksOnThisHost(const Topology& topology, int rank) {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const long job = local ? std::atol(local) : 0;
  return std::max<int>(int(job), int(topology.ranksOn(topology.hostOf[size_t(rank)]).size()));
}

}  // namespace

ProcessGroupRingx::ProcessGroupRingx(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), timeout_(timeout) {
  // Where a group's creation time goes, at INFO: each phase waits on every
  // rank's store writes, so the slowest rank sets it.
  using Clock = std::chrono::steady_clock;
  auto mark = Clock::now();
  std::ostringstream phases;
  auto phase = [&](const char* name) {
    const auto now = Clock::now();
    phases << (phases.tellp() > 0 ? ", " : "") << name << " " << std::fixed << std::setprecision(1)
           << std::chrono::duration<double, std::milli>(now - mark).count() << " ms";
    mark = now;
  };
  if (size > kMaxRanks) throwBackendError("ringx: groups of more than " + std::to_string(kMaxRanks) + " ranks");
  C10dStoreAdapter adapter(store);
  // Each rank counts the ringx groups it has built on this store; ranks build
  // them in the same order, so the counts agree and name fresh keys.
  int64_t generation = adapter.add("ringx/generation/" + std::to_string(rank), 1);
  const std::string prefix = "ringx/" + std::to_string(generation);
  reloadLogLevel();
  UcxOptions uopts;
  uopts.keyPrefix = prefix + "/ucx";
  CommOptions copts;
  copts.timeout = timeout;
  CmaMode cmaMode = CmaMode::Auto;
  std::optional<std::chrono::microseconds> spin;
  try {
    checkSettingsAgree(adapter, prefix + "/settings", rank, size);
    segmentBytes_ = settingPositive("RINGX_CHUNK_BYTES");
    algo_ = AlgoOverride(settingText("RINGX_ALGO"));
#ifdef RINGX_WITH_CUDA
    const std::string path = settingEffective("RINGX_CUDA_PATH");
    if (path != "STAGED" && path != "RESIDENT" && path != "IPC") {
      throw Error(ErrorKind::InvalidArgument, "ringx: creating a group (rank " + std::to_string(rank) +
                                                  "): RINGX_CUDA_PATH=" + path +
                                                  " is none of staged, resident, ipc");
    }
    cudaPath_ = path == "RESIDENT" ? CudaPath::Resident : path == "IPC" ? CudaPath::Ipc : CudaPath::Staged;
    cudaIpcBytes_ = settingPositive("RINGX_CUDA_IPC_BYTES");
    ipcAlgo_ = parseIpcAlgo(settingText("RINGX_IPC_ALGO"));
    store_ = store;
    storePrefix_ = prefix;
    cudaStageBytes_ = settingPositive("RINGX_CUDA_STAGE_BYTES");
    blockingWait_ = settingFlag("RINGX_BLOCKING_WAIT");
    asyncTeardown_ = settingEffective("RINGX_ASYNC_ERROR_HANDLING") == "TEARDOWN";
#endif
    uopts.tls = settingText("RINGX_TLS");
    spin = spinSetting();
    copts.cpu = threadCpu();
    cmaMode = cmaModeSetting();
    if (cmaMode == CmaMode::On && !settingFlag("RINGX_SHM")) {
      throw Error(ErrorKind::InvalidArgument, "ringx: RINGX_CMA=1 needs the shared-memory area; unset RINGX_SHM=0");
    }
  } catch (const Error& e) {
    throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
  }
  phase("settings");
  try {
    topology_ = Topology::exchange(adapter, prefix + "/topology", rank, size);
    phase("topology");
    const SpinDecision decided =
        decideSpin(spin, cpusAvailable(), ranksOnThisHost(topology_, rank));
    copts.spin = decided.spin;
    copts.gaugeNetworkSpin = decided.gaugeNetwork;
    RINGX_LOG(Info, "ringx: rank " << rank << " " << decided.why);
    if (settingFlag("RINGX_SHM")) {
      // Slots hold whole elements of any dtype and start cache-line aligned.
      const size_t slot = std::max<size_t>(4096, settingPositive("RINGX_SHM_BYTES") / 64 * 64);
      shm_ = ShmArea::create(adapter, prefix, rank, size, slot);
      if (shm_) copts.bell = shm_->bell();
      if (shm_) cma_ = Cma::create(adapter, prefix, rank, size, cmaMode);
      HostLayout layout = HostLayout::of(topology_, rank);
      bool everyHost = false;
      if (!shm_ && layout.hosts) {
        // A host with one of the group's ranks has nothing to share.
        if (layout.localSize() > 1) {
          hostShm_ = ShmArea::create(adapter, prefix + "/host" + std::to_string(layout.host), layout.localRank,
                                     layout.localSize(), slot);
        }
        // Each rank's slot size, 0 without its area. The hierarchical
        // algorithms need every host's area: one host without its area makes
        // the whole group take the flat ones. Hosts agree on the smallest
        // slot, which all_reduce's chunks must fit (HostLayout::chunkBytes).
        const size_t mine = hostShm_ ? hostShm_->slotBytes() : layout.localSize() == 1 ? slot : 0;
        const std::string text = std::to_string(mine);
        adapter.set(prefix + "/hostshm/" + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
        size_t chunk = mine;
        const auto slots = getFromEveryRank(adapter, prefix + "/hostshm", size);
        for (int p = 0; p < size; ++p) {
          const std::vector<uint8_t>& theirs = slots[size_t(p)];
          if (p != rank) chunk = std::min<size_t>(chunk, std::stoull(std::string(theirs.begin(), theirs.end())));
        }
        everyHost = chunk > 0;
        layout.chunkBytes = chunk;
        if (!everyHost) hostShm_.reset();
      }
      if (everyHost) {
        if (hostShm_) {
          hostShm_->setGroupRanks(layout.local);
          layout.shm = hostShm_.get();
          copts.bell = hostShm_->bell();
        }
        hostLayout_ = std::move(layout);
      }
    }
    phase("shared memory");
    // Every rank of a shared-memory group has an area, or none has
    // (ShmArea::create); UCX's own shared memory needs the peers' processes too.
    const bool ucxSharesMemory = (shm_ && topology_.sameNamespacesPerHost) || size == 1;
    uopts.tls = ucxTransportsFor(uopts.tls, std::getenv("UCX_TLS"), ucxSharesMemory,
                                 std::getenv("UCX_UNIFIED_MODE"));
    auto transport = makeUcxTransport(adapter, rank, size, uopts);
    phase("UCX");
    comm_ = std::make_shared<Communicator>(std::move(transport), copts);
    phase("engine");
#ifdef RINGX_WITH_CUDA
    if (cudaPath_ == CudaPath::Ipc && !topology_.singleHost()) {
      ipcGroupRefusal_ = "the group's ranks are not all on one host";
    } else if (cudaPath_ == CudaPath::Ipc && size > flags::kMaxFlags + 1) {
      ipcGroupRefusal_ = "the ipc path takes at most " + std::to_string(flags::kMaxFlags + 1) + " ranks";
    }
#endif
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::InvalidArgument) {
      throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
    }
    throwBackendError("ringx: creating the communicator (rank " + std::to_string(rank) + ") failed: " + e.what());
  }
  logUp(phases.str());
}

void ProcessGroupRingx::logUp(const std::string& phases) const {
  if (logLevel() < LogLevel::Info) return;
  RINGX_LOG(Info, "ringx: rank " << rank_ << "/" << size_ << " up (" << phases << "), timeout " << timeout_.load().count()
                                  << " ms; "
                                  << topology_.describe(hostPaths(topology_, bool(shm_), bool(cma_),
                                                                  hostLayout_.hosts > 0))
                                  << "; this rank reaches "
                                  << (shm_ ? "every rank through shared memory"
                                           : "every rank through UCX (RINGX_TLS " +
                                                 (settingText("RINGX_TLS").empty() ? std::string("unset")
                                                                                   : settingText("RINGX_TLS")) +
                                                 ")")
                                  << (shm_ || topology_.singleHost() ? ""
                                      : hostShm_ ? ", and the ranks on its host through shared memory too "
                                                   "(hierarchical algorithms)"
                                                 : ", shared memory being used only where every host has the "
                                                   "same number (at least 2) of the group's ranks"));
}

ProcessGroupRingx::~ProcessGroupRingx() {
  // A waiter may still hold the communicator: stop it first, so that nothing
  // touches the shared-memory area after this returns.
  withoutGil([this] {
    comm_->shutdown();
    comm_.reset();
    shrinkTransport_.reset();
  });
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupRingx::getBackendOptions() {
  return c10::make_intrusive<Options>("ringx", timeout_.load());
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupRingx::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                           const std::vector<int>& ranks,
                                                           const c10::intrusive_ptr<Options>& opts) {
  const std::string where = "ringx: split_group (rank " + std::to_string(rank_) + "): ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size_) {
      throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)},
                            where + "rank " + std::to_string(ranks[i]) + " is out of range for a group of size " +
                                std::to_string(size_));
    }
    if (std::find(ranks.begin(), ranks.begin() + long(i), ranks[i]) != ranks.begin() + long(i)) {
      throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)},
                            where + "rank " + std::to_string(ranks[i]) + " is listed twice");
    }
  }
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  std::lock_guard<std::mutex> lock(splitMu_);
  if (store == lastSplitStore_ && ranks == lastSplitRanks_) {
    if (auto same = lastSplit_.lock()) return same;
  }
  const auto timeout = opts ? opts->timeout : timeout_.load();
  c10::intrusive_ptr<c10d::Backend> group =
      c10::make_intrusive<ProcessGroupRingx>(store, int(me - ranks.begin()), int(ranks.size()), timeout);
  lastSplitStore_ = store;
  lastSplitRanks_ = ranks;
  lastSplit_ = c10::weak_intrusive_ptr<c10d::Backend>(group);
  return group;
}

void ProcessGroupRingx::abort() {
  withoutGil([this] { comm_->abort("aborted"); });
}

void ProcessGroupRingx::shutdown() {
  withoutGil([this] { comm_->shutdown(); });
}

c10d::ErrorType ProcessGroupRingx::getError() {
  auto err = comm_->error();
  if (!err) return c10d::ErrorType::SUCCESS;
  switch (err->kind()) {
    case ErrorKind::Timeout: return c10d::ErrorType::TIMEOUT;
    case ErrorKind::PeerClosed: return c10d::ErrorType::REMOTE_ERROR;
    default: return c10d::ErrorType::COMM_ERROR;
  }
}

// A timeout of zero asks for no waiting at all (monitored_barrier(timeout=0)
// fails at once in gloo); the engine reads an op timeout of 0 as "the
// communicator's default", so it becomes the shortest the engine keeps.
std::chrono::milliseconds ProcessGroupRingx::timeoutFor(std::chrono::milliseconds requested) const {
  if (requested == c10d::kUnsetTimeout) return timeout_.load();
  return std::max(requested, std::chrono::milliseconds(1));
}

ProcessGroupRingx::Call ProcessGroupRingx::begin(const char* op, c10d::OpType type,
                                                 std::chrono::milliseconds timeout, bool asyncOp) {
  return Call{CallContext{op, rank_, size_, seq_ + 1}, type, timeoutFor(timeout), &seq_, op, {}, {}, SIZE_MAX,
              !asyncOp, held_ ? this : nullptr};
}

ProcessGroupRingx::Call ProcessGroupRingx::beginP2P(const char* op, c10d::OpType type) {
  return Call{CallContext{op, rank_, size_, p2pSeq_ + 1}, type, timeout_.load(), &p2pSeq_, op, {}, {}, SIZE_MAX,
              false, held_ ? this : nullptr};
}

CollArgs ProcessGroupRingx::argsFor(const Call& call, Collective coll) const {
  CollArgs a(coll, rank_, size_, call.ctx.seq);
  a.segmentBytes = segmentBytes_;
  a.shm = shm_.get();
  a.cma = cma_.get();
  a.crossHost = !topology_.singleHost();
  a.hosts = hostLayout_.hosts ? &hostLayout_ : nullptr;
  return a;
}

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submit(Call& call, const CollArgs& args,
                                                        std::vector<at::Tensor> keepAlive,
                                                        std::vector<at::Tensor> outputs,
                                                        std::function<void()> publish) {
#ifdef RINGX_WITH_CUDA
  if (std::any_of(keepAlive.begin(), keepAlive.end(), [](const at::Tensor& t) { return t.defined() && t.is_cuda(); }))
    return submitOnCuda(call, args, std::move(keepAlive), std::move(outputs), std::move(publish));
#endif
  checkHostOnly(call.ctx, keepAlive);
  return submitArgs(call, args, nullptr, std::move(keepAlive), std::move(outputs), std::move(publish));
}

void ProcessGroupRingx::checkHostOnly(const CallContext& c, const std::vector<at::Tensor>& tensors) const {
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.device().is_cpu()) continue;
    throwTypeError(c, "tensors on " + t.device().str() + " are not supported by " + c.op +
                          " yet (the collectives take CUDA tensors in a CUDA build); use \"cpu:ringx,cuda:nccl\" "
                          "to route this call to NCCL");
  }
}

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitArgs(Call& call, const CollArgs& args,
                                                            const HostStaging* staging,
                                                            std::vector<at::Tensor> keepAlive,
                                                            std::vector<at::Tensor> outputs,
                                                            std::function<void()> publish) {
  auto select = [&](const CollArgs& a) {
    try {
      return &selection_.select(a, algo_);
    } catch (const Error& e) {
      throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
    }
  };
  // Staged in pieces, each piece is a collective of its own (host_staging.h).
  const size_t pieces = staging ? staging->pieces() : 1;
  std::vector<CollArgs> parts;
  std::vector<const Algorithm*> algs;
  parts.reserve(pieces);
  algs.reserve(pieces);
  for (size_t k = 0; k < pieces; ++k) {
    CollArgs& p = parts.emplace_back(args);
    if (pieces > 1) {
      auto [offset, bytes] = staging->piece(k);
      p.buf = static_cast<std::byte*>(args.buf) + offset;
      p.count = bytes / dtypeSize(args.dtype);
    }
    algs.push_back(call.algorithm && pieces == 1 ? call.algorithm : select(p));
  }
  if (args.coll == Collective::AllReduce || args.coll == Collective::Reduce ||
      args.coll == Collective::ReduceScatter) {
    call.reduction = std::make_tuple(args.dtype, args.op, args.premulFactor);
  }
  checkCoalescible(call);
  call.bytes = args.bytes();
  auto build = [&](uint64_t seq) {
    std::vector<Schedule> built;
    for (size_t k = 0; k < pieces; ++k) {
      CollArgs& numbered = parts[k];
      numbered.seq = seq + k;
      built.push_back(buildChecked(*algs[k], numbered));
      RINGX_LOG(Info, call.ctx.prefix() << "algorithm " << algorithmLabel(built.back(), *algs[k]) << ", "
                                        << numbered.bytes() << " bytes"
                                        << (numbered.blocks.empty()
                                                ? std::string()
                                                : ", " +
                                                      std::to_string(numbered.blocks.size() +
                                                                     numbered.inputBlocks.size()) +
                                                      " separate tensors in place")
                                        << (pieces > 1 ? " (piece " + std::to_string(k + 1) + " of " +
                                                             std::to_string(pieces) + ")"
                                                       : std::string()));
    }
    return staging ? staging->wrap(std::move(built)) : std::move(built[0]);
  };
  return submitBuilt(call, build, std::move(keepAlive), std::move(outputs), std::move(publish), pieces);
}

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitSchedule(Call& call, std::vector<DeviceRegion> regions,
                                                                const RegionBuild& build,
                                                                std::vector<at::Tensor> keepAlive,
                                                                std::vector<at::Tensor> outputs,
                                                                std::function<void()> publish) {
#ifdef RINGX_WITH_CUDA
  if (std::any_of(keepAlive.begin(), keepAlive.end(), [](const at::Tensor& t) { return t.defined() && t.is_cuda(); }))
    return submitScheduleOnCuda(call, std::move(regions), build, std::move(keepAlive), std::move(outputs),
                                std::move(publish));
#endif
  checkHostOnly(call.ctx, keepAlive);
  std::vector<void*> buffers;
  for (const DeviceRegion& r : regions) buffers.push_back(r.device);
  Schedule schedule = build(buffers);
  return submitBuilt(
      call, [&](uint64_t) { return std::move(schedule); }, std::move(keepAlive), std::move(outputs),
      std::move(publish));
}

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitBuilt(Call& call,
                                                             const std::function<Schedule(uint64_t seq)>& build,
                                                             std::vector<at::Tensor> keepAlive,
                                                             std::vector<at::Tensor> outputs,
                                                             std::function<void()> publish, uint64_t seqs) {
  std::lock_guard<std::mutex> lock(submitMu_);
  call.ctx.seq = call.numbering->load() + 1;
  Schedule schedule = build(call.ctx.seq);
  call.numbering->store(call.ctx.seq + seqs - 1);
  // torch's Work makes a RecordFunction for a titled Work whether or not a
  // profiler listens; without one the title would only cost that.
  const bool profiled = !call.title.empty() && at::hasCallbacks();
  const std::string title = profiled ? "ringx:" + call.title : std::string();
  auto work = c10::make_intrusive<WorkRingx>(rank_, call.type, profiled ? title.c_str() : nullptr,
                                             std::move(call.recorded), std::move(outputs), call.ctx.seq, comm_);
  work->opName = call.ctx.op;
  work->publish = std::move(publish);
  auto op = std::make_unique<Op>(call.ctx.op, call.ctx.seq, std::move(schedule));
  op->timeout = call.timeout;
  op->bytes = call.bytes;
  op->callerWaits = call.callerWaits;
  op->keepAlive = exitSafe(std::move(keepAlive));
  if (held_) {
    hold(call, std::move(work), std::move(op));
    return {};
  }
  Op* raw = op.get();
  auto held = exitSafe(work);
  op->onDone = [held, raw](const Error* e) {
    (*held)->setSourceRank(raw->recvSource);
    (*held)->markDone(e);
  };
  op->onCallbacks = [held](const Error* e) { (*held)->completeFuture(e); };
  op->callbacksWanted = [held] { return (*held)->futureWanted(); };
  try {
    comm_->submit(std::move(op));
  } catch (const Error& e) {
    throwBackendError(e.what());
  }
  return work;
}

void ProcessGroupRingx::checkOnThisRankOnly(Call& call, Collective coll, int root,
                                            const std::function<void()>& check) {
  try {
    check();
  } catch (const c10::Error& e) {
    // Alone in its group the rank rejected the call everywhere: nothing to
    // tell, and the group stays usable as after any rejected call.
    if (size_ == 1) throw;
    CollArgs a = argsFor(call, coll);
    a.root = root;
    const std::string why = "this rank rejected its own arguments, which the other ranks could not check (" +
                            std::string(e.what_without_backtrace()) +
                            "); the group is no longer usable, create a new one";
    // Wait for the notices to leave (the op then fails by design), so that a
    // caller who aborts the group right after the error does not cancel them.
    // Inside a coalescing block they are held instead (no Work), and leave
    // with the block's earlier calls as this exception ends it.
    try {
      auto notice = submitBuilt(
          call,
          [&](uint64_t seq) {
            a.seq = seq;
            return buildRejection(a, why);
          },
          {}, {}, nullptr);
      if (notice) notice->wait();
    } catch (const c10::Error&) {
      // The expected failure, or the group was already shut down or aborted.
    }
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::barrier(const c10d::BarrierOptions& opts) {
  Call call = begin("barrier", c10d::OpType::BARRIER, opts.timeout, opts.asyncOp);
  return submit(call, argsFor(call, Collective::Barrier), {}, {}, nullptr);
}

// Rank 0 collects a zero-byte message from every rank, then releases them;
// unlike barrier(), a missing rank is named. A timeout poisons the group like
// any other (a rank that missed the barrier leaves the group out of step).
// One profiler record per call, for the arrival.
void ProcessGroupRingx::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  Call call = begin("monitored_barrier", c10d::OpType::BARRIER, opts.timeout, opts.asyncOp);
  if (held_) throwValueError(call.ctx, "cannot run inside a coalescing block; call it after the block ends");
  // Both halves use the arrival's sequence number (tags 0 and 1); the
  // release takes the next one, which nothing sends under.
  uint64_t seq = 0;
  auto arrive = [&](uint64_t s) {
    seq = s;
    Schedule sched(DType::U8, ReduceOp::Sum);
    sched.setAlgorithm("monitored");
    // A rank that left does not end rank 0's wait for the others (gloo's
    // neither): only those that never arrive are named with it.
    sched.setWaitOutClosedPeers();
    for (int p = 1; p < size_ && rank_ == 0; ++p) sched.recv(p, collTag(s, 0), nullptr, 0);
    if (rank_ != 0) sched.send(0, collTag(s, 0), nullptr, 0);
    return sched;
  };
  auto release = [&](uint64_t) {
    Schedule sched(DType::U8, ReduceOp::Sum);
    sched.setAlgorithm("monitored");
    for (int p = 1; p < size_ && rank_ == 0; ++p) sched.send(p, collTag(seq, 1), nullptr, 0);
    if (rank_ != 0) sched.recv(0, collTag(seq, 1), nullptr, 0);
    return sched;
  };
  // A rank other than 0 that fails says so in gloo's words too.
  auto notPassed = [this](const c10::DistBackendError& e) {
    throwBackendError(std::string(e.what()) + " (as gloo says: Rank " + std::to_string(rank_) +
                      " successfully reached monitoredBarrier, but received errors while waiting for send/recv "
                      "from rank 0. Please check rank 0 logs for faulty rank.)");
  };
  auto first = submitBuilt(call, arrive, {}, {}, nullptr);
  try {
    first->wait();
  } catch (const c10::DistBackendError& e) {
    if (rank_ != 0) notPassed(e);
    // As gloo does, rank 0 names the ranks that did not pass: those that
    // closed their connection (left the group, or died) and, on a timeout,
    // those that never arrived.
    auto err = comm_->error();
    const bool named = err && (err->kind() == ErrorKind::Timeout || err->kind() == ErrorKind::PeerClosed);
    if (rank_ == 0 && named && !err->awaited().empty()) {
      const auto& missing = err->awaited();
      const size_t n = waitAllRanks ? missing.size() : 1;
      std::string list;
      for (size_t i = 0; i < n; ++i) list += (i ? ", " : "") + std::to_string(missing[i]);
      const auto asked = opts.timeout == c10d::kUnsetTimeout ? timeout_.load() : opts.timeout;
      const std::string ms = std::to_string(asked.count()) + " ms";
      // gloo's words follow ringx's: scripts and torch's own tests match them.
      const std::string gloo = std::string(n == 1 ? "Rank " : "Ranks ") + list +
                               " failed to pass monitoredBarrier in " + ms;
      if (err->kind() == ErrorKind::Timeout) {
        throwBackendError(call.ctx.prefix() + "rank(s) " + list + " failed to pass monitored_barrier within " + ms +
                          " (as gloo says: Rank 0 timed out in monitoredBarrier after " + ms + "; " + gloo + ")");
      }
      std::string cause = err->what();
      if (cause.starts_with(call.ctx.prefix())) cause.erase(0, call.ctx.prefix().size());
      throwBackendError(call.ctx.prefix() + "rank(s) " + list + " failed to pass monitored_barrier (" + cause +
                        "; as gloo says: " + gloo + ")");
    }
    throw;
  }
  call.title.clear();
  auto released = submitBuilt(call, release, {}, {}, nullptr);
  try {
    released->wait();
  } catch (const c10::DistBackendError& e) {
    if (rank_ != 0) notPassed(e);
    throw;
  }
}

}  // namespace ringx
