#include "core/transport/ucx/ucx_worker.h"

#include <ucp/api/ucp.h>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "core/common/fork_generation.h"
#include "core/common/process_state.h"
#include "core/common/topology.h"

namespace ringx {

namespace {

constexpr uint32_t kSourceValues = uint32_t(kTagSourceMask >> kTagSourceShift) + 1;

void check(ucs_status_t st, const char* what) {
  if (st != UCS_OK) {
    throw Error(ErrorKind::Internal, std::string("ringx: UCX ") + what + " failed: " + ucs_status_string(st));
  }
}

// The live workers, by UCX_TLS value and fork generation. Leaked on purpose:
// views destroyed at exit may still reach it after static destructors ran.
std::mutex& registryMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<std::weak_ptr<UcxWorker>>& registry() {
  static auto* workers = new std::vector<std::weak_ptr<UcxWorker>>;
  return *workers;
}

}  // namespace

struct UcxCallbacks {
  static void onSend(void* request, ucs_status_t status, void* user) {
    auto* p = static_cast<UcxPending*>(user);
    UcxWorker* self = p->worker;
    TransferResult r = self->fromStatus(p, status);
    ucp_request_free(request);
    self->complete(p, r);
  }

  static void onRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
    auto* p = static_cast<UcxPending*>(user);
    UcxWorker* self = p->worker;
    TransferResult r = self->fromStatus(p, status);
    if (r.ok && p->channel) {
      r.bytes = info->length;
      r.source = tagSource(info->sender_tag) & ((1 << p->channel->bits) - 1);
    }
    ucp_request_free(request);
    self->complete(p, r);
  }

  static void onEpError(void* arg, ucp_ep_h, ucs_status_t) {
    auto* peer = static_cast<UcxWorker::Peer*>(arg);
    peer->self->peerFailed(peer->index, nullptr);
  }
};

UcxWorker::Claim::Claim(const std::string& tls) {
  std::lock_guard<std::mutex> lock(registryMu());
  auto& workers = registry();
  const int fork = forkGeneration();
  std::erase_if(workers, [&](const std::weak_ptr<UcxWorker>& w) {
    auto live = w.lock();
    return !live || live->fork_ != fork;
  });
  for (auto& w : workers) {
    auto live = w.lock();
    if (live && live->tls_ == tls && !live->claimed_) {
      worker_ = std::move(live);
      break;
    }
  }
  if (!worker_) {
    worker_ = std::make_shared<UcxWorker>(tls);
    workers.push_back(worker_);
  }
  worker_->claimed_ = true;
}

UcxWorker::Claim::~Claim() {
  std::lock_guard<std::mutex> lock(registryMu());
  worker_->claimed_ = false;
}

UcxWorker::UcxWorker(const std::string& tls) : tls_(tls), fork_(forkGeneration()), host_(hostIdentity()) {
  std::random_device rd;
  uid_ = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid());
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "config_read");
  if (!tls.empty()) ucp_config_modify(config, "TLS", tls.c_str());
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.name = "ringx";
  ucs_status_t st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check(st, "init");
  try {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // Every call into the worker holds mu_: serialized is the mode for that.
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    check(ucp_worker_create(context_, &wp, &worker_), "worker_create");
    check(ucp_worker_get_efd(worker_, &efd_), "worker_get_efd");
    ucp_address_t* addr = nullptr;
    size_t addrLen = 0;
    check(ucp_worker_get_address(worker_, &addr, &addrLen), "worker_get_address");
    const auto* bytes = reinterpret_cast<const uint8_t*>(addr);
    address_.assign(bytes, bytes + addrLen);
    ucp_worker_release_address(worker_, addr);
  } catch (...) {
    if (worker_) ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    throw;
  }
}

UcxWorker::~UcxWorker() {
  // The parent's UCX state is not usable after fork, nor its lock.
  if (forkGeneration() != fork_) return;
  teardown();
}

