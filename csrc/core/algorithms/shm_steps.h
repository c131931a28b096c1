// What the shared-memory algorithms share: their chunking, the copy-in step,
// and the step that reads every rank's copy.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "core/algorithms/coll_args.h"
#include "core/engine/schedule.h"
#include "core/patterns/ring.h"
#include "core/reduce/reduce.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// `count` elements cut into pieces of at most `pieceElems`, one chunk number
// reserved for each (ShmArea::reserveChunks), so every rank agrees on each
// chunk's slot and counter values.
struct ShmChunks {
  ShmChunks(ShmArea* shm, size_t count, size_t pieceElems)
      : pieceElems(pieceElems), count(ring::numSegments(count, pieceElems)), total(count),
        first(shm->reserveChunks(this->count)) {}

  // Calls step(id, which slot, first element, elements) for each chunk.
  template <typename Step>
  void forEach(Step step) const {
    for (size_t k = 0; k < count; ++k) step(first + k, int((first + k) % 2), k * pieceElems, len(k));
  }
  size_t len(size_t k) const { return ring::segmentLen(total, pieceElems, k); }

  size_t pieceElems;
  size_t count;
  size_t total;
  uint64_t first;
};

// Chunk `id` may fill this rank's slot once this rank has finished its
// previous chunk (ops run in submission order) and every rank has released
// the chunk that used the slot last. `fill(slot)` writes the slot; then the
// header is published and the counter raised to 2 id - 1, which tells the
// others the slot holds chunk `id`.
template <typename Fill>
StepId shmCopyIn(Schedule& s, ShmArea* shm, uint64_t id, ShmArea::SlotHeader header, Fill fill, StepId prev) {
  return s.poll(
      [=] {
        if (shm->chunksDone().load(std::memory_order_acquire) + 1 < id || !shm->slotFree(id)) return false;
        const int which = int(id % 2);
        fill(shm->slot(shm->rank(), which));
        shm->header(shm->rank(), which) = header;
        shm->counter(shm->rank()).store(2 * id - 1, std::memory_order_release);
        shm->ring();
        return true;
      },
      [=] { return shm->holdingSlot(id); }, {prev});
}

// Chunk `id` once every rank has copied it in: the headers are compared (so
// ranks that passed different tensors fail instead of reading mismatched
// bytes), `use(which)` reads the slots, and the chunk is released.
template <typename Use>
StepId shmReadAll(Schedule& s, ShmArea* shm, uint64_t id, ShmArea::SlotHeader header, Use use, StepId prev) {
  return s.poll(
      [=] {
        if (!shm->allReached(2 * id - 1)) return false;
        const int which = int(id % 2);
        shm->checkSameOp(which, header);
        use(which);
        shm->finishChunk(id);
        return true;
      },
      [=] { return shm->behind(2 * id - 1); }, {prev});
}

// Where the chunks of a collective with one root that hands data to the
// others (broadcast, scatter) live: a small one's single chunk in the eager
// ring (ShmArea::kEagerSlots deep), a larger one's in the two slots.
struct FromRootSlots {
  ShmArea* shm;
  bool eager;

  uint64_t depth() const { return eager ? ShmArea::kEagerSlots : 2; }
  std::byte* slot(int rank, uint64_t id) const {
    return eager ? shm->eagerSlot(rank, id) : shm->slot(rank, int(id % 2));
  }
  ShmArea::SlotHeader& header(int rank, uint64_t id) const {
    return eager ? shm->eagerHeader(rank, id) : shm->header(rank, int(id % 2));
  }
  // Chunk `id` may take its slot: this rank finished the chunk before it
  // (ops run in submission order) and every rank released the chunk that
  // used the slot last.
  bool free(uint64_t id) const {
    return shm->chunksDone().load(std::memory_order_acquire) + 1 >= id && shm->slotFree(id, depth());
  }
};

// Chunk `id` of a collective in which `root` hands data to the others. The
// root `fill`s its slot once the slot is free and is done with the chunk:
// it waits for no reader, so in the eager ring it runs up to kEagerSlots
// chunks ahead of the slowest before a full ring stops it. Every other rank
// announces the chunk (header, counter 2 id - 1), so that a rank in another
// collective on the same chunk sees the mismatch instead of waiting for this
// one; then, once the root's counter reaches 2 id, compares the root's
// header, `use`s the root's slot and releases the chunk.
template <typename Fill, typename Use>
StepId shmFromRoot(Schedule& s, const FromRootSlots& at, int root, uint64_t id, ShmArea::SlotHeader header,
                   Fill fill, Use use, StepId prev) {
  ShmArea* shm = at.shm;
  const int r = shm->rank();
  const uint64_t depth = at.depth();
  auto holding = [=] { return shm->holdingSlot(id, depth); };
  if (r == root) {
    return s.poll(
        [=] {
          if (!at.free(id)) return false;
          fill(at.slot(r, id));
          at.header(r, id) = header;
          shm->finishChunk(id);
          return true;
        },
        holding, {prev});
  }
  prev = s.poll(
      [=] {
        if (!at.free(id)) return false;
        at.header(r, id) = header;
        shm->counter(r).store(2 * id - 1, std::memory_order_release);
        shm->ring();
        return true;
      },
      holding, {prev});
  return s.poll(
      [=] {
        const uint64_t rootAt = shm->counter(root).load(std::memory_order_acquire);
        if (rootAt < 2 * id - 1) return false;
        if (at.eager) {
          shm->checkSameEagerOp(root, id, header);
        } else {
          shm->checkSameOp(root, int(id % 2), header);
        }
        if (rootAt < 2 * id) return false;
        use(at.slot(root, id));
        shm->finishChunk(id);
        return true;
      },
      [=] {
        return shm->counter(root).load(std::memory_order_acquire) < 2 * id ? std::vector<int>{root}
                                                                          : std::vector<int>{};
      },
      {prev});
}

