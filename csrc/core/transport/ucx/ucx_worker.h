// One UCX context and worker per process (per UCX_TLS value), shared by every
// group: the endpoints to each peer process, made once and reused by every
// group among the same processes, and the progress of the worker on behalf of
// every group's view (ucx_view.h).
//
// Channels. A group's messages carry a channel in the 15-bit source field of
// the tag (transport.h): a block of 2^bits values, aligned to its size, of
// which the low bits are the sender's rank in the group. Blocks of the groups
// live on one worker never overlap, so a receive, from one source or from
// any, never matches another group's message, whatever the two groups' sizes.
// Blocks are handed out in increasing order and never reused while the worker
// lives: a block freed here may still be live on a peer that has not
// destroyed its group yet. Ranks agree on a block without a round trip of its
// own: each proposes its worker's next free one in what it publishes at
// creation, and all take the largest, which is free on every member.
//
// Progress. Whoever calls progress() on any view progresses the whole worker,
// under the worker's lock; each completion goes to the queue of the view that
// posted the transfer, and a view whose queue got something from another
// view's progress is woken through its own eventfd. Each view then runs its
// own callbacks, outside the lock, on its own communicator's thread. No group
// can starve another: any group's progress moves every group's transfers, and
// the lock is held only while UCX runs, never while the engine does. A view's
// timeout or abort cancels only its own transfers (forgetPending). A peer
// process that dies (its endpoint fails, or its pid is gone) fails the
// receives of every view that waits on it, at the next progress of any of
// them; a peer that left one group but lives on fails that group's receives
// only.
//
// Leaving. A rank that destroys a group while its process keeps others
// leaves its endpoints open, so nothing closes for its peers. Those on this
// host see its presence mark in the group go (presence.h); those on other
// hosts get a leave notice, a small active message naming the group's block
// and the rank, sent when the group's channel closes. The notice is never
// waited for beyond a moment: a peer that does not take it still learns at
// the group's timeout, or when the process's endpoints close.
//
// Ending. With the last group's view, the worker flushes and closes its
// endpoints, waiting a bounded time on live peers that do not answer; that
// runs on a thread of its own, which the caller destroying the last group
// waits for only briefly, and the process's exit waits for to the end.
//
// Fork: a worker belongs to the process that created it. A forked child never
// gets the parent's worker from claim(), and never touches the copy it
// inherited. A fork waits for a worker being made or ended, and for any call
// into a worker under way (each is short, and a teardown bounded), so the
// child starts with UCX's process-wide state whole and ringx's locks free,
// and can make workers of its own: without UCX's registration cache, whose
// memory hooks' lock a fork may copy held (ucx_worker.cc).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/transport/shm/presence.h"
#include "core/transport/transport.h"
#include "core/transport/ucx/peer_card.h"

struct ucp_context;
struct ucp_worker;
struct ucp_ep;

namespace ringx {

class UcxWorker;

// A group's state on the worker: its block of the tag space, its members'
// peer processes, whether each member left the group, and the completions
// waiting for the group's progress. Owned by the group's view; the worker
// reaches it only under its lock, through the transfers the view posted.
struct UcxChannel {
  uint32_t base = 0;  // the block's first source-field value
  int bits = 0;       // the block holds 2^bits ranks
  int rank = -1;      // this process's rank in the group
  std::vector<int> peers;  // the worker's peer index of each rank
  // Each rank's presence mark in the group, and this rank's own: shared with
  // the groups shrunk from this one, which reuse the marks.
  struct Presence {
    PresenceMark mine;
    std::vector<PeerPresence> ofRank;
  };
  std::shared_ptr<Presence> presence;
  std::vector<int> presenceIndex;  // rank -> index into presence->ofRank
  std::vector<bool> left;          // ranks seen gone from this group only

  // The rest belongs to the worker's lock.
  std::vector<std::pair<struct UcxPending*, TransferResult>> inbox;
  bool woken = false;
  // Reading an empty eventfd is a syscall on every progress pass, a good part
  // of a small call's cost: it is read only once written.
  bool wakeFdWritten = false;
  int wakeFd = -1;   // written when another view's progress filled the inbox
  int eventFd = -1;  // epoll over wakeFd and the worker's event fd

  int size() const { return int(peers.size()); }
};

// One transfer in flight, from post to the callback.
struct UcxPending {
  UcxWorker* worker;
  UcxChannel* channel;  // null once its group forgot it
  TransferId id;
  int peer;  // the group's rank, or kAnySource
  bool isRecv;
  void* request = nullptr;
  bool peerClosed = false;
  bool completedInline = false;
  TransferCallback done;
};

class UcxWorker {
 public:
  // A live worker for `tls` that no group creation in progress holds and
  // that has a tag channel left for a group of 2^bits ranks, or a new one.
  // The claim keeps two ranks of one group that are threads of one process
  // (tests, thread-based launchers) on workers of their own: a message names
  // its group and sender, not its receiver, so two ranks of a group on one
  // worker would take each other's messages. Ranks of a group create it
  // together, so their claims overlap. A worker's channels are never reused
  // (a late message of an ended group would match the next one's receives),
  // so a process that keeps one group while it replaces others (torchft's
  // reconfigurations) would use them all up: it gets a fresh worker instead,
  // and the old one ends with the last group on it.
  class Claim {
   public:
    Claim(const std::string& tls, int bits);
    ~Claim();
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;
    const std::shared_ptr<UcxWorker>& worker() const { return worker_; }