// The last group is gone. Sends that completed locally may still be on their
// way (eager messages): live endpoints are flushed first, for a bounded time,
// so that a rank leaving right after its last collective does not take the
// messages its peers still need with it; peers known dead or gone are
// skipped, so none is waited on.
void UcxWorker::teardown() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  auto waitFor = [&](std::vector<void*>& requests) {
    for (void* req : requests) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(worker_);
      }
      if (ucp_request_check_status(req) != UCS_INPROGRESS) ucp_request_free(req);
    }
  };
  std::vector<void*> flushing;
  for (Peer& peer : peers_) {
    if (!peer.ep || peer.failed || processGone(peer.index)) continue;
    ucp_request_param_t param{};
    void* req = ucp_ep_flush_nbx(peer.ep, &param);
    if (UCS_PTR_IS_PTR(req)) flushing.push_back(req);
  }
  waitFor(flushing);
  // Force-closing needs peer-failure mode; shared-memory endpoints are
  // flushed instead, for a bounded time in case the peer is gone.
  std::vector<void*> closing;
  for (Peer& peer : peers_) {
    if (!peer.ep) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = peer.peerMode || peer.failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(peer.ep, &param);
    if (UCS_PTR_IS_PTR(req)) closing.push_back(req);
  }
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  waitFor(closing);
  while (ucp_worker_progress(worker_) != 0) {
  }
  // Destroying the worker may still complete requests (sends to a dead peer
  // never finish otherwise); no group is left to hear of them.
  ucp_worker_destroy(worker_);
  for (auto& [id, pending] : pending_) delete pending;
  ucp_cleanup(context_);
}

PeerCard UcxWorker::card(const std::string& presence) const {
  return PeerCard{host_, int(::getpid()), presence, uid_, 0, address_};
}

std::vector<int> UcxWorker::connect(const std::vector<PeerCard>& cards) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> indices;
  for (size_t r = 0; r < cards.size(); ++r) {
    const PeerCard& theirs = cards[r];
    if (auto known = peerOfUid_.find(theirs.uid); known != peerOfUid_.end()) {
      indices.push_back(known->second);
      continue;
    }
    Peer& peer = peers_.emplace_back();
    peer.uid = theirs.uid;
    peer.host = theirs.host;
    peer.self = this;
    peer.index = int(peers_.size() - 1);
    // Peers on this host talk over shared memory, which UCX offers only
    // without peer-failure handling; their liveness is checked by pid
    // instead (checkPeers). Other hosts keep UCX's own detection. This
    // process is never taken for gone.
    if (theirs.host == host_) {
      peer.peerMode = false;
      peer.pid = theirs.uid == uid_ ? 0 : theirs.pid;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(theirs.address.data());
    ep.err_mode = peer.peerMode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = &UcxCallbacks::onEpError;
    ep.err_handler.arg = &peer;
    ucs_status_t st = ucp_ep_create(worker_, &ep, &peer.ep);
    if (st != UCS_OK) {
      std::string why = "UCX ep_create to rank " + std::to_string(r) + " failed: " + ucs_status_string(st);
      if (processGone(peer.index)) {
        why += " (its process, pid " + std::to_string(peer.pid) + " on this host, has exited)";
      }
      peers_.pop_back();
      throw Error(ErrorKind::Internal, why);
    }
    peerOfUid_.emplace(peer.uid, peer.index);
    indices.push_back(peer.index);
  }
  return indices;
}

