#include "core/device_paths/ipc_collective.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/device_paths/ipc_ring.h"
#include "core/reduce/reduce.h"

namespace ringx {

namespace {

// The op's status words, in page-locked host memory: the verdict the host
// writes (0 until the identities are compared, then 1, or kFlagFailed) and
// the taint the device writes when a wait ended on a failure.
constexpr size_t kVerdict = 0, kTaint = 1;

bool isReduction(Collective c) {
  return c == Collective::AllReduce || c == Collective::Reduce || c == Collective::ReduceScatter;
}

// Whether rank r's buffer is filled, and whether its caller's buffer is
// written, by collective `a`.
bool fills(const CollArgs& a) {
  return !((a.coll == Collective::Broadcast || a.coll == Collective::Scatter) && a.rank != a.root);
}
bool writesOutput(const CollArgs& a) {
  if (a.coll == Collective::Broadcast) return a.rank != a.root;
  if (a.coll == Collective::Reduce || a.coll == Collective::Gather) return a.rank == a.root;
  return true;
}

// Elements of the caller's output (buf).
size_t outputElems(const CollArgs& a) {
  switch (a.coll) {
    case Collective::AllGather:
    case Collective::Gather:
    case Collective::AllToAll: return a.count * size_t(a.size);
    default: return a.count;
  }
}

}  // namespace

struct IpcCollective::State {
  Device* device = nullptr;
  IpcPeers* peers = nullptr;
  CollIdentity id;
  int slot = 0;
  uint64_t previousInSlot = 0;  // must have published before this op may
  std::optional<IpcAlgo> algo;  // all_reduce only
  std::vector<IpcAwaited> awaited;
  std::shared_ptr<std::byte> status, output;
  std::shared_ptr<DeviceEvent> done;
  uint32_t lastRound = 0;  // 0: the op has no rounds

  uint32_t* word(size_t i) const { return reinterpret_cast<uint32_t*>(status.get()) + i; }
  uint32_t load(size_t i) const { return std::atomic_ref<uint32_t>(*word(i)).load(std::memory_order_acquire); }
  // Ends the op's device waits, and with them the group's ipc path.
  void cancel(const std::string& why) {
    std::atomic_ref<uint32_t>(*word(kVerdict)).store(kFlagFailed, std::memory_order_release);
    peers->fail(why);
  }

  // The peers whose words this op's device waits on carry the failed bit,
  // or (failed false) are still below the last value it waits for.
  std::vector<int> peersWhere(bool failed) const {
    std::vector<int> ranks;
    for (const IpcAwaited& w : awaited) {
      const uint32_t v = std::atomic_ref<uint32_t>(*peers->mailbox(peers->rank(), w.phase, w.writer))
                             .load(std::memory_order_acquire);
      const bool listed = std::find(ranks.begin(), ranks.end(), w.writer) != ranks.end();
      if (!listed && (failed ? (v & kFlagFailed) != 0 : v < w.last)) ranks.push_back(w.writer);
    }
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  }

