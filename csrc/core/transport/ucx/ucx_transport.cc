#include "core/transport/ucx/ucx_transport.h"

#include <ucp/api/ucp.h>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/common/log.h"
#include "core/common/process_state.h"
#include "core/common/topology.h"
#include "core/transport/shm/presence.h"
#include "core/transport/ucx/peer_card.h"

namespace ringx {

namespace {

void check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) {
    throw Error(ErrorKind::Internal, std::string("ringx: UCX ") + what + " failed: " + ucs_status_string(st));
  }
}

// The worker and its endpoints, shared by the transports over them: the
// group's own (channel 0, every rank) and those of groups shrunk from it
// (UcxView). A channel travels in the high bits of the tag's source field,
// above the rank: receives match their channel only.
class UcxWorker {
 public:
  UcxWorker(Store& store, int rank, int size, const UcxOptions& opts)
      : rank_(rank), size_(size), rankBits_(std::bit_width(unsigned(size - 1))) {
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "config_read");
    if (!opts.tls.empty()) ucp_config_modify(config, "TLS", opts.tls.c_str());
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.name = "ringx";
    ucs_status_t st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    check(st, "init");

    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // Only the progress thread touches the worker, but it is created here, on
    // another thread: serialized is the mode that allows that without locks.
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    check(ucp_worker_create(context_, &wp, &worker_), "worker_create");
    check(ucp_worker_get_efd(worker_, &efd_), "worker_get_efd");

    ucp_address_t* addr = nullptr;
    size_t addrLen = 0;
    check(ucp_worker_get_address(worker_, &addr, &addrLen), "worker_get_address");
    PeerCard mine{hostIdentity(), int(::getpid()), presence_.name(),
                  std::vector<uint8_t>(reinterpret_cast<uint8_t*>(addr), reinterpret_cast<uint8_t*>(addr) + addrLen)};
    ucp_worker_release_address(worker_, addr);
    store.set(opts.keyPrefix + "/addr/" + std::to_string(rank_), mine.encode());
    mine_ = std::move(mine);