// Which UCX transport and device carries each peer: on an RDMA cluster the
// first thing to check is that the traffic is on the fabric, not on TCP.
// Peers reached alike are listed together.
std::string UcxWorker::describeLinks(const UcxChannel& ch) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < ch.size(); ++r) {
    const Peer& peer = peers_[size_t(ch.peers[size_t(r)])];
    if (r == ch.rank || !peer.ep) continue;
    std::string how;
#if UCP_API_VERSION >= UCP_VERSION(1, 14)
    ucp_transport_entry_t entries[16];
    ucp_ep_attr_t attr{};
    attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
    attr.transports.entries = entries;
    attr.transports.num_entries = 16;
    attr.transports.entry_size = sizeof(ucp_transport_entry_t);
    if (ucp_ep_query(peer.ep, &attr) != UCS_OK) {
      how = "(transports unknown)";
    } else {
      std::vector<std::string> seen;
      for (unsigned i = 0; i < attr.transports.num_entries; ++i) {
        std::string t = std::string(entries[i].transport_name) + "/" + entries[i].device_name;
        if (std::find(seen.begin(), seen.end(), t) == seen.end()) seen.push_back(t);
      }
      for (auto& t : seen) how += (how.empty() ? "" : " + ") + t;
      if (how.empty()) how = "(no transports)";
    }
#else
    how = "(UCX before 1.14 cannot list an endpoint's transports; UCX_LOG_LEVEL=info shows them)";
#endif
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == how; });
    if (it == groups.end()) {
      groups.push_back({how, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::string out;
  for (auto& [how, ranks] : groups) {
    out += out.empty() ? "" : "; ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
    out += " over " + how;
  }
  return (out.empty() ? "no peers" : out) + " (UCX " + ucp_get_version_string() + ")";
}

// A proposal reserves its block at once: two groups agreeing at the same time
// on this worker (one created, one shrunk) never end on the same block.
uint32_t UcxWorker::proposeChannel(int bits) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t block = 1u << bits;
  const uint32_t base = (nextBase_ + block - 1) / block * block;
  if (base + block > kSourceValues) return kNoChannel;
  nextBase_ = base + block;
  return base;
}

void UcxWorker::takeChannel(uint32_t base, int bits) {
  std::lock_guard<std::mutex> lock(mu_);
  nextBase_ = std::max(nextBase_, base + (1u << bits));
}

void UcxWorker::open(UcxChannel& ch) {
  ch.wakeFd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ch.eventFd = ::epoll_create1(EPOLL_CLOEXEC);
  bool ok = ch.wakeFd >= 0 && ch.eventFd >= 0;
  for (int fd : {ch.wakeFd, efd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ok = ok && ::epoll_ctl(ch.eventFd, EPOLL_CTL_ADD, fd, &ev) == 0;
  }
  if (!ok) {
    const std::string why = std::strerror(errno);
    if (ch.wakeFd >= 0) ::close(ch.wakeFd);
    if (ch.eventFd >= 0) ::close(ch.eventFd);
    throw Error(ErrorKind::Internal, "ringx: a group's UCX event fds could not be made: " + why);
  }
  std::lock_guard<std::mutex> lock(mu_);
  channels_.push_back(&ch);
}

void UcxWorker::close(UcxChannel& ch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    forgetLocked(ch);
    std::erase(channels_, &ch);
    std::erase_if(newlyFailed_, [&](const Failure& f) { return f.channel == &ch; });
  }
  ::close(ch.eventFd);
  ::close(ch.wakeFd);
}

UcxPending* UcxWorker::newPending(UcxChannel& ch, int peer, TransferCallback done, bool isRecv) {
  if ((peer != kAnySource || !isRecv) && (peer < 0 || peer >= ch.size())) {
    throw Error(ErrorKind::InvalidArgument, "ringx: peer rank " + std::to_string(peer) + " out of range");
  }
  auto* p = new UcxPending{this, &ch, nextId_++, peer, isRecv, nullptr, false, false, std::move(done)};
  pending_.emplace(p->id, p);
  return p;
}

namespace {

ucp_request_param_t baseParam(UcxPending* p, MemoryKind mem) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                       UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.user_data = p;
  param.memory_type = mem == MemoryKind::Cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  return param;
}

}  // namespace

TransferId UcxWorker::isend(UcxChannel& ch, int peer, uint64_t tag, const void* buf, size_t bytes, MemoryKind mem,
                            TransferCallback done) {
  std::lock_guard<std::mutex> lock(mu_);
  auto* p = newPending(ch, peer, std::move(done), false);
  if (failedLocked(ch, peer)) {
    queue(p, closedResult(peer));
    return p->id;
  }
  ucp_request_param_t param = baseParam(p, mem);
  param.cb.send = &UcxCallbacks::onSend;
  ucs_status_ptr_t req = ucp_tag_send_nbx(peers_[size_t(ch.peers[size_t(peer)])].ep, buf, bytes,
                                          wireTag(ch, tag, ch.rank), &param);
  const TransferId id = p->id;
  if (!p->completedInline) track(p, req);
  return id;
}

TransferId UcxWorker::irecv(UcxChannel& ch, int peer, uint64_t tag, void* buf, size_t bytes, MemoryKind mem,
                            TransferCallback done) {
  std::lock_guard<std::mutex> lock(mu_);
  auto* p = newPending(ch, peer, std::move(done), true);
  // A peer that finished its part and left may have sent this message
  // before: the receive is posted all the same, to take it from UCX's
  // unexpected queue, and the next progress() ends it as any other receive
  // from that peer if nothing was there.
  if (peer != kAnySource && failedLocked(ch, peer)) newlyFailed_.push_back({ch.peers[size_t(peer)], &ch});
  ucp_request_param_t param = baseParam(p, mem);
  param.cb.recv = &UcxCallbacks::onRecv;
  const uint64_t block = uint64_t(kSourceValues - 1) & ~uint64_t((1u << ch.bits) - 1);
  const uint64_t mask = peer == kAnySource ? kTagUserMask | (block << kTagSourceShift) : ~uint64_t{0};
  ucs_status_ptr_t req =
      ucp_tag_recv_nbx(worker_, buf, bytes, wireTag(ch, tag, peer == kAnySource ? 0 : peer), mask, &param);
  const TransferId id = p->id;
  if (!p->completedInline) track(p, req);
  return id;
}

