// UcxWorker's transfers: posting sends and receives on a group's channel,
// progressing the shared worker, handing each completion to the view that
// posted it, and tracking the peers that failed (ucx_worker.h says who
// progresses, and why the engine's callbacks never run inside UCX).
#include <ucp/api/ucp.h>

#include <unistd.h>

#include <algorithm>

#include "core/common/process_state.h"
#include "core/transport/ucx/ucx_callbacks.h"
#include "core/transport/ucx/ucx_worker.h"

namespace ringx {

void UcxCallbacks::onSend(void* request, ucs_status_t status, void* user) {
  auto* p = static_cast<UcxPending*>(user);
  UcxWorker* self = p->worker;
  TransferResult r = self->fromStatus(p, status);
  ucp_request_free(request);
  self->complete(p, r);
}

void UcxCallbacks::onRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
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

void UcxCallbacks::onEpError(void* arg, ucp_ep_h, ucs_status_t) {
  auto* peer = static_cast<UcxWorker::Peer*>(arg);
  peer->self->peerFailed(peer->index, nullptr);
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
  const uint64_t block = (kTagSourceMask >> kTagSourceShift) & ~uint64_t((1u << ch.bits) - 1);
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
    if (ch.wakeFdWritten) {
      uint64_t v;
      while (::read(ch.wakeFd, &v, sizeof(v)) > 0) {
      }
      ch.wakeFdWritten = false;
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
    other->wakeFdWritten = true;
    other->woken = false;
  }
}

uint64_t UcxWorker::wireTag(const UcxChannel& ch, uint64_t tag, int rank) const {
  return (tag & kTagUserMask) | (uint64_t(ch.base + uint32_t(rank)) << kTagSourceShift);
}

}  // namespace ringx
