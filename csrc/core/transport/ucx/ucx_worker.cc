#include "core/transport/ucx/ucx_worker.h"

#include <ucp/api/ucp.h>

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <random>
#include <system_error>
#include <thread>

#include "core/common/exit_watch.h"
#include "core/common/fork_generation.h"
#include "core/common/process_state.h"
#include "core/common/topology.h"
#include "core/transport/ucx/ucx_callbacks.h"

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
struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<UcxWorker>> workers;
  // Held while a worker ends: ending one changes UCX's process-wide state,
  // as making one (under mu) does.
  std::mutex ending;
  // The workers whose locks a fork under way holds.
  std::vector<std::shared_ptr<UcxWorker>> heldAcrossFork;
  // How many workers are ending on threads of their own (endLater).
  std::mutex endingCountMu;
  std::condition_variable endedOne;
  int endingNow = 0;
};
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

// A leave notice (ucx_worker.h): the sender's worker, the group's block, and
// the sender's rank in the group.
struct LeaveNotice {
  uint64_t uid;
  uint32_t base;
  int32_t rank;
};
constexpr unsigned kLeaveNoticeId = 1;

// A notice UCX did not send within the call, kept until it has.
struct SentNotice {
  UcxWorker* worker;
  LeaveNotice body;
};

// How long closing a channel progresses the worker for notices UCX could not
// send at once (a connection still being made, a full socket): long enough
// for a live peer's side of that, short enough that closing never waits on a
// dead one in earnest.
constexpr auto kNoticeWait = std::chrono::milliseconds(100);

// How long the caller that drops a worker waits for it to end: a teardown
// among live peers that answer ends within it, and leaves no thread or
// descriptor behind when the caller returns. Longer waits are not the
// caller's.
constexpr auto kCallerWait = std::chrono::milliseconds(250);
// How long the process's exit waits for workers still ending: longer than a
// teardown's bounded waits, so that UCX's own exit handlers never run under
// one.
constexpr auto kExitWait = std::chrono::seconds(6);

void countEnding(int delta) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.endingCountMu);
  r.endingNow += delta;
  if (r.endingNow == 0) r.endedOne.notify_all();
}

void waitForEndings() {
  Registry& r = registry();
  std::unique_lock<std::mutex> lock(r.endingCountMu);
  r.endedOne.wait_for(lock, kExitWait, [&] { return r.endingNow == 0; });
}

}  // namespace

UcxWorker::Claim::Claim(const std::string& tls, int bits) {
  [[maybe_unused]] static const int forkHandlers =
      ::pthread_atfork(&UcxWorker::beforeFork, [] { afterFork(false); }, [] { afterFork(true); });
  std::lock_guard<std::mutex> lock(registry().mu);
  auto& workers = registry().workers;
  const int fork = forkGeneration();
  std::erase_if(workers, [&](const std::weak_ptr<UcxWorker>& w) {
    auto live = w.lock();
    return !live || live->fork_ != fork;
  });
  for (auto& w : workers) {
    auto live = w.lock();
    if (live && live->tls_ == tls && !live->claimed_ && live->hasChannelFor(bits)) {
      worker_ = std::move(live);
      break;
    }
  }
  if (!worker_) {
    worker_ = std::shared_ptr<UcxWorker>(new UcxWorker(tls), &UcxWorker::endLater);
    workers.push_back(worker_);
  }
  worker_->claimed_ = true;
}

UcxWorker::Claim::~Claim() {
  std::lock_guard<std::mutex> lock(registry().mu);
  worker_->claimed_ = false;
}

// A fork waits until no worker is being made or ended and no call into a
// worker is under way, so that the child finds UCX's process-wide state
// whole, and these locks free: the thread that took them is the child's only
// one. The child never uses the parent's workers (Claim skips them): its
// references to them are kept, never dropped.
void UcxWorker::beforeFork() {
  Registry& r = registry();
  r.mu.lock();
  r.ending.lock();
  r.endingCountMu.lock();
  for (auto& w : r.workers) {
    auto live = w.lock();
    if (live && live->fork_ == forkGeneration()) {
      live->mu_.lock();
      r.heldAcrossFork.push_back(std::move(live));
    }
  }
}

void UcxWorker::afterFork(bool child) {
  Registry& r = registry();
  std::vector<std::shared_ptr<UcxWorker>> held = std::exchange(r.heldAcrossFork, {});
  for (auto it = held.rbegin(); it != held.rend(); ++it) (*it)->mu_.unlock();
  // The parent's enders are not in the child, whose exit must not wait for them.
  if (child) r.endingNow = 0;
  r.endingCountMu.unlock();
  r.ending.unlock();
  r.mu.unlock();
  if (child) new std::vector<std::shared_ptr<UcxWorker>>(std::move(held));
}

UcxWorker::UcxWorker(const std::string& tls) : tls_(tls), fork_(forkGeneration()), host_(hostIdentity()) {
  std::random_device rd;
  uid_ = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(::getpid());
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "config_read");
  if (!tls.empty()) ucp_config_modify(config, "TLS", tls.c_str());
  // UCX's memory hooks take a lock of their own in every mmap and munmap,
  // on any thread, out of ringx's reach (beforeFork): a child forked after
  // an ancestor made a worker may have copied it held, and adding the
  // registration cache's hook handler would then wait forever. Such a child
  // goes without the cache.
  static std::atomic<int> firstMadeIn{-1};
  int expected = -1;
  firstMadeIn.compare_exchange_strong(expected, fork_);
  if (firstMadeIn.load() < fork_) ucp_config_modify(config, "RCACHE_ENABLE", "n");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
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
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kLeaveNoticeId;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    am.cb = &UcxCallbacks::onLeaving;
    am.arg = this;
    check(ucp_worker_set_am_recv_handler(worker_, &am), "set_am_recv_handler");
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