void UcxWorker::cancel(UcxChannel& ch, TransferId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(id);
  if (it != pending_.end() && it->second->channel == &ch && it->second->request && it->second->isRecv) {
    ucp_request_cancel(worker_, it->second->request);
  }
}

// UCX runs request and endpoint callbacks inside ucp_worker_progress (and
// inside the calls that post or cancel); those only queue, to the view that
// posted the transfer. Here, after UCX has returned, receives from failed
// peers are cancelled, the views whose queues filled are woken, and this
// view's queue is delivered outside the lock: the engine's callbacks never
// run inside UCX, nor hold up another group.
bool UcxWorker::progress(UcxChannel& ch) {
  std::vector<std::pair<TransferCallback, TransferResult>> ready;
  bool did = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t v;
    while (::read(ch.wakeFd, &v, sizeof(v)) > 0) {
    }
    while (ucp_worker_progress(worker_) != 0) did = true;
    did |= cancelReceivesFromFailedPeers();
    for (auto& [p, result] : ch.inbox) {
      pending_.erase(p->id);
      ready.emplace_back(std::move(p->done), result);
      delete p;
    }
    ch.inbox.clear();
    ch.woken = false;
    wakeOthers(ch);
  }
  for (auto& [done, result] : ready) {
    if (done) done(result);
    did = true;
  }
  return did;
}

bool UcxWorker::arm(UcxChannel& ch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ch.inbox.empty() || !newlyFailed_.empty()) return false;
  return ucp_worker_arm(worker_) == UCS_OK;
}

// Only records: the next progress() takes what the peer sent before it died
// or left, then cancels what still waits on it.
void UcxWorker::checkPeers(UcxChannel& ch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int r = 0; r < ch.size(); ++r) {
    const int peer = ch.peers[size_t(r)];
    if (r == ch.rank || failedLocked(ch, r)) continue;
    if (processGone(peer)) {
      peerFailed(peer, nullptr);
    } else if (rankGone(ch, r)) {
      ch.left[size_t(r)] = true;
      peerFailed(peer, &ch);
    }
  }
}

std::vector<int> UcxWorker::failedPeers(const UcxChannel& ch) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> ranks;
  for (int r = 0; r < ch.size(); ++r) {
    if (failedLocked(ch, r)) ranks.push_back(r);
  }
  return ranks;
}

void UcxWorker::forgetPending(UcxChannel& ch) {
  std::lock_guard<std::mutex> lock(mu_);
  forgetLocked(ch);
}

bool UcxWorker::failedLocked(const UcxChannel& ch, int rank) const {
  return peers_[size_t(ch.peers[size_t(rank)])].failed || ch.left[size_t(rank)];
}

bool UcxWorker::processGone(int peer) const {
  const int pid = peers_[size_t(peer)].pid;
  return pid > 0 && !processAlive(pid);
}

// A rank on this host whose process exited, or that left this group.
bool UcxWorker::rankGone(const UcxChannel& ch, int rank) const {
  if (rank == ch.rank || peers_[size_t(ch.peers[size_t(rank)])].pid <= 0) return false;
  return processGone(ch.peers[size_t(rank)]) ||
         ch.presence->ofRank[size_t(ch.presenceIndex[size_t(rank)])].gone();
}

// Called inside UCX (onEpError) or with the lock held: records only.
void UcxWorker::peerFailed(int peer, UcxChannel* channel) {
  if (!channel) {
    if (peers_[size_t(peer)].failed) return;
    peers_[size_t(peer)].failed = true;
  }
  newlyFailed_.push_back({peer, channel});
}

void UcxWorker::track(UcxPending* p, void* req) {
  if (UCS_PTR_IS_ERR(req)) {
    queue(p, fromStatus(p, UCS_PTR_STATUS(req)));
  } else {
    p->request = req;
  }
}

// A completion for the view that posted it; dropped with its entry when the
// view forgot it.
void UcxWorker::queue(UcxPending* p, TransferResult r) {
  if (!p->channel) {
    pending_.erase(p->id);
    delete p;
    return;
  }
  p->channel->inbox.emplace_back(p, std::move(r));
  p->channel->woken = true;
}