    eps_.assign(size_, nullptr);
    failed_.assign(size_, false);
    peerMode_.assign(size_, true);
    localPid_.assign(size_, 0);
    peerPresence_.resize(size_);
    peerArgs_.resize(size_);
  }

  // Outside the constructor so that a failure is cleaned up by the
  // destructor (endpoints made so far, worker, context).
  void connect(Store& store, const std::string& keyPrefix) {
    std::string failure;
    try {
      connectEndpoints(store, keyPrefix);
    } catch (const Error& e) {
      failure = e.what();
    }
    waitUntilAllConnected(store, keyPrefix, failure);
    presence_.unlinkName();
    if (!failure.empty()) throw Error(ErrorKind::Internal, "ringx: " + failure);
    if (logLevel() >= LogLevel::Info) {
      RINGX_LOG(Info, "ringx: rank " << rank_ << " on UCX " << ucp_get_version_string() << ": " << describeLinks());
    }
  }

  // Which UCX transport and device carries each peer: on an RDMA cluster the
  // first thing to check is that the traffic is on the fabric, not on TCP.
  // Peers reached alike are listed together.
  std::string describeLinks() const {
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !eps_[p]) continue;
      std::string how = endpointTransports(eps_[p]);
      auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == how; });
      if (it == groups.end()) {
        groups.push_back({how, {p}});
      } else {
        it->second.push_back(p);
      }
    }
    std::string out;
    for (auto& [how, peers] : groups) {
      out += out.empty() ? "" : "; ";
      out += peers.size() == 1 ? "rank " : "ranks ";
      for (size_t i = 0; i < peers.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(peers[i]);
      }
      out += " over " + how;
    }
    return out.empty() ? "no peers" : out;
  }

  static std::string endpointTransports(ucp_ep_h ep) {
#if UCP_API_VERSION >= UCP_VERSION(1, 14)
    ucp_transport_entry_t entries[16];
    ucp_ep_attr_t attr{};
    attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
    attr.transports.entries = entries;
    attr.transports.num_entries = 16;
    attr.transports.entry_size = sizeof(ucp_transport_entry_t);
    if (ucp_ep_query(ep, &attr) != UCS_OK) return "(transports unknown)";
    std::vector<std::string> seen;
    for (unsigned i = 0; i < attr.transports.num_entries; ++i) {
      std::string t = std::string(entries[i].transport_name) + "/" + entries[i].device_name;
      if (std::find(seen.begin(), seen.end(), t) == seen.end()) seen.push_back(t);
    }
    std::string out;
    for (auto& t : seen) out += (out.empty() ? "" : " + ") + t;
    return out.empty() ? "(no transports)" : out;
#else
    (void)ep;
    return "(UCX before 1.14 cannot list an endpoint's transports; UCX_LOG_LEVEL=info shows them)";
#endif
  }

  ~UcxWorker() {
    // Whoever posted these is gone: their completions must not run.
    forgetPending();
    // Sends that completed locally may still be on their way (eager
    // messages): flush every live endpoint first, for a bounded time, so that
    // a rank leaving right after its last collective does not take the
    // messages its peers still need with it.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    std::vector<void*> flushing;
    for (int p = 0; p < size_; ++p) {
      if (!eps_[p] || failed_[p]) continue;
      ucp_request_param_t param{};
      void* req = ucp_ep_flush_nbx(eps_[p], &param);
      if (UCS_PTR_IS_PTR(req)) flushing.push_back(req);
    }
    for (void* req : flushing) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(worker_);
      }
      if (ucp_request_check_status(req) != UCS_INPROGRESS) ucp_request_free(req);
    }
    // Force-closing needs peer-failure mode; shared-memory endpoints are
    // flushed instead, for a bounded time in case the peer is gone.
    std::vector<void*> closing;
    for (int p = 0; p < size_; ++p) {
      if (!eps_[p]) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = peerMode_[p] || failed_[p] ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      void* req = ucp_ep_close_nbx(eps_[p], &param);
      if (UCS_PTR_IS_PTR(req)) closing.push_back(req);
    }
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (void* req : closing) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(worker_);
      }
      if (ucp_request_check_status(req) != UCS_INPROGRESS) ucp_request_free(req);
    }
    while (ucp_worker_progress(worker_) != 0) {
    }
    // What this rank sent is out: its peers on this host may now take it as
    // gone, as if its process had exited.
    presence_.leave();
    // Destroying the worker may still complete requests (sends to a dead
    // peer never finish otherwise); their callbacks only queue, and every
    // entry is freed here.
    ucp_worker_destroy(worker_);
    for (auto& [id, pending] : pending_) delete pending;
    ucp_cleanup(context_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool failed(int peer) const { return failed_[peer]; }

  // The channels left: 15 bits of source field, less the rank's.
  uint32_t maxChannel() const { return (1u << (15 - rankBits_)) - 1; }
  uint32_t nextChannel() const { return nextChannel_ <= maxChannel() ? nextChannel_ : 0; }
  void takeChannel(uint32_t channel) { nextChannel_ = std::max(nextChannel_, channel + 1); }

  TransferId isend(int peer, uint64_t tag, uint32_t channel, const void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done) {
    auto* p = newPending(peer, std::move(done), false);
    if (failed_[peer]) {
      completeNow(p, closedResult(peer));
      return p->id;
    }
    ucp_request_param_t param = baseParam(p, mem);
    param.cb.send = &UcxWorker::onSend;
    ucs_status_ptr_t req = ucp_tag_send_nbx(eps_[peer], buf, bytes, wireTag(tag, channel, rank_), &param);
    if (!p->completedInline) track(p, req);
    return p->id;
  }

  TransferId irecv(int peer, uint64_t tag, uint32_t channel, void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done) {
    auto* p = newPending(peer, std::move(done), true);
    // A peer that finished its part and exited may have sent this message
    // before it died: the receive is posted all the same, to take it from
    // UCX's unexpected queue, and the next progress() ends it as any other
    // receive from that peer if nothing was there.
    if (peer != kAnySource && failed_[peer] &&
        std::find(newlyFailed_.begin(), newlyFailed_.end(), peer) == newlyFailed_.end()) {
      newlyFailed_.push_back(peer);
    }
    ucp_request_param_t param = baseParam(p, mem);
    param.cb.recv = &UcxWorker::onRecv;
    const uint64_t channelMask = uint64_t(maxChannel()) << (kTagSourceShift + rankBits_);
    const uint64_t wire = wireTag(tag, channel, peer == kAnySource ? 0 : peer);
    const uint64_t mask = peer == kAnySource ? kTagUserMask | channelMask : ~uint64_t{0};
    ucs_status_ptr_t req = ucp_tag_recv_nbx(worker_, buf, bytes, wire, mask, &param);
    if (!p->completedInline) track(p, req);
    return p->id;
  }

  void cancel(TransferId id) {
    auto it = pending_.find(id);
    if (it != pending_.end() && it->second->request && it->second->isRecv) {
      ucp_request_cancel(worker_, it->second->request);
    }
  }

  // UCX runs request and endpoint callbacks inside ucp_worker_progress (and
  // inside the calls that post or cancel); those only queue. Here, after UCX
  // has returned, receives from failed peers are cancelled and the queue is
  // delivered, so the engine's callbacks never run inside UCX and a failure
  // never re-enters the loop that handles it.
  bool progress() {
    bool did = false;
    while (ucp_worker_progress(worker_) != 0) did = true;
    did |= cancelReceivesFromFailedPeers();
    while (!deferred_.empty()) {
      auto [p, result] = std::move(deferred_.front());
      deferred_.pop_front();
      finish(p, result);
      did = true;
    }
    return did;
  }

  int eventFd() const { return efd_; }

  bool arm() {
    if (!deferred_.empty() || !newlyFailed_.empty()) return false;
    ucs_status_t st = ucp_worker_arm(worker_);
    return st == UCS_OK;
  }

  // Only records: the next progress() takes what the dead peer sent before
  // it died, then cancels what still waits on it.
  void checkPeers(const std::vector<int>& peers) {
    for (int p : peers) {
      if (!failed_[p] && localPeerGone(p)) peerFailed(p);
    }
  }

  void forgetPending() {
    std::vector<void*> requests;
    for (auto& [id, pending] : pending_) {
      pending->done = nullptr;
      if (pending->request) requests.push_back(pending->request);
    }
    for (void* req : requests) ucp_request_cancel(worker_, req);
  }


 private:
  struct Pending {
    UcxWorker* self;
    TransferId id;
    int peer;
    bool isRecv;
    void* request = nullptr;
    bool peerClosed = false;
    bool completedInline = false;
    TransferCallback done;
  };
  struct PeerArg {
    UcxWorker* self;
    int peer;
  };

  void connectEndpoints(Store& store, const std::string& keyPrefix) {
    const auto cards = getFromEveryRank(store, keyPrefix + "/addr", size_);
    for (int p = 0; p < size_; ++p) {
      PeerCard theirs = p == rank_ ? mine_ : PeerCard::decode(cards[size_t(p)]);
      // Peers on this host talk over shared memory, which UCX offers only
      // without peer-failure handling; their liveness is checked by pid
      // instead (checkPeers). Other hosts keep UCX's own detection.
      if (theirs.host == mine_.host) {
        peerMode_[p] = false;
        localPid_[p] = theirs.pid;
        peerPresence_[p] = PeerPresence(theirs.presence);
      }
      peerArgs_[p] = {this, p};
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(theirs.address.data());
      ep.err_mode = peerMode_[p] ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      ep.err_handler.cb = &UcxWorker::onEpError;
      ep.err_handler.arg = &peerArgs_[p];
      ucs_status_t epStatus = ucp_ep_create(worker_, &ep, &eps_[p]);
      if (epStatus != UCS_OK) throw connectError(p, epStatus);
    }
  }

  // A shared-memory endpoint attaches to the peer's segment when it is
  // created, so a peer must keep its worker until every rank has connected:
  // a rank that returned first and destroyed its group at once (it had
  // nothing to do in it) removed the segment under a slower peer, whose
  // ep_create then failed with "Shared memory error". No rank leaves the
  // constructor, and so none can destroy its worker, before all have
  // connected. The wait is the store's, bounded by its timeout. A rank that
  // failed to connect still arrives, with its reason, so that every rank
  // fails at once and names it instead of waiting out the store.
  void waitUntilAllConnected(Store& store, const std::string& keyPrefix, const std::string& failure) {
    if (!failure.empty() && store.add(keyPrefix + "/connect-failures", 1) == 1) {
      const std::string told = "rank " + std::to_string(rank_) + " could not connect: " + failure;
      store.set(keyPrefix + "/connect-failure", std::vector<uint8_t>(told.begin(), told.end()));
    }
    if (size_ > 1) {
      if (store.add(keyPrefix + "/connected", 1) == size_) store.set(keyPrefix + "/all-connected", {1});
      store.get(keyPrefix + "/all-connected");
    }
    if (failure.empty() && store.add(keyPrefix + "/connect-failures", 0) > 0) {
      std::vector<uint8_t> told = store.get(keyPrefix + "/connect-failure");
      throw Error(ErrorKind::Internal, "ringx: " + std::string(told.begin(), told.end()));
    }
  }

  Error connectError(int peer, ucs_status_t st) const {
    std::string why = "UCX ep_create to rank " + std::to_string(peer) + " failed: " + ucs_status_string(st);
    if (localPeerGone(peer)) {
      why += " (its process, pid " + std::to_string(localPid_[peer]) + " on this host, has exited)";
    }
    return Error(ErrorKind::Internal, why);
  }

  static TransferResult closedResult(int peer) {
    TransferResult r;
    r.ok = false;
    r.errorKind = ErrorKind::PeerClosed;
    r.error = closedConnection(peer);
    return r;
  }

  // A peer on this host whose process exited, or that left the group.
  bool localPeerGone(int p) const {
    return localPid_[p] > 0 && p != rank_ && (peerPresence_[p].gone() || !processAlive(localPid_[p]));
  }

  Pending* newPending(int peer, TransferCallback done, bool isRecv) {
    if (peer != kAnySource && (peer < 0 || peer >= size_)) {
      throw Error(ErrorKind::InvalidArgument, "ringx: peer rank " + std::to_string(peer) + " out of range");
    }
    auto* p = new Pending{this, nextId_++, peer, isRecv, nullptr, false, false, std::move(done)};
    pending_.emplace(p->id, p);
    return p;
  }

  ucp_request_param_t baseParam(Pending* p, MemoryKind mem) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.user_data = p;
    param.memory_type = mem == MemoryKind::Cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    return param;
  }

  void track(Pending* p, ucs_status_ptr_t req) {
    if (UCS_PTR_IS_ERR(req)) {
      completeNow(p, fromStatus(p, UCS_PTR_STATUS(req)));
    } else {
      p->request = req;
    }
  }

  void completeNow(Pending* p, TransferResult r) { deferred_.emplace_back(p, std::move(r)); }

  // A request's callback, inside UCX: queue the completion for progress().
  // UCX may also call it inside the call that posts or cancels the request
  // (UCP_OP_ATTR_FLAG_NO_IMM_CMPL allows that); completedInline tells the
  // poster there is no request to keep.
  void complete(Pending* p, const TransferResult& r) {
    p->request = nullptr;
    p->completedInline = true;
    deferred_.emplace_back(p, r);
  }

  void finish(Pending* p, const TransferResult& r) {
    pending_.erase(p->id);
    TransferCallback done = std::move(p->done);
    delete p;
    if (done) done(r);
  }

  TransferResult fromStatus(Pending* p, ucs_status_t status) {
    TransferResult r;
    if (status == UCS_OK) return r;
    // UCX's sockets report a refused connection or a socket left with no peer
    // (the peer's process ended) as NOT_CONNECTED, and that can fail a transfer
    // before the endpoint's error callback marks the peer failed.
    if (p->peerClosed || (p->peer >= 0 && failed_[p->peer]) || status == UCS_ERR_CONNECTION_RESET ||
        status == UCS_ERR_NOT_CONNECTED || status == UCS_ERR_ENDPOINT_TIMEOUT ||
        status == UCS_ERR_UNREACHABLE) {
      return closedResult(p->peer);
    }
    // A same-host endpoint (no peer-failure mode) reports its peer's death as
    // whatever its transport saw (an I/O or shared-memory error), often
    // before the pid watch does: ask the pid now.
    if (status != UCS_ERR_CANCELED && status != UCS_ERR_MESSAGE_TRUNCATED && p->peer >= 0 &&
        localPeerGone(p->peer)) {
      peerFailed(p->peer);
      return closedResult(p->peer);
    }
    r.ok = false;
    if (status == UCS_ERR_MESSAGE_TRUNCATED) {
      r.errorKind = ErrorKind::InvalidArgument;
      r.error = "a peer sent more bytes than this rank expected (ranks disagree on the size)";
    } else if (status == UCS_ERR_CANCELED) {
      r.errorKind = ErrorKind::Aborted;
      r.error = "cancelled";
    } else {
      r.errorKind = ErrorKind::Internal;
      r.error = std::string("UCX: ") + ucs_status_string(status);
      if (p->peer >= 0) r.error += " (transfer with rank " + std::to_string(p->peer) + ")";
    }
    return r;
  }

  static void onSend(void* request, ucs_status_t status, void* user) {
    auto* p = static_cast<Pending*>(user);
    UcxWorker* self = p->self;
    TransferResult r = self->fromStatus(p, status);
    ucp_request_free(request);
    self->complete(p, r);
  }

  static void onRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
    auto* p = static_cast<Pending*>(user);
    UcxWorker* self = p->self;
    TransferResult r = self->fromStatus(p, status);
    if (r.ok) {
      r.bytes = info->length;
      r.source = tagSource(info->sender_tag) & ((1 << self->rankBits_) - 1);
    }
    ucp_request_free(request);
    self->complete(p, r);
  }

  static void onEpError(void* arg, ucp_ep_h, ucs_status_t) {
    auto* pa = static_cast<PeerArg*>(arg);
    pa->self->peerFailed(pa->peer);
  }

  // Called inside UCX (onEpError) or by checkPeers: records only.
  void peerFailed(int peer) {
    if (!failed_[peer]) newlyFailed_.push_back(peer);
    failed_[peer] = true;
  }

  // UCX fails sends on a broken endpoint by itself, but tag receives are not
  // tied to an endpoint: cancel the ones that wait on a newly failed peer, by
  // id, looking each up again. Receives from any source wait on all peers and
  // are left to the engine, which fails every op once a peer is gone.
  bool cancelReceivesFromFailedPeers() {
    if (newlyFailed_.empty()) return false;
    std::vector<int> peers = std::exchange(newlyFailed_, {});
    std::vector<TransferId> victims;
    for (auto& [id, p] : pending_) {
      const bool waitsOnThem = std::find(peers.begin(), peers.end(), p->peer) != peers.end();
      if (p->isRecv && p->request && !p->peerClosed && waitsOnThem) {
        victims.push_back(id);
      }
    }
    for (TransferId id : victims) {
      auto it = pending_.find(id);
      if (it == pending_.end() || !it->second->request) continue;
      Pending* p = it->second;
      p->peerClosed = true;
      ucp_request_cancel(worker_, p->request);
      if (!p->completedInline) abandon(p);
    }
    return true;
  }

  // A receive that its cancellation did not stop (UCX lets a matched
  // rendezvous run on) waits on a peer that is gone, and on nothing else: UCX
  // has taken all it sent before it died (progress() drains the worker before
  // cancelling), so nothing can write into the buffer any more. Its poster is
  // told now, as if the cancellation had completed; the request stays with the
  // worker under an id of its own, and is freed when UCX completes it or the
  // worker goes.
  void abandon(Pending* p) {
    auto* told = new Pending{this, p->id, p->peer, true, nullptr, true, false, std::move(p->done)};
    pending_[told->id] = told;
    completeNow(told, closedResult(p->peer));
    p->id = nextId_++;
    p->done = nullptr;
    pending_.emplace(p->id, p);
  }

  // The source field of a wire tag: the channel above the rank.
  uint64_t wireTag(uint64_t tag, uint32_t channel, int rank) const {
    return (tag & kTagUserMask) | (uint64_t((channel << rankBits_) | unsigned(rank)) << kTagSourceShift);
  }

  int rank_;
  int size_;
  int rankBits_;
  uint32_t nextChannel_ = 1;  // channel 0 is the group's own
  PresenceMark presence_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  PeerCard mine_;
  std::vector<ucp_ep_h> eps_;
  std::vector<bool> failed_;
  std::vector<bool> peerMode_;
  std::vector<int> localPid_;
  std::vector<PeerPresence> peerPresence_;
  std::vector<PeerArg> peerArgs_;
  std::unordered_map<TransferId, Pending*> pending_;
  std::deque<std::pair<Pending*, TransferResult>> deferred_;
  // Failed, or received from, since the last progress(): its receives are still to be cancelled.
  std::vector<int> newlyFailed_;
  TransferId nextId_ = 1;
};

