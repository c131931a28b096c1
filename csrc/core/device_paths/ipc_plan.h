// The ipc path's arithmetic, without a device: how a collective is cut into
// rounds that fit a rank's buffer, where each rank's part of a round lies in
// its buffer, and how the chunked ring walks its chunks. Unit-tested on its
// own (test_ipc_path.cc); which all_reduce runs is ipc_cost.h's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/algorithms/coll_args.h"
#include "core/patterns/ring.h"

namespace ringx {

// Whether each rank fills its buffer with one piece per destination rank
// (reduce_scatter, all_to_all, scatter) rather than one piece in all.
inline bool ipcPerDestination(Collective c) {
  return c == Collective::ReduceScatter || c == Collective::AllToAll || c == Collective::Scatter;
}

// Elements of one block a round carries: as many as the buffer holds, one
// piece per destination where the collective has them. 0 when the buffer
// cannot hold one element per piece.
inline size_t ipcRoundElems(const CollArgs& a, size_t bufferBytes) {
  const size_t pieces = ipcPerDestination(a.coll) ? size_t(a.size) : 1;
  return bufferBytes / (pieces * dtypeSize(a.dtype));
}

// The rounds an op of `count` elements per block takes (0 for none).
inline size_t ipcRounds(size_t count, size_t roundElems) { return ring::numSegments(count, roundElems); }

// Round k's first element and length.
inline std::pair<size_t, size_t> ipcRound(size_t count, size_t roundElems, size_t k) {
  return {k * roundElems, ring::segmentLen(count, roundElems, k)};
}

// Two-shot: rank q's portion of a round of `len` elements (first element,
// length), the part it reduces for everyone.
inline std::pair<size_t, size_t> ipcPortion(size_t len, int n, int q) {
  return {ring::chunkStart(len, n, q), ring::chunkLen(len, n, q)};
}

// The chunked ring (all_reduce of large buffers, ipc_ring.h). A rank's
// buffer is cut into `slots` slots of `slotElems`; a round of the op covers
// n chunks of at most a slot each. In round step s = 0 .. 2n-2, rank r works
// on chunk (r - s) mod n: steps 0 .. n-1 reduce-scatter (step 0 copies r's
// own part in; step s >= 1 reduces the left peer's step s-1 with r's part,
// so after step n-1 rank r holds chunk r+1 reduced over every rank), steps
// n .. 2n-2 all-gather (copy the left peer's step s-1). Every step but the
// last writes its chunk into r's next slot, where the right peer reads it.
struct IpcRingPlan {
  int n = 0;
  size_t slots = 0;  // 0: the buffer cannot hold two slots of an element
  size_t slotElems = 0;
  size_t rounds = 0;
  size_t roundElems() const { return size_t(n) * slotElems; }
  size_t stepsPerRound() const { return 2 * size_t(n) - 1; }
  size_t writesPerRound() const { return 2 * size_t(n) - 2; }
  size_t writes() const { return rounds * writesPerRound(); }
};

// Two slots are the fewest that cannot deadlock: with one, every rank's
// next step would wait for its right peer to read the slot it refills, and
// that peer for its own right peer, around the ring. More let a rank run a
// few steps ahead of a slower right peer, at the price of shorter chunks,
// so more steps and flag exchanges; NCCL keeps 8 in flight (NCCL_STEPS),
// through much larger buffers. Not measured (no GPU has run the ring).
inline constexpr size_t kIpcRingSlots = 4;

inline IpcRingPlan ipcRingPlan(size_t count, size_t elemBytes, int n, size_t bufferBytes) {
  IpcRingPlan p;
  p.n = n;
  const size_t elems = bufferBytes / elemBytes;
  if (n < 2 || elems < 2) return p;
  p.slots = std::min(kIpcRingSlots, elems);
  p.slotElems = elems / p.slots;
  p.rounds = ring::numSegments(count, p.roundElems());
  return p;
}

// The chunk of its round rank r works on at round step `step`.
inline int ipcRingChunk(int r, int n, size_t step) { return ring::mod(long(r) - long(step), n); }

}  // namespace ringx