   private:
    std::shared_ptr<UcxWorker> worker_;
  };

  explicit UcxWorker(const std::string& tls);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // What this process publishes about its worker; presence is the group's.
  PeerCard card(const std::string& presence) const;

  // The peer index of each card's process, endpoints made for those new to
  // this worker. Throws naming the rank whose endpoint could not be made.
  std::vector<int> connect(const std::vector<PeerCard>& cards);
  std::string describeLinks(const UcxChannel& ch) const;

  // The block this worker proposes for a group of 2^bits ranks, reserved;
  // kNoChannel when the tag space is used up (the largest proposal, so that
  // every rank sees it win). takeChannel: the block the ranks agreed.
  static constexpr uint32_t kNoChannel = UINT32_MAX;
  uint32_t proposeChannel(int bits);
  void takeChannel(uint32_t base, int bits);
  bool hasChannelFor(int bits);

  // A group's channel joins the worker (eventfds made) or leaves it: its
  // transfers are forgotten, its queue dropped, and its peers on other hosts
  // told that this rank left.
  void open(UcxChannel& ch);
  void close(UcxChannel& ch);

  TransferId isend(UcxChannel& ch, int peer, uint64_t tag, const void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done);
  TransferId irecv(UcxChannel& ch, int peer, uint64_t tag, void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done);
  void cancel(UcxChannel& ch, TransferId id);
  bool progress(UcxChannel& ch);
  bool arm(UcxChannel& ch);
  void checkPeers(UcxChannel& ch);
  std::vector<int> failedPeers(const UcxChannel& ch) const;
  void forgetPending(UcxChannel& ch);

 private:
  struct Peer {
    uint64_t uid = 0;
    std::string host;
    int pid = 0;  // on this host; 0 elsewhere
    std::shared_ptr<void> exitWatch;  // wakes the engine's waits when it exits (exit_watch.h)
    ucp_ep* ep = nullptr;
    bool peerMode = true;  // UCX's peer-failure handling (other hosts)
    bool failed = false;
    UcxWorker* self = nullptr;
    int index = 0;
  };
  struct Failure {
    int peer;             // worker peer index
    UcxChannel* channel;  // only this group's receives; null: every group's
  };

  bool failedLocked(const UcxChannel& ch, int rank) const;
  bool processGone(int peer) const;
  bool rankGone(const UcxChannel& ch, int rank) const;
  void peerFailed(int peer, UcxChannel* channel);
  UcxPending* newPending(UcxChannel& ch, int peer, TransferCallback done, bool isRecv);
  void track(UcxPending* p, void* req);
  void queue(UcxPending* p, TransferResult r);
  void complete(UcxPending* p, const TransferResult& r);
  void forgetLocked(UcxChannel& ch);
  TransferResult fromStatus(UcxPending* p, int status);
  bool cancelReceivesFromFailedPeers();
  void abandon(UcxPending* p);
  void wakeOthers(const UcxChannel& ch);
  uint64_t wireTag(const UcxChannel& ch, uint64_t tag, int rank) const;
  uint32_t nextFreeBase(int bits) const;
  void tellLeaving(const UcxChannel& ch);
  void heardLeaving(uint64_t uid, uint32_t base, int rank);
  void teardown();
  static void endLater(UcxWorker* worker);
  static void beforeFork();
  static void afterFork(bool child);

  friend struct UcxCallbacks;  // UCX's callbacks (ucx_callbacks.h, with UCX's types)

  mutable std::mutex mu_;
  std::string tls_;
  int fork_ = 0;
  bool claimed_ = false;  // the registry's lock
  uint64_t uid_ = 0;
  std::string host_;
  std::vector<uint8_t> address_;
  ucp_context* context_ = nullptr;
  ucp_worker* worker_ = nullptr;
  int efd_ = -1;
  uint32_t nextBase_ = 0;
  std::deque<Peer> peers_;  // stable addresses: endpoint callbacks hold them
  std::unordered_map<uint64_t, int> peerOfUid_;
  std::vector<UcxChannel*> channels_;
  std::unordered_map<TransferId, UcxPending*> pending_;
  std::vector<Failure> newlyFailed_;
  TransferId nextId_ = 1;
  int noticesInFlight_ = 0;
};

}  // namespace ringx