// A transport over some of the worker's ranks (`members[i]` is the worker's
// rank of transport rank i) on one channel.
class UcxView final : public Transport {
 public:
  UcxView(std::shared_ptr<UcxWorker> worker, uint32_t channel, std::vector<int> members)
      : worker_(std::move(worker)), channel_(channel), members_(std::move(members)) {
    auto viewOf = std::make_shared<std::vector<int>>(size_t(worker_->size()), -1);
    for (size_t i = 0; i < members_.size(); ++i) {
      (*viewOf)[size_t(members_[i])] = int(i);
      if (members_[i] == worker_->rank()) rank_ = int(i);
      identity_ = identity_ && members_[i] == int(i);
    }
    viewOf_ = std::move(viewOf);
  }
  // A view its owner dropped without handing it over: nothing of what it
  // posted may run later, on behalf of whoever uses the worker next.
  ~UcxView() override {
    if (!forgotten_) worker_->forgetPending();
  }

  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  std::string name() const override { return "ucx"; }

  TransferId isend(int peer, uint64_t tag, const void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done) override {
    return worker_->isend(workerRank(peer), tag, channel_, buf, bytes, mem, std::move(done));
  }
  TransferId irecv(int peer, uint64_t tag, void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done) override {
    const int from = peer == kAnySource ? kAnySource : workerRank(peer);
    if (identity_) return worker_->irecv(from, tag, channel_, buf, bytes, mem, std::move(done));
    // The callback may outlive the view (a receive of the survivors'
    // exchange, which posts on the parent's view): it owns the rank map.
    return worker_->irecv(from, tag, channel_, buf, bytes, mem,
                          [viewOf = viewOf_, done = std::move(done)](const TransferResult& r) {
                            TransferResult mapped = r;
                            if (mapped.source >= 0) mapped.source = (*viewOf)[size_t(mapped.source)];
                            if (done) done(mapped);
                          });
  }
  void cancel(TransferId id) override { worker_->cancel(id); }
  bool progress() override { return worker_->progress(); }
  int eventFd() const override { return worker_->eventFd(); }
  bool arm() override { return worker_->arm(); }
  void checkPeers() override { worker_->checkPeers(members_); }
  std::vector<int> failedPeers() const override {
    std::vector<int> peers;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (worker_->failed(members_[i])) peers.push_back(int(i));
    }
    return peers;
  }
  void forgetPending() override {
    worker_->forgetPending();
    forgotten_ = true;
  }

  uint32_t nextChannel() const override { return worker_->nextChannel(); }
  std::unique_ptr<Transport> subset(const std::vector<int>& ranks, uint32_t channel) override {
    if (channel == 0 || channel > worker_->maxChannel()) return nullptr;
    std::vector<int> members;
    for (int r : ranks) members.push_back(workerRank(r));
    worker_->takeChannel(channel);
    return std::make_unique<UcxView>(worker_, channel, std::move(members));
  }

 private:
  int workerRank(int peer) const {
    if (peer < 0 || peer >= size()) {
      throw Error(ErrorKind::InvalidArgument, "ringx: peer rank " + std::to_string(peer) + " out of range");
    }
    return members_[size_t(peer)];
  }

  std::shared_ptr<UcxWorker> worker_;
  uint32_t channel_;
  std::vector<int> members_;
  std::shared_ptr<const std::vector<int>> viewOf_;
  int rank_ = -1;
  bool identity_ = true;
  bool forgotten_ = false;
};

}  // namespace

std::unique_ptr<Transport> makeUcxTransport(Store& store, int rank, int size, const UcxOptions& opts) {
  auto worker = std::make_shared<UcxWorker>(store, rank, size, opts);
  worker->connect(store, opts.keyPrefix);
  std::vector<int> everyone(size_t(size), 0);
  for (int r = 0; r < size; ++r) everyone[size_t(r)] = r;
  return std::make_unique<UcxView>(std::move(worker), 0, std::move(everyone));
}

}  // namespace ringx