// The last group's teardown may wait on live peers that do not answer, for
// a bounded time; the caller that destroyed the group waits with it only
// briefly. A forked child's copy has nothing to end.
void UcxWorker::endLater(UcxWorker* worker) {
  if (worker->fork_ != forkGeneration()) {
    delete worker;
    return;
  }
  [[maybe_unused]] static const int atExit = std::atexit(&waitForEndings);
  countEnding(1);
  auto ended = std::make_shared<std::promise<void>>();
  std::future<void> done = ended->get_future();
  std::thread ender;
  try {
    ender = std::thread([worker, ended] {
      ::pthread_setname_np(::pthread_self(), "ringx-ucx-end");
      delete worker;
      countEnding(-1);
      ended->set_value();
    });
  } catch (const std::system_error&) {
    delete worker;
    countEnding(-1);
    return;
  }
  if (done.wait_for(kCallerWait) == std::future_status::ready) {
    ender.join();
  } else {
    ender.detach();
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
  std::lock_guard<std::mutex> ending(registry().ending);
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
      if (peer.pid != processId()) peer.exitWatch = watchExit(peer.pid);
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
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (i) out += ',';
      out += std::to_string(ranks[i]);
    }
    out += " over " + how;
  }
  return out.empty() ? "no peers" : out;
}

// A proposal reserves its block at once: two groups agreeing at the same time
// on this worker (one created, one shrunk) never end on the same block.
uint32_t UcxWorker::proposeChannel(int bits) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t base = nextFreeBase(bits);
  if (base != kNoChannel) nextBase_ = base + (1u << bits);
  return base;
}

bool UcxWorker::hasChannelFor(int bits) {
  std::lock_guard<std::mutex> lock(mu_);
  return nextFreeBase(bits) != kNoChannel;
}

// With mu_ held: the next block of 2^bits values aligned to its size, or
// kNoChannel where none is left.
uint32_t UcxWorker::nextFreeBase(int bits) const {
  const uint32_t block = 1u << bits;
  const uint32_t base = (nextBase_ + block - 1) / block * block;
  return base + block > kSourceValues ? kNoChannel : base;
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
    tellLeaving(ch);
  }
  // Notices UCX could not send at once need the worker progressed, and no
  // other group may do that soon. What this progress completes for the
  // other groups is queued to them: wake them to take it.
  const auto deadline = std::chrono::steady_clock::now() + kNoticeWait;
  for (bool progressed = false;; progressed = true) {
    std::lock_guard<std::mutex> lock(mu_);
    if (noticesInFlight_ == 0 || std::chrono::steady_clock::now() >= deadline) {
      if (progressed) wakeOthers(ch);
      break;
    }
    ucp_worker_progress(worker_);
  }
  ::close(ch.eventFd);
  ::close(ch.wakeFd);
}

// Peers on this host see this rank's presence mark go; those known dead or
// gone from the group are not told.
void UcxWorker::tellLeaving(const UcxChannel& ch) {
  for (int r = 0; r < ch.size(); ++r) {
    Peer& peer = peers_[size_t(ch.peers[size_t(r)])];
    if (r == ch.rank || ch.left[size_t(r)] || peer.failed || !peer.peerMode || !peer.ep) continue;
    auto* sent = new SentNotice{this, {uid_, ch.base, ch.rank}};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send = &UcxCallbacks::onNoticeSent;
    param.user_data = sent;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    ++noticesInFlight_;
    ucs_status_ptr_t req =
        ucp_am_send_nbx(peer.ep, kLeaveNoticeId, &sent->body, sizeof(sent->body), nullptr, 0, &param);
    if (!UCS_PTR_IS_PTR(req)) {
      --noticesInFlight_;
      delete sent;
    }
  }
}

void UcxCallbacks::onNoticeSent(void* request, ucs_status_t, void* user) {
  auto* sent = static_cast<SentNotice*>(user);
  --sent->worker->noticesInFlight_;
  delete sent;
  ucp_request_free(request);
}

ucs_status_t UcxCallbacks::onLeaving(void* arg, const void* header, size_t headerLength, void*, size_t,
                                     const ucp_am_recv_param_t*) {
  LeaveNotice notice{};
  if (headerLength == sizeof(notice)) {
    std::memcpy(&notice, header, sizeof(notice));
    static_cast<UcxWorker*>(arg)->heardLeaving(notice.uid, notice.base, notice.rank);
  }
  return UCS_OK;
}

// Inside UCX, with the lock held: records only, as a peer's death does. A
// notice for a group this worker has no channel of is dropped; its channel
// opened before this rank told the others it was connected (ucx_view.cc), so
// that group is gone here too.
void UcxWorker::heardLeaving(uint64_t uid, uint32_t base, int rank) {
  auto known = peerOfUid_.find(uid);
  if (known == peerOfUid_.end()) return;
  for (UcxChannel* ch : channels_) {
    if (ch->base != base || rank < 0 || rank >= ch->size() || rank == ch->rank) continue;
    if (ch->peers[size_t(rank)] != known->second || ch->left[size_t(rank)]) continue;
    ch->left[size_t(rank)] = true;
    ch->woken = true;
    peerFailed(known->second, ch);
  }
}

}  // namespace ringx
