// What the ipc path (ipc_collective.h) of one group on one host shares
// between its ranks, set up once per group:
//   - each rank's ringx-owned device buffer (Device::allocShared), which
//     every rank maps (openShared): a rank copies its data in, its peers'
//     kernels read it out;
//   - each rank's control segment of host shared memory, which every rank
//     maps and registers with its device (mapHost):
//       mailboxes, one word per (phase, writer), each in its own cache line:
//       rank q's stream writes the round it finished into word (phase, q)
//       of every peer's segment, and a rank's stream waits on its own;
//       an identity ring: kIdentitySlots records of the collective a rank
//       issued (its CollIdentity, published under its seq), and per slot
//       the last seq this rank checked in every peer's record, so a rank
//       rewrites a slot only once every peer has compared it. Ops that share
//       a slot (seqs kIdentitySlots apart, or more) publish in the order
//       they were issued, however many are in flight: each waits until the
//       one issued before it in that slot has published (claimSlot).
// Handles and segment names go through the store; the names are removed
// once every rank has mapped them, so a crash leaves nothing in /dev/shm.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/common/identity.h"
#include "core/common/shm_segment.h"
#include "core/common/store.h"
#include "core/device/device.h"

namespace ringx {

class IpcPeers {
 public:
  // Arrive: the round's data is in the writer's buffer. Reduced (two-shot):
  // the writer's reduced portion is. Left: the writer no longer reads the
  // owner's buffer for the round, which the owner may then refill.
  enum Phase : int { Arrive, Reduced, Left };
  static constexpr int kPhases = 3;
  static constexpr int kIdentitySlots = 16;

  // Collective over the group's ranks (all on this host, `size` at most
  // flags::kMaxFlags + 1): each allocates its buffer of `bufferBytes` and
  // its control segment, publishes both under `keyPrefix`, and maps every
  // peer's. Throws Error naming the rank and what failed.
  static std::unique_ptr<IpcPeers> create(Device& device, Store& store, const std::string& keyPrefix, int rank,
                                          int size, size_t bufferBytes);
  ~IpcPeers();
  IpcPeers(const IpcPeers&) = delete;
  IpcPeers& operator=(const IpcPeers&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t bufferBytes() const { return bufferBytes_; }
  Device& device() const { return device_; }
  // Rank q's buffer as this process maps it (its own included).
  std::byte* buffer(int q) const { return buffers_[size_t(q)].get(); }
  // The word that `writer` sets for `phase` in `owner`'s segment.
  uint32_t* mailbox(int owner, Phase phase, int writer) const;
  // This rank's words for `phase` from every peer (waits), and its word for
  // `phase` in every peer's segment (signals), in rank order without itself.
  std::vector<const uint32_t*> inbox(Phase phase) const;
  std::vector<uint32_t*> outbox(Phase phase) const;

  // The identity ring (see above).
  std::atomic<uint64_t>& published(int q, int slot) const;
  CollIdentity& identity(int q, int slot) const;
  std::atomic<uint64_t>& checked(int q, int slot) const;

  // `n` consecutive rounds for one op; returns the first. Every rank
  // reserves them in the order it issues its ops, which all ranks share.
  // Throws Error(Internal) when the flags' 31 bits are used up.
  uint32_t reserveRounds(uint32_t n);
  // The seq of the op issued before `seq` in its identity slot (0 for
  // none), which must have published before this one may; records `seq`
  // as the slot's latest. Called in issue order.
  uint64_t claimSlot(uint64_t seq);

  // A failed op leaves failed bits in the flags, rounds its peers may never
  // reach and identity slots never checked, so the group's ipc path cannot
  // run another op: the first failure is kept (`why` names the op and what
  // went wrong) and every later op is refused with it.
  void fail(const std::string& why);
  std::optional<std::string> failure() const;

 private:
  IpcPeers(Device& device, int rank, int size, size_t bufferBytes)
      : device_(device), rank_(rank), size_(size), bufferBytes_(bufferBytes) {}
  std::byte* line(int q, size_t index) const;

  Device& device_;
  const int rank_, size_;
  const size_t bufferBytes_;
  std::vector<std::shared_ptr<std::byte>> buffers_;
  std::vector<std::unique_ptr<ShmSegment>> control_;
  std::vector<std::shared_ptr<void>> registered_;
  mutable std::mutex mu_;
  uint32_t lastRound_ = 0;
  uint64_t lastInSlot_[kIdentitySlots] = {};
  std::optional<std::string> failure_;
};

// A flag word an op's device waits on (in this rank's segment: `phase`,
// written by `writer`) and the last value it waits for there: which peers a
// pending op still waits on, and whose failure its device saw.
struct IpcAwaited {
  IpcPeers::Phase phase;
  int writer;
  uint32_t last;
};

}  // namespace ringx