// The n-way reduce of a reduction collective over `m` elements: the
// dtype x op kernel (float32 accumulation for 16-bit types), then the scaling
// for AVG. `out` may be one of `srcs`.
struct ShmReduce {
  explicit ShmReduce(const CollArgs& a)
      : fn(reduceNFn(a.dtype, a.op)), dtype(a.dtype), avg(a.op == ReduceOp::Avg ? 1.0 / a.size : 1.0) {}
  void operator()(std::byte* out, const void* const* srcs, int n, size_t m) const {
    fn(out, srcs, n, m);
    if (avg != 1.0) scale(out, m, dtype, avg);
  }

  ReduceNFn fn;
  DType dtype;
  double avg;
};

// The two-shot reductions' copy in: the chunk of `m` elements from `chunk`
// into this rank's slot, all but this rank's own portion (1/n of it), which
// only this rank reduces and shmReduceMyPortion reads from the input.
inline void shmCopyInOthersPortions(std::byte* slot, const std::byte* chunk, size_t m, size_t es, int n, int r) {
  const size_t ownOff = ring::chunkStart(m, n, r) * es, ownEnd = ownOff + ring::chunkLen(m, n, r) * es;
  std::memcpy(slot, chunk, ownOff);
  std::memcpy(slot + ownEnd, chunk + ownEnd, m * es - ownEnd);
}

// The two-shot reduction's middle step on a chunk of `m` elements in slot
// `which`: this rank's 1/n of it reduced out of the n ranks' copies (scaled by
// `avg` unless 1) into `out`, the rank's own output for the chunk, and, where
// other ranks read the result (`share`), into its slot too. This rank's own
// copy of its portion is read from `own` (its input, which no other rank
// needs) rather than the slot; `out` may equal `own`. Writing the output here
// spares the copy out of this rank's own portion; the slot is filled block by
// block from what the reduce just wrote, while it is still in L1.
inline void shmReduceMyPortion(ShmArea* shm, int which, size_t m, ReduceNFn reduce, DType dtype, double avg,
                               const std::byte* own, std::byte* out, bool share) {
  constexpr size_t kBlockBytes = 16 * 1024;
  const int n = shm->size(), r = shm->rank();
  const size_t es = dtypeSize(dtype);
  const size_t off = ring::chunkStart(m, n, r) * es, len = ring::chunkLen(m, n, r);
  const size_t blockElems = kBlockBytes / es;
  std::vector<const void*> srcs(n);
  for (size_t done = 0; done < len; done += blockElems) {
    const size_t at = off + done * es, k = std::min(blockElems, len - done);
    for (int q = 0; q < n; ++q) srcs[q] = q == r ? own + at : shm->slot(q, which) + at;
    reduce(out + at, srcs.data(), n, k);
    if (avg != 1.0) scale(out + at, k, dtype, avg);
    if (share) std::memcpy(shm->slot(r, which) + at, out + at, k * es);
  }
}

// Its last step: every rank's reduced portion of the chunk copied to `out`,
// but for rank `skip`'s (-1 for none), already there.
inline void shmCopyPortionsOut(ShmArea* shm, int which, size_t m, size_t es, std::byte* out, int skip = -1) {
  const int n = shm->size();
  for (int q = 0; q < n; ++q) {
    const size_t off = ring::chunkStart(m, n, q) * es, len = ring::chunkLen(m, n, q) * es;
    if (len && q != skip) std::memcpy(out + off, shm->slot(q, which) + off, len);
  }
}

// all_gather and gather: each rank's block `in` copied into its slot piece by
// piece; every rank (all_gather) or the root alone (gather, copyOut false
// elsewhere) copies every rank's piece into `out`, blocks of `a.count`
// elements in rank order.
inline void shmGatherBlocks(Schedule& s, const CollArgs& a, const std::byte* in, std::byte* out, bool copyOut) {
  ShmArea* shm = a.shm;
  const int n = a.size;
  const size_t es = dtypeSize(a.dtype), blockBytes = a.count * es;
  const ShmChunks chunks(shm, a.count, shm->slotBytes() / es);
  const ShmArea::SlotHeader header = identityOf(a);
  StepId prev = kNoStep;
  chunks.forEach([&](uint64_t id, int, size_t start, size_t len) {
    const size_t off = start * es, bytes = len * es;
    prev = shmCopyIn(s, shm, id, header, [=](std::byte* slot) { std::memcpy(slot, in + off, bytes); }, prev);
    prev = shmReadAll(
        s, shm, id, header,
        [=](int which) {
          if (!copyOut) return;
          for (int q = 0; q < n; ++q) std::memcpy(out + q * blockBytes + off, shm->slot(q, which), bytes);
        },
        prev);
  });
}

}  // namespace ringx
