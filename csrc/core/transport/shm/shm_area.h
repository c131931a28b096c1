// Memory that every rank of a single-host communicator can read directly:
// each rank owns one POSIX shared-memory segment (a control block and two
// data slots) and maps every peer's. Intra-host algorithms reduce straight
// out of peers' slots instead of sending messages.
//
// Synchronisation is by monotonic counters, one per rank in its own cache
// line, written with release and read with acquire. A rank that moves a
// counter rings the doorbells of the peers asleep waiting for it
// (futex_bell.h), which costs a system call only when one is.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/common/futex_bell.h"
#include "core/common/identity.h"
#include "core/common/shm_segment.h"
#include "core/common/store.h"

namespace ringx {

class ShmArea {
 public:
  // Collective over the ranks. Returns nullptr when the ranks are not all on
  // this host (same kernel boot, /dev/shm and user), or when a rank could not
  // reserve its segment in /dev/shm (logged as a warning on every rank), so
  // callers fall back to the network algorithms.
  static std::unique_ptr<ShmArea> create(Store& store, const std::string& keyPrefix, int rank, int size,
                                         size_t slotBytes);
  ~ShmArea();
  ShmArea(const ShmArea&) = delete;
  ShmArea& operator=(const ShmArea&) = delete;

  // A group shrunk from this one takes the area of its ranks without a
  // store: subset() is the area over the segments of `ranks` (area ranks,
  // this rank among them), sharing their mappings, which last as long as
  // either area does; null for fewer than two ranks. Its chunks start again
  // from the first, so each of `ranks` first calls restart(): its counter
  // and released chunk back to 0, as in a new segment. Lowering them never
  // lets a peer's pending wait through; the ranks must then agree (the
  // survivors' exchange) before any uses the subset.
  std::unique_ptr<ShmArea> subset(const std::vector<int>& ranks) const;
  void restart() const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slotBytes() const { return slotBytes_; }
  // The CPUs the area's ranks may run on between them (the union of their
  // affinity masks at creation), the same on every rank: the cost model
  // weighs a hand-off by how many ranks share each core.
  int cores() const { return cores_; }
  // For tests, which run every rank in one process.
  void setCores(int cores) { cores_ = cores; }

  // An area may serve part of a group (the ranks of one host, for the
  // hierarchical algorithms): `ranks[i]` is the group rank of area rank i.
  // What the area reports about ranks (who is behind, who differs) is then in
  // group ranks, as the engine and error messages expect. Default: the same.
  void setGroupRanks(std::vector<int> ranks) {
    bell_->setGroupRanks(ranks);
    groupRanks_ = std::move(ranks);
  }
  int groupRank(int areaRank) const { return groupRanks_.empty() ? areaRank : groupRanks_[size_t(areaRank)]; }

  // Which collective a rank's chunk in a slot belongs to (kind, seq, root,
  // op, dtype, count), so peers can tell that the ranks called different
  // things instead of combining mismatched bytes. Written before the counter
  // is released.
  using SlotHeader = CollIdentity;

  // Throws ErrorKind::InvalidArgument naming the first rank whose header in
  // slot `which` differs from `mine`, and what differs.
  void checkSameOp(int which, const SlotHeader& mine) const;
  // The same for one area rank's header.
  void checkSameOp(int rank, int which, const SlotHeader& mine) const;
  // The same for its header of eager chunk `id`.
  void checkSameEagerOp(int rank, uint64_t id, const SlotHeader& mine) const;

  std::byte* slot(int rank, int which) const { return data_[rank] + size_t(which) * slotBytes_; }
  SlotHeader& header(int rank, int which) const { return headers_[rank][which]; }
  // Room in a rank's control block, one record per slot parity, for what the
  // single-copy algorithms publish with a chunk's header (the address of the
  // buffer peers read; algorithms/cma_steps.h).
  static constexpr size_t kOpRecordBytes = 64;
  std::byte* opRecord(int rank, int which) const;
  std::atomic<uint64_t>& counter(int rank) const { return *counters_[rank]; }
  bool allReached(uint64_t value) const;
  // The (group) ranks whose counter is still below `value`.
  std::vector<int> behind(uint64_t value) const;

