#include "core/algorithms/cma_exchange.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/algorithms/registry.h"
#include "core/common/exit_watch.h"

namespace ringx {

namespace {

// The most one transfer step copies before it yields to the progress loop
// (other ops, timeouts). The read rate does not depend on it from 256 KiB to
// whole buffers (docs/algorithms.md), so it only bounds the step's length.
constexpr size_t kPieceBytes = 4 << 20;
// A reduction reads each peer's piece into scratch and reduces it at once,
// while it is still in cache: all pieces together stay well inside one
// core's L2, but each keeps process_vm_readv's fixed cost small.
constexpr size_t kReduceScratchBytes = 256 << 10;
constexpr size_t kMinReducePieceBytes = 16 << 10;
constexpr auto kAliveCheckEvery = std::chrono::milliseconds(100);

}  // namespace

CmaExchange::CmaExchange(ShmArea* shm, const Cma* cma, uint64_t id, const CollIdentity& mine,
                         CmaRecord published, int root)
    : shm_(shm),
      cma_(cma),
      id_(id),
      which_(int(id % 2)),
      mine_(mine),
      published_(published),
      records_(size_t(shm->size())),
      dead_(size_t(shm->size()), false),
      exitsChecked_(exitsSeen()) {
  for (int p = 0; p < size(); ++p) {
    if (p != rank() && (root < 0 || rank() == root || p == root)) peers_.push_back(p);
  }
}

bool CmaExchange::publish() {
  if (shm_->chunksDone().load(std::memory_order_acquire) + 1 < id_ || !shm_->slotFree(id_))
    return false;
  const int me = rank();
  if (fill_) fill_(shm_->slot(me, which_));
  const CmaCause none;
  std::memcpy(shm_->opRecord(me, which_) + sizeof(CmaRecord), &none, sizeof(none));
  std::memcpy(shm_->opRecord(me, which_), &published_, sizeof(published_));
  shm_->header(me, which_) = mine_;
  publishedOwn_ = true;
  shm_->counter(me).store(2 * id_ - 1, std::memory_order_release);
  shm_->ring();
  nextAliveCheck_ = std::chrono::steady_clock::now() + kAliveCheckEvery;
  return true;
}

bool CmaExchange::published(int p) const {
  return dead_[size_t(p)] || shm_->counter(p).load(std::memory_order_acquire) >= 2 * id_ - 1;
}

std::vector<int> CmaExchange::matchWaitsFor() const {
  std::vector<int> ranks;
  for (int p : peers_) {
    if (!published(p)) ranks.push_back(p);
  }
  return ranks;
}

bool CmaExchange::match() {
  // Polled in a loop while peers catch up: no allocation until one lags.
  if (!std::all_of(peers_.begin(), peers_.end(), [&](int p) { return published(p); })) {
    checkAlive(&CmaExchange::matchWaitsFor);
    return failure_.has_value();
  }
  // A peer that failed in this same call is reported after this rank's own
  // checks, which say more about what disagrees.
  std::optional<int> failedPeer;
  for (int p : peers_) {
    if (failure_) break;
    if (dead_[size_t(p)]) continue;
    CollIdentity theirs = shm_->header(p, which_);
    if (failedSameCall(theirs)) {
      if (!failedPeer) failedPeer = p;
    } else {
      theirs.flags &= uint8_t(~(kFailedAfterPublishing | kWithdrawn));
      if (theirs != mine_) fail(Error(ErrorKind::InvalidArgument, mismatch(mine_, theirs, p)), {p, 0});
    }
    std::memcpy(&records_[size_t(p)], shm_->opRecord(p, which_), sizeof(CmaRecord));
  }
  records_[size_t(rank())] = published_;
  if (!failure_ && plan_) {
    try {
      plan_(*this);
    } catch (const Error& e) {
      fail(e);
    }
  }
  if (failedPeer) fail(peerFailed(*failedPeer), causeOf(*failedPeer));
  return true;
}

void CmaExchange::addRead(int peer, uint64_t remote, void* local, size_t bytes) {
  if (bytes) transfers_.push_back({peer, remote, static_cast<std::byte*>(local), bytes, false, -1});
}

void CmaExchange::addWrite(int peer, uint64_t remote, const void* local, size_t bytes) {
  if (bytes)
    transfers_.push_back(
        {peer, remote, static_cast<std::byte*>(const_cast<void*>(local)), bytes, true, -1});
}

void CmaExchange::addReduce(Reduction reduction) {
  if (!reduction.bytes) return;
  if (!scratch_) {
    const size_t others = size_t(std::max(1, size() - 1));
    scratchPiece_ = std::max(kMinReducePieceBytes, kReduceScratchBytes / others / 64 * 64);
    scratch_ = std::make_unique_for_overwrite<std::byte[]>(others * scratchPiece_);
    sources_.resize(size_t(size()));
  }
  transfers_.push_back({rank(), 0, reduction.dst, reduction.bytes, false, int(reductions_.size())});
  reductions_.push_back(std::move(reduction));
}

bool CmaExchange::reducePiece(const Reduction& red, size_t offset, size_t n) {
  std::byte* piece = scratch_.get();
  for (int q = 0; q < size(); ++q) {
    const uint64_t at = records_[size_t(q)].addr + red.offset + offset;
    if (q == rank()) {
      sources_[size_t(q)] = reinterpret_cast<const std::byte*>(at);
      continue;
    }
    if (!copyPiece(q, at, piece, n, false)) return false;
    sources_[size_t(q)] = piece;
    piece += scratchPiece_;
  }
  const size_t es = dtypeSize(red.dtype);
  red.fn(red.dst + offset, sources_.data(), size(), n / es);
  if (red.factor != 1.0) scale(red.dst + offset, n / es, red.dtype, red.factor);
  return true;
}

// Checked around every piece: a peer whose engine abandoned the op (its
// timeout) has its buffer back, and a piece read from it after that may hold
// anything. A write is checked before it only, which leaves one piece's time
// for the peer's caller to reuse the buffer.
bool CmaExchange::copyPiece(int peer, uint64_t remote, std::byte* local, size_t n, bool write) {
  try {
    if (peer != rank() && !stillPublished(peer)) {
      fail(peerFailed(peer), causeOf(peer));
      return false;
    }
    if (write) {
      cma_->write(peer, remote, local, n);
      return true;
    }
    cma_->read(peer, local, remote, n);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (peer != rank() && !stillPublished(peer)) {
      fail(peerFailed(peer), causeOf(peer));
      return false;
    }
    return true;
  } catch (const Error& e) {
    // A peer whose process is gone copies nothing any more: finish need
    // not wait for it.
    const bool closed = e.kind() == ErrorKind::PeerClosed;
    if (closed) dead_[size_t(peer)] = true;
    fail(e, {peer, closed ? 1u : 0u});
    return false;
  }
}

bool CmaExchange::transfer() {
  size_t budget = kPieceBytes;
  while (!failure_ && next_ < transfers_.size() && budget > 0) {
    const Transfer& t = transfers_[next_];
    const bool reduces = t.reduction >= 0;
    const size_t n = std::min({budget, reduces ? scratchPiece_ : budget, t.bytes - offset_});
    const bool ok = reduces ? reducePiece(reductions_[size_t(t.reduction)], offset_, n)
                            : copyPiece(t.peer, t.remote + offset_, t.local + offset_, n, t.write);
    if (!ok) break;
    budget -= n;
    offset_ += n;
    if (offset_ == t.bytes) {
      ++next_;
      offset_ = 0;
    }
  }
  if (!failure_ && next_ < transfers_.size()) {
    notePollProgress();
    return false;
  }
  // Peers that copy into this rank's buffer, or whose result this rank's
  // share completes, must not take it for whole.
  if (failure_) publishFailure(kFailedAfterPublishing);
  if (!waitForPeers_ && !failure_) {
    // One store and one ring for both steps: nothing is left to wait for.
    finished_ = true;
    shm_->finishChunk(id_);
    return true;
  }
  shm_->counter(rank()).store(2 * id_, std::memory_order_release);
  shm_->ring();
  nextAliveCheck_ = std::chrono::steady_clock::now() + kAliveCheckEvery;
  return true;
}

// Peer p no longer reads this rank's buffer: it finished reading, or it is
// in another collective (it compares identities before reading and finds
// this one different), or its process is gone.
bool CmaExchange::doneWith(int p) const {
  if (p == rank() || dead_[size_t(p)]) return true;
  const uint64_t at = shm_->counter(p).load(std::memory_order_acquire);
  if (at >= 2 * id_) return true;
  return at == 2 * id_ - 1 && shm_->header(p, which_) != mine_;
}

std::vector<int> CmaExchange::finishWaitsFor() const {
  std::vector<int> ranks;
  for (int p : peers_) {
    if (!doneWith(p)) ranks.push_back(p);
  }
  return ranks;
}

bool CmaExchange::finish() {
  if (finished_) return true;
  if (!std::all_of(peers_.begin(), peers_.end(), [&](int p) { return doneWith(p); })) {
    checkAlive(&CmaExchange::finishWaitsFor);
    if (!finishWaitsFor().empty()) return false;
  }
  for (int p : peers_) {
    if (!dead_[size_t(p)] && failedSameCall(shm_->header(p, which_))) fail(peerFailed(p), causeOf(p));
  }
  if (failure_) throw *failure_;
  finished_ = true;
  shm_->finishChunk(id_);
  return true;
}

void CmaExchange::abandon() {
  if (!publishedOwn_ || finished_) return;
  // The engine ended the op for a reason of its own, most often a peer's
  // death that its pid watch saw first: a rank still reading this one's
  // buffer then names the dead rank, not this one.
  if (!cause_.closed) {
    for (int p : peers_) {
      if (p != rank() && (dead_[size_t(p)] || !cma_->alive(p))) {
        cause_ = {p, 1};
        break;
      }
    }
  }
  publishFailure(kFailedAfterPublishing | kWithdrawn);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// The cause goes out before the flags: a peer that sees them reads it.
void CmaExchange::publishFailure(uint8_t flags) {
  std::memcpy(shm_->opRecord(rank(), which_) + sizeof(CmaRecord), &cause_, sizeof(cause_));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  shm_->header(rank(), which_).flags |= flags;
}

// A peer that failed but still waits for its peers keeps its buffer: only a
// withdrawn one (or one already in another call) does not.
bool CmaExchange::stillPublished(int peer) const {
  CollIdentity theirs = shm_->header(peer, which_);
  if (theirs.flags & kWithdrawn) return false;
  theirs.flags &= uint8_t(~kFailedAfterPublishing);
  return theirs == mine_;
}

void CmaExchange::checkAlive(std::vector<int> (CmaExchange::*waitingFor)() const) {
  const auto now = std::chrono::steady_clock::now();
  const uint64_t exits = exitsSeen();
  if (now < nextAliveCheck_ && exits == exitsChecked_) return;
  nextAliveCheck_ = now + kAliveCheckEvery;
  exitsChecked_ = exits;
  for (int p : (this->*waitingFor)()) {
    if (p == rank() || cma_->alive(p)) continue;
    dead_[size_t(p)] = true;
    fail(Error(ErrorKind::PeerClosed,
               closedConnection(p) + ": its process exited, or left the group, before it finished this collective"),
         {p, 1});
  }
}

bool CmaExchange::failedSameCall(const CollIdentity& theirs) const {
  CollIdentity unflagged = theirs;
  unflagged.flags &= uint8_t(~(kFailedAfterPublishing | kWithdrawn));
  return (theirs.flags & kFailedAfterPublishing) && unflagged == mine_;
}

CmaCause CmaExchange::causeOf(int p) const {
  CmaCause theirs;
  std::memcpy(&theirs, shm_->opRecord(p, which_) + sizeof(CmaRecord), sizeof(theirs));
  return theirs.closed && theirs.rank >= 0 ? theirs : CmaCause{p, 0};
}

Error CmaExchange::peerFailed(int p) const {
  const CmaCause cause = causeOf(p);
  if (cause.closed) {
    return Error(ErrorKind::PeerClosed,
                 "rank " + std::to_string(p) + " failed in this " + describe(mine_) + " after rank " +
                     std::to_string(cause.rank) +
                     " closed (its process exited, or left the group, before it finished this collective), so "
                     "this rank's result is not complete; the group is no longer usable, create a new one");
  }
  return Error(ErrorKind::InvalidArgument,
               "rank " + std::to_string(p) + " failed in this " + describe(mine_) +
                   " (its own error says why), so this rank's result is not complete; the group "
                   "is no longer usable, create a new one");
}

void CmaExchange::fail(const Error& e, CmaCause cause) {
  if (failure_) return;
  failure_ = e;
  cause_ = cause;
}

StepId addCmaExchange(Schedule& s, ShmArea* shm, const Cma* cma, const CollIdentity& mine,
                      CmaRecord published, CmaExchange::Plan plan, StepId after, int root,
                      CmaExchange::Fill fill) {
  auto x = std::make_shared<CmaExchange>(shm, cma, shm->reserveChunks(1), mine, published, root);
  x->setPlan(std::move(plan));
  x->setFill(std::move(fill));
  s.onAbandon([x](const std::string&) { x->abandon(); });
  StepId step = s.poll([x] { return x->publish(); }, [x] { return x->publishWaitsFor(); }, {after});
  step = s.poll([x] { return x->match(); }, [x] { return x->matchWaitsFor(); }, {step});
  step = s.poll([x] { return x->transfer(); }, nullptr, {step});
  return s.poll([x] { return x->finish(); }, [x] { return x->finishWaitsFor(); }, {step});
}

CollIdentity cmaIdentity(const CollArgs& a, Schedule (*build)(const CollArgs&)) {
  CollIdentity id = identityOf(a);
  const auto all = algorithms();
  const auto row = std::find_if(all.begin(), all.end(),
                                [&](const Algorithm& alg) { return alg.build == build; });
  id.algorithm = uint8_t(1 + (row - all.begin()));
  return id;
}

}  // namespace ringx