  // However the op ended, or if it never ran, no wait of its outlives it
  // and its memory outlives the device's work. The last owner may be any
  // thread (the callback pool's, usually).
  ~State() {
    if (!done) return;  // refused before it enqueued anything
    OnDevice on(device);
    if (!done->query()) {
      cancel("ringx: " + std::string(collectiveName(Collective(id.kind))) + " (rank " +
             std::to_string(peers->rank()) + ", seq " + std::to_string(id.seq) +
             "): issued on the ipc path but never run");
      done->synchronize();
    }
    done.reset();
    output.reset();
    status.reset();
  }
};

bool IpcCollective::supports(const CollArgs& a) {
  if (a.coll == Collective::Barrier || !a.blocks.empty() || !a.inputBlocks.empty()) return false;
  return a.coll != Collective::AllToAll || a.evenSplits;
}

IpcCollective::IpcCollective(DeviceOrder& order, DeviceStream& caller, IpcPeers& peers, const CollArgs& a,
                             std::optional<IpcAlgo> forced)
    : state_(std::make_shared<State>()) {
  Device& device = order.device();
  OnDevice on(&device);
  const std::string who = "ringx: " + std::string(collectiveName(a.coll)) + " (rank " + std::to_string(a.rank) +
                          ", seq " + std::to_string(a.seq) + "): ";
  refuseCapture(caller, who);
  if (!supports(a)) {
    throw Error(ErrorKind::InvalidArgument, who + "the ipc path takes packed buffers (and even splits for "
                                                  "all_to_all) and no barrier");
  }
  if (a.size != peers.size() || a.rank != peers.rank()) {
    throw Error(ErrorKind::InvalidArgument, who + "the ipc peers were set up for rank " +
                                                std::to_string(peers.rank()) + " of " + std::to_string(peers.size()));
  }
  if (auto earlier = peers.failure()) {
    throw Error(ErrorKind::Aborted, who + "the ipc path of this group failed at an earlier op and cannot run "
                                          "another (the peers' flags and rounds no longer agree); create a new "
                                          "group. The earlier failure: " + *earlier);
  }
  const bool reduces = isReduction(a.coll);
  // Before anything is enqueued: a pair that does not exist fails here.
  if (reduces) reduceNFn(a.dtype, a.op);
  const size_t roundElems = ipcRoundElems(a, peers.bufferBytes());
  if (roundElems == 0) {
    throw Error(ErrorKind::InvalidArgument, who + "the ipc buffer (" + std::to_string(peers.bufferBytes()) +
                                                " bytes) cannot hold one element per rank");
  }

  State& st = *state_;
  st.device = &device;
  st.peers = &peers;
  st.id = identityOf(a);
  st.id.count = a.count;  // all_to_all too: the path takes even splits only
  st.slot = int(a.seq % IpcPeers::kIdentitySlots);
  const size_t es = dtypeSize(a.dtype), block = a.count * es;
  if (a.coll == Collective::AllReduce) {
    st.algo = ipcAllReduceAlgo(a.bytes(), es, a.size, peers.bufferBytes(), forced);
  }
  const bool onRing = st.algo == IpcAlgo::Ring, twoShot = st.algo == IpcAlgo::TwoShot;
  const IpcRingPlan ringPlan = ipcRingPlan(a.count, es, a.size, peers.bufferBytes());
  st.status = device.allocPinned(2 * sizeof(uint32_t));
  std::atomic_ref<uint32_t>(*st.word(kVerdict)).store(0);
  std::atomic_ref<uint32_t>(*st.word(kTaint)).store(0);
  const bool output = writesOutput(a);
  const size_t outBytes = outputElems(a) * es;
  if (output) st.output = device.allocDevice(outBytes);
  const size_t rounds = onRing ? 0 : ipcRounds(a.count, roundElems);
  const size_t flagRounds = onRing ? ringPlan.writes() : rounds;
  if (flagRounds > flags::kMaxRound) {
    throw Error(ErrorKind::InvalidArgument, who + "takes " + std::to_string(flagRounds) +
                                                " steps through the ipc buffers, more than their flags count; "
                                                "raise RINGX_CUDA_IPC_BYTES");
  }
  const uint32_t first = peers.reserveRounds(uint32_t(flagRounds));
  st.previousInSlot = peers.claimSlot(a.seq);
  st.lastRound = first + uint32_t(flagRounds) - 1;

  const int n = a.size, r = a.rank;
  const auto* in = static_cast<const std::byte*>(a.input ? a.input : a.buf);
  std::byte* tmp = st.output.get();
  const uint32_t* cancel = st.word(kVerdict);
  uint32_t* taint = st.word(kTaint);
  const auto arrived = peers.inbox(IpcPeers::Arrive), reduced = peers.inbox(IpcPeers::Reduced),
             left = peers.inbox(IpcPeers::Left);
  const auto arrive = peers.outbox(IpcPeers::Arrive), reducedOut = peers.outbox(IpcPeers::Reduced),
             leave = peers.outbox(IpcPeers::Left);
  const int others = n - 1;

  auto callerNow = device.newEvent();
  st.done = device.newEvent();
  const std::vector<DeviceRegion> regions = regionsOf(a);
  std::lock_guard<std::mutex> lock(order.mu_);
  DeviceStream& s = order.out();
  caller.record(*callerNow);
  s.wait(*callerNow);
  order.orderAfter(regions, s);
  if (onRing) st.awaited = enqueueIpcRing(s, peers, ringPlan, a, in, tmp, first, cancel, taint);
  for (int q = 0; q < n && rounds; ++q) {
    if (q == r) continue;
    for (auto phase : {IpcPeers::Arrive, IpcPeers::Reduced, IpcPeers::Left}) {
      if (phase != IpcPeers::Reduced || twoShot) st.awaited.push_back({phase, q, st.lastRound});
    }
  }
  for (size_t k = 0; k < rounds; ++k) {
    const uint32_t round = first + uint32_t(k);
    const auto [o, len] = ipcRound(a.count, roundElems, k);
    const size_t bytes = len * es;
    std::byte* mine = peers.buffer(r);
    s.waitFlags(left.data(), others, round - 1, cancel, taint);
    if (fills(a)) {
      if (ipcPerDestination(a.coll)) {
        for (int q = 0; q < n; ++q) s.copy(mine + size_t(q) * bytes, in + size_t(q) * block + o * es, bytes);
      } else {
        s.copy(mine, in + o * es, bytes);
      }
      if (a.op == ReduceOp::PremulSum && reduces) {
        s.scale(mine, len * (ipcPerDestination(a.coll) ? size_t(n) : 1), a.dtype, a.premulFactor);
      }
    }
    s.signalFlags(arrive.data(), others, round, taint);
    s.waitFlags(arrived.data(), others, round, cancel, taint);
    std::vector<const void*> srcs(size_t(n), nullptr);
    switch (a.coll) {
      case Collective::AllReduce:
      case Collective::Reduce:
        if (twoShot) {
          const auto [po, pl] = ipcPortion(len, n, r);
          for (int q = 0; q < n; ++q) srcs[size_t(q)] = peers.buffer(q) + po * es;
          if (pl) s.reduceN(mine + po * es, srcs.data(), n, pl, a.dtype, a.op);
          s.signalFlags(reducedOut.data(), others, round, taint);
          s.waitFlags(reduced.data(), others, round, cancel, taint);
          for (int q = 0; q < n; ++q) {
            const auto [qo, ql] = ipcPortion(len, n, q);
            s.copy(tmp + (o + qo) * es, peers.buffer(q) + qo * es, ql * es);
          }
        } else if (output) {
          for (int q = 0; q < n; ++q) srcs[size_t(q)] = peers.buffer(q);
          s.reduceN(tmp + o * es, srcs.data(), n, len, a.dtype, a.op);
        }
        break;
      case Collective::ReduceScatter:
        for (int q = 0; q < n; ++q) srcs[size_t(q)] = peers.buffer(q) + size_t(r) * bytes;
        s.reduceN(tmp + o * es, srcs.data(), n, len, a.dtype, a.op);
        break;
      case Collective::Broadcast:
        if (output) s.copy(tmp + o * es, peers.buffer(a.root), bytes);
        break;
      case Collective::Scatter:
        s.copy(tmp + o * es, peers.buffer(a.root) + size_t(r) * bytes, bytes);
        break;
      case Collective::AllGather:
      case Collective::Gather:
        for (int q = 0; q < n && output; ++q) s.copy(tmp + size_t(q) * block + o * es, peers.buffer(q), bytes);
        break;
      case Collective::AllToAll:
        for (int q = 0; q < n; ++q) {
          s.copy(tmp + size_t(q) * block + o * es, peers.buffer(q) + size_t(r) * bytes, bytes);
        }
        break;
      case Collective::Barrier: break;
    }
    s.signalFlags(leave.data(), others, round, taint);
  }
  s.waitFlags(&cancel, 1, 1, cancel, taint);
  if (output && a.op == ReduceOp::Avg && reduces) s.scale(tmp, a.count, a.dtype, 1.0 / n);
  if (output) s.copyUnlessFailed(a.buf, tmp, outBytes, taint);
  s.record(*st.done);
  order.touch(regions, st.done);
}

Schedule IpcCollective::schedule() const {
  const State& st = *state_;
  Schedule s(DType(st.id.dtype), ReduceOp(st.id.op));
  s.setAlgorithm(algorithm());
  auto state = state_;
  s.onAbandon([state](const std::string& why) { state->cancel(why); });
  IpcPeers* peers = st.peers;
  const int me = peers->rank(), slot = st.slot;
  const uint64_t previous = st.previousInSlot;
  // This rank's record for the slot is rewritten only once the op issued
  // before it in the slot has published (an op run inline at submit may
  // come here first) and every peer has compared that record.
  const StepId published = s.poll(
      [state, peers, me, slot, previous] {
        if (peers->published(me, slot).load(std::memory_order_acquire) != previous) return false;
        for (int q = 0; q < peers->size(); ++q) {
          if (q != me && peers->checked(q, slot).load(std::memory_order_acquire) < previous) return false;
        }
        peers->identity(me, slot) = state->id;
        peers->published(me, slot).store(state->id.seq, std::memory_order_release);
        return true;
      },
      [peers, me, slot, previous] {
        std::vector<int> behind;
        for (int q = 0; q < peers->size(); ++q) {
          if (q != me && peers->checked(q, slot).load(std::memory_order_acquire) < previous) behind.push_back(q);
        }
        return behind;
      });
  auto notPublished = [state, peers, me, slot] {
    std::vector<int> behind;
    for (int q = 0; q < peers->size(); ++q) {
      if (q != me && peers->published(q, slot).load(std::memory_order_acquire) < state->id.seq) behind.push_back(q);
    }
    return behind;
  };
  const StepId verified = s.poll(
      [state, peers, me, slot, notPublished] {
        if (!notPublished().empty()) return false;
        for (int q = 0; q < peers->size(); ++q) {
          if (q == me) continue;
          const CollIdentity theirs = peers->identity(q, slot);
          if (theirs != state->id) throw Error(ErrorKind::InvalidArgument, mismatch(state->id, theirs, q));
        }
        peers->checked(me, slot).store(state->id.seq, std::memory_order_release);
        std::atomic_ref<uint32_t>(*state->word(kVerdict)).store(1, std::memory_order_release);
        return true;
      },
      notPublished, {published});
  const StepId deps[] = {verified};
  s.pollDevice(
      st.device,
      [state] {
        {
          OnDevice on(state->device);
          if (!state->done->query()) return false;
        }
        if (state->load(kTaint) & kFlagFailed) {
          const std::vector<int> failed = state->peersWhere(true);
          std::string list;
          for (int q : failed) list += (list.empty() ? "" : ", ") + std::to_string(q);
          throw Error(ErrorKind::Aborted,
                      "rank(s) " + (list.empty() ? std::string("?") : list) +
                          " failed their part of this collective (a timeout, a dead peer or a mismatched call "
                          "there); this rank's tensors were left as they were",
                      failed);
        }
        return true;
      },
      deps, [state] { return state->peersWhere(false); });
  return s;
}

const std::shared_ptr<DeviceEvent>& IpcCollective::done() const { return state_->done; }

const char* IpcCollective::algorithm() const {
  if (!isReduction(Collective(state_->id.kind))) return "ipc_copy";
  switch (state_->algo.value_or(IpcAlgo::OneShot)) {
    case IpcAlgo::TwoShot: return "ipc_two_shot";
    case IpcAlgo::Ring: return "ipc_ring";
    case IpcAlgo::OneShot: break;
  }
  return "ipc_one_shot";
}

}  // namespace ringx