  // Small chunks that one root hands to the others (broadcast, scatter) go
  // through a deeper ring of small slots instead, each with its header,
  // chunk `id` in slot id mod kEagerSlots: the root is done with a chunk
  // once it is in its slot, so it returns at once and may run kEagerSlots
  // chunks ahead of the slowest reader before it waits (MPI's eager
  // protocol). Chunks keep one numbering across both rings; each ring's
  // slot is free once every rank released the chunk its depth before.
  static constexpr uint64_t kEagerSlots = 16;
  // What fits in an eager slot: up to 4 KiB, never more than a slot.
  size_t eagerBytes() const;
  std::byte* eagerSlot(int rank, uint64_t id) const { return eager_[rank] + (id % kEagerSlots) * eagerBytes(); }
  SlotHeader& eagerHeader(int rank, uint64_t id) const { return eagerHeaders_[rank][id % kEagerSlots]; }

  // The last chunk a rank has finished reading every slot for. A rank may
  // rewrite its slot for chunk `id` (the slot of chunk id - 2) once every
  // rank has released id - 2: this lets one rank fill the next chunk while
  // the others still read the current one, whatever the algorithm. `depth`:
  // the ring's, kEagerSlots for an eager slot.
  std::atomic<uint64_t>& released(int rank) const { return *released_[rank]; }
  bool slotFree(uint64_t id, uint64_t depth = 2) const;
  // This rank is done with chunk `id`: counter := 2 id, the chunk released,
  // and the next chunk may start.
  void finishChunk(uint64_t id) {
    counter(rank_).store(2 * id, std::memory_order_release);
    released(rank_).store(id, std::memory_order_release);
    chunksDone_.store(id, std::memory_order_release);
    ring();
  }
  // Every store to a counter or released value is followed by a ring, so
  // that a peer asleep waiting for this rank looks again.
  void ring() { bell_->ring(); }
  FutexBell* bell() const { return bell_.get(); }
  // The (group) ranks that still hold the slot chunk `id` needs.
  std::vector<int> holdingSlot(uint64_t id, uint64_t depth = 2) const;

  // Chunks are numbered across all ops that use the area, in submission
  // order, so every rank agrees on each chunk's slot and counter values. The
  // caller reserves them under the same lock that numbers its calls and
  // submits them (ProcessGroupRingx::submitBuilt), so that ops issued from
  // several threads get chunk ids in the order of their sequence numbers.
  uint64_t reserveChunks(uint64_t n) { return nextChunk_.fetch_add(n); }
  // The last chunk this rank has finished with, so the next op's first chunk
  // waits for the previous op's last one.
  std::atomic<uint64_t>& chunksDone() { return chunksDone_; }

 private:
  ShmArea(int rank, int size, size_t slotBytes) : rank_(rank), size_(size), slotBytes_(slotBytes) {}
  // Places the blocks of the segments mapped at `maps`, by area rank.
  void place(std::vector<std::byte*> maps);

  // Every segment the first area mapped, unmapped with the last area over
  // them.
  using Segments = std::vector<std::unique_ptr<ShmSegment>>;

  int rank_;
  int size_;
  size_t slotBytes_;
  int cores_ = 1;
  std::shared_ptr<Segments> segments_;
  std::vector<std::byte*> maps_;  // this area's ranks' segments
  std::vector<std::byte*> data_;
  std::vector<std::atomic<uint64_t>*> counters_;
  std::vector<std::atomic<uint64_t>*> released_;
  std::vector<SlotHeader*> headers_;
  std::vector<std::byte*> eager_;
  std::vector<SlotHeader*> eagerHeaders_;
  std::vector<int> groupRanks_;
  std::unique_ptr<FutexBell> bell_;
  std::atomic<uint64_t> nextChunk_{1};
  std::atomic<uint64_t> chunksDone_{0};
};

}  // namespace ringx
