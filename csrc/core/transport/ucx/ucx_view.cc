#include "core/transport/ucx/ucx_view.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <bit>
#include <new>

#include "core/common/fork_generation.h"
#include "core/common/log.h"
#include "core/transport/ucx/ucx_transport.h"

namespace ringx {

UcxView::UcxView(std::shared_ptr<UcxWorker> worker, std::unique_ptr<UcxChannel> channel)
    : worker_(std::move(worker)), channel_(std::move(channel)), fork_(forkGeneration()) {
  worker_->open(*channel_);
}

UcxView::~UcxView() {
  // A forked child's copy: the worker's lock may be held by a thread that is
  // not in the child, and the presence mark is the parent's. Leak both.
  if (forkGeneration() != fork_) {
    (void)channel_.release();
    new std::shared_ptr<UcxWorker>(std::move(worker_));
    return;
  }
  worker_->close(*channel_);
}

TransferId UcxView::isend(int peer, uint64_t tag, const void* buf, size_t bytes, MemoryKind mem,
                          TransferCallback done) {
  return worker_->isend(*channel_, peer, tag, buf, bytes, mem, std::move(done));
}

TransferId UcxView::irecv(int peer, uint64_t tag, void* buf, size_t bytes, MemoryKind mem, TransferCallback done) {
  return worker_->irecv(*channel_, peer, tag, buf, bytes, mem, std::move(done));
}

void UcxView::cancel(TransferId id) { worker_->cancel(*channel_, id); }
bool UcxView::progress() { return worker_->progress(*channel_); }
bool UcxView::arm() { return worker_->arm(*channel_); }
void UcxView::checkPeers() { worker_->checkPeers(*channel_); }
std::vector<int> UcxView::failedPeers() const { return worker_->failedPeers(*channel_); }
void UcxView::forgetPending() { worker_->forgetPending(*channel_); }

// Transport's channel numbers start at 1 (0 says none is left); the
// worker's blocks start at 0.
uint32_t UcxView::nextChannel() const {
  const uint32_t base = worker_->proposeChannel(channel_->bits);
  return base == UcxWorker::kNoChannel ? 0 : base + 1;
}

std::unique_ptr<Transport> UcxView::subset(const std::vector<int>& ranks, uint32_t channel) {
  if (channel == 0) return nullptr;
  auto child = std::make_unique<UcxChannel>();
  child->base = channel - 1;
  child->bits = channel_->bits;
  child->presence = channel_->presence;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= size()) {
      throw Error(ErrorKind::InvalidArgument, "ringx: peer rank " + std::to_string(r) + " out of range");
    }
    if (r == rank()) child->rank = int(i);
    child->peers.push_back(channel_->peers[size_t(r)]);
    child->presenceIndex.push_back(channel_->presenceIndex[size_t(r)]);
  }
  if (child->rank < 0) {
    throw Error(ErrorKind::InvalidArgument, "ringx: a subset of a group must hold the rank that makes it");
  }
  child->left.assign(ranks.size(), false);
  worker_->takeChannel(child->base, child->bits);
  return std::make_unique<UcxView>(worker_, std::move(child));
}

namespace {

// A shared-memory endpoint attaches to the peer's segment when it is
// created, so a peer must keep its worker until every rank has connected: a
// rank that returned first and destroyed its group at once (it had nothing
// to do in it, and it was its process's last) removed the segment under a
// slower peer, whose ep_create then failed with "Shared memory error". No
// rank returns, and so none can destroy its worker, before all have
// connected; the presence marks' names can then go. The wait is the store's,
// bounded by its timeout. A rank that failed to connect still arrives, with
// its reason, so that every rank fails at once and names it instead of
// waiting out the store.
void waitUntilAllConnected(Store& store, const std::string& keyPrefix, int rank, int size,
                           const std::string& failure) {
  if (!failure.empty() && store.add(keyPrefix + "/connect-failures", 1) == 1) {
    const std::string told = "rank " + std::to_string(rank) + " could not connect: " + failure;
    store.set(keyPrefix + "/connect-failure", std::vector<uint8_t>(told.begin(), told.end()));
  }
  if (size > 1) {
    if (store.add(keyPrefix + "/connected", 1) == size) store.set(keyPrefix + "/all-connected", {1});
    store.get(keyPrefix + "/all-connected");
  }
  if (failure.empty() && store.add(keyPrefix + "/connect-failures", 0) > 0) {
    std::vector<uint8_t> told = store.get(keyPrefix + "/connect-failure");
    throw Error(ErrorKind::Internal, "ringx: " + std::string(told.begin(), told.end()));
  }
}

}  // namespace

std::unique_ptr<Transport> makeUcxTransport(Store& store, int rank, int size, const UcxOptions& opts) {
  const int bits = std::bit_width(unsigned(size - 1));
  UcxWorker::Claim claim(opts.tls, bits);
  const std::shared_ptr<UcxWorker>& worker = claim.worker();
  auto ch = std::make_unique<UcxChannel>();
  ch->rank = rank;
  ch->bits = bits;
  ch->presence = std::make_shared<UcxChannel::Presence>();
  const std::shared_ptr<UcxChannel::Presence> presence = ch->presence;
  PeerCard mine = worker->card(presence->mine.name());
  mine.channel = worker->proposeChannel(ch->bits);
  store.set(opts.keyPrefix + "/addr/" + std::to_string(rank), mine.encode());
  std::string failure;
  std::unique_ptr<UcxView> view;
  try {
    const auto published = getFromEveryRank(store, opts.keyPrefix + "/addr", size);
    std::vector<PeerCard> cards;
    for (int p = 0; p < size; ++p) {
      cards.push_back(p == rank ? mine : PeerCard::decode(published[size_t(p)]));
      const PeerCard& theirs = cards.back();
      ch->base = std::max(ch->base, theirs.channel);
      // Mapped now: its owner removes the name once every rank connected.
      ch->presence->ofRank.emplace_back(p != rank && theirs.host == mine.host ? theirs.presence : std::string());
    }
    if (ch->base == UcxWorker::kNoChannel) {
      int p = 0;
      while (cards[size_t(p)].channel != UcxWorker::kNoChannel) ++p;
      throw Error(ErrorKind::Internal,
                  "the process of rank " + std::to_string(p) + " has no UCX tag channel left for a group of " +
                      std::to_string(size) + " ranks (each group a process makes takes one for the life of "
                      "its UCX worker, which ends with its last ringx group); make fewer groups");
    }
    ch->peers = worker->connect(cards);
    worker->takeChannel(ch->base, ch->bits);
    ch->left.assign(size_t(size), false);
    ch->presenceIndex.resize(size_t(size));
    for (int p = 0; p < size; ++p) ch->presenceIndex[size_t(p)] = p;
    // Open before this rank says it is connected: a peer may destroy the
    // group as soon as every rank has, and its leave notice must find the
    // channel here.
    view = std::make_unique<UcxView>(worker, std::move(ch));
  } catch (const Error& e) {
    failure = e.what();
  }
  waitUntilAllConnected(store, opts.keyPrefix, rank, size, failure);
  presence->mine.unlinkName();
  if (!failure.empty()) throw Error(ErrorKind::Internal, "ringx: " + failure);
  if (logLevel() >= LogLevel::Info) {
    RINGX_LOG(Info, "ringx: rank " << rank << " on UCX " << ucp_get_version_string()
                            << (opts.tls.empty() ? std::string() : " (transports " + opts.tls + ")") << ": "
                            << worker->describeLinks(*view->channel()));
  }
  return view;
}

}  // namespace ringx