// A request's callback, inside UCX. UCX may also call it inside the call that
// posts or cancels the request (UCP_OP_ATTR_FLAG_NO_IMM_CMPL allows that);
// completedInline tells the poster there is no request to keep.
void UcxWorker::complete(UcxPending* p, const TransferResult& r) {
  p->request = nullptr;
  p->completedInline = true;
  queue(p, r);
}

void UcxWorker::forgetLocked(UcxChannel& ch) {
  for (auto& [p, result] : ch.inbox) {
    pending_.erase(p->id);
    delete p;
  }
  ch.inbox.clear();
  std::vector<void*> requests;
  for (auto& [id, p] : pending_) {
    if (p->channel != &ch) continue;
    p->channel = nullptr;
    p->done = nullptr;
    if (p->request) requests.push_back(p->request);
  }
  for (void* req : requests) ucp_request_cancel(worker_, req);
}

TransferResult UcxWorker::fromStatus(UcxPending* p, int st) {
  const auto status = ucs_status_t(st);
  TransferResult r;
  if (status == UCS_OK) return r;
  UcxChannel* ch = p->channel;
  const bool named = ch && p->peer >= 0;
  // UCX's sockets report a refused connection or a socket left with no peer
  // (the peer's process ended) as NOT_CONNECTED, and that can fail a transfer
  // before the endpoint's error callback marks the peer failed.
  if (named && (p->peerClosed || failedLocked(*ch, p->peer) || status == UCS_ERR_CONNECTION_RESET ||
                status == UCS_ERR_NOT_CONNECTED || status == UCS_ERR_ENDPOINT_TIMEOUT ||
                status == UCS_ERR_UNREACHABLE)) {
    return closedResult(p->peer);
  }
  // A same-host endpoint (no peer-failure mode) reports its peer's death as
  // whatever its transport saw (an I/O or shared-memory error), often before
  // the pid watch does: ask the pid now.
  if (named && status != UCS_ERR_CANCELED && status != UCS_ERR_MESSAGE_TRUNCATED && rankGone(*ch, p->peer)) {
    const int peer = ch->peers[size_t(p->peer)];
    if (processGone(peer)) {
      peerFailed(peer, nullptr);
    } else {
      ch->left[size_t(p->peer)] = true;
      peerFailed(peer, ch);
    }
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

// UCX fails sends on a broken endpoint by itself, but tag receives are not
// tied to an endpoint: cancel the ones that wait on a newly failed peer (in
// every group that has it, or in the one group it left), by id, looking each
// up again. Receives from any source wait on all peers and are left to the
// engine, which fails every op once a peer is gone.
bool UcxWorker::cancelReceivesFromFailedPeers() {
  if (newlyFailed_.empty()) return false;
  std::vector<Failure> failures = std::exchange(newlyFailed_, {});
  std::vector<TransferId> victims;
  for (auto& [id, p] : pending_) {
    if (!p->isRecv || !p->request || p->peerClosed || !p->channel || p->peer < 0) continue;
    const int peer = p->channel->peers[size_t(p->peer)];
    const bool waitsOnThem = std::any_of(failures.begin(), failures.end(), [&](const Failure& f) {
      return f.peer == peer && (!f.channel || f.channel == p->channel);
    });
    if (waitsOnThem) victims.push_back(id);
  }
  for (TransferId id : victims) {
    auto it = pending_.find(id);
    if (it == pending_.end() || !it->second->request) continue;
    UcxPending* p = it->second;
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
// worker under an id of its own, forgotten, and is freed when UCX completes
// it or the worker goes.
void UcxWorker::abandon(UcxPending* p) {
  auto* told = new UcxPending{this, p->channel, p->id, p->peer, true, nullptr, true, false, std::move(p->done)};
  pending_[told->id] = told;
  queue(told, closedResult(p->peer));
  p->id = nextId_++;
  p->done = nullptr;
  p->channel = nullptr;
  pending_.emplace(p->id, p);
}

void UcxWorker::wakeOthers(const UcxChannel& ch) {
  for (UcxChannel* other : channels_) {
    if (other == &ch || !other->woken) continue;
    const uint64_t one = 1;
    if (::write(other->wakeFd, &one, sizeof(one)) < 0) {
      // The eventfd is full only if nobody read it for 2^64 wakes.
    }
    other->woken = false;
  }
}

uint64_t UcxWorker::wireTag(const UcxChannel& ch, uint64_t tag, int rank) const {
  return (tag & kTagUserMask) | (uint64_t(ch.base + uint32_t(rank)) << kTagSourceShift);
}

}  // namespace ringx
