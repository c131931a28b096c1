// The transport contract the engine drives: non-blocking tagged send/receive
// between the ranks of one communicator, progressed by exactly one thread.
//
// Threading: every call on one transport happens on its communicator's
// progressing thread, so a transport needs no lock for its own state; one
// that shares state with other communicators' transports (UCX's one worker
// per process, ucx_worker.h) locks that. Callbacks fire only from
// inside progress(), after the transport's own machinery has returned (never
// from isend/irecv/cancel/checkPeers, nor from inside a library callback):
// the engine may then post or cancel from a callback, and cancels outside
// them, without either side re-entering the other.
//
// Tags: the caller owns bits 0..47 and bit 63; bits 48..62 carry the sender's
// rank, set by the transport, so receives can name their source or match any.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/common/types.h"

namespace ringx {

inline constexpr int kAnySource = -1;
inline constexpr int kTagSourceShift = 48;
inline constexpr uint64_t kTagSourceMask = uint64_t{0x7fff} << kTagSourceShift;
inline constexpr uint64_t kTagUserMask = ~kTagSourceMask;
inline constexpr int kMaxRanks = 0x7fff;

inline uint64_t tagWithSource(uint64_t tag, int rank) {
  return (tag & kTagUserMask) | (uint64_t(rank) << kTagSourceShift);
}
inline int tagSource(uint64_t wireTag) { return int((wireTag & kTagSourceMask) >> kTagSourceShift); }

struct TransferResult {
  bool ok = true;
  ErrorKind errorKind = ErrorKind::Internal;  // meaningful when !ok
  std::string error;                         // meaningful when !ok
  size_t bytes = 0;                          // bytes received (receives)
  int source = -1;                           // sender (receives)
};

// What a transfer with a peer whose connection closed ends with.
inline TransferResult closedResult(int peer) {
  TransferResult r;
  r.ok = false;
  r.errorKind = ErrorKind::PeerClosed;
  r.error = closedConnection(peer);
  return r;
}

using TransferCallback = std::function<void(const TransferResult&)>;
using TransferId = uint64_t;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  virtual TransferId isend(int peer, uint64_t tag, const void* buf, size_t bytes, MemoryKind mem,
                           TransferCallback done) = 0;
  // peer may be kAnySource. A message longer than `bytes` fails the receive;
  // a shorter one succeeds with result.bytes telling the length.
  virtual TransferId irecv(int peer, uint64_t tag, void* buf, size_t bytes, MemoryKind mem,
                           TransferCallback done) = 0;

  // Asks for a pending transfer to end early; its callback still fires, with
  // ok=false. Sends that are already on the wire may complete normally instead.
  virtual void cancel(TransferId id) = 0;

  // Runs completions; returns whether anything happened.
  virtual bool progress() = 0;

  // A file descriptor that becomes readable when progress() has work, valid
  // after arm() returned true. arm() returns false when work is already
  // pending and the caller must not sleep.
  virtual int eventFd() const = 0;
  virtual bool arm() = 0;

  // Looks for peers that died without the transport noticing (shared-memory
  // peers give no signal) and marks them failed; the next progress() fails
  // their transfers. Called now and then by the engine while operations are
  // pending.
  virtual void checkPeers() {}

  // Peers whose connection failed, in rank order.
  virtual std::vector<int> failedPeers() const = 0;

  // Whoever posted the pending transfers is gone, but the transport lives on
  // for a new owner (a group shrunk from this one): receives are cancelled,
  // and no callback of a transfer posted so far runs any more.
  virtual void forgetPending() = 0;

  // A group shrunk from this one reuses its connections (dist.shrink_group
  // must not need the store, which may have died with an excluded rank).
  // subset() is a transport among `ranks` (ranks of this transport, in the
  // new group's order, this rank among them) over the same connections, on
  // `channel`: its messages never match those of another channel, so
  // nothing the parent left in flight reaches the child. Channels are
  // agreed by the ranks: each proposes nextChannel() and all take the
  // largest. The two may outlive each other, but only one is used at a time
  // (the parent only after forgetPending(), and not once its child exists).
  // Null where the transport cannot share its connections, or has no
  // channel left; nextChannel() is 0 then.
  virtual uint32_t nextChannel() const { return 0; }
  virtual std::unique_ptr<Transport> subset(const std::vector<int>& ranks, uint32_t channel) {
    (void)ranks;
    (void)channel;
    return nullptr;
  }
};

}  // namespace ringx
