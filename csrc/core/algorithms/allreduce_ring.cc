#include <vector>

#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"
#include "core/patterns/ring.h"

namespace ringx {

// Ring all-reduce = a reduce-scatter pass then an all-gather pass around the
// ring, as in gloo's allreduce_ring and UCC's allreduce_ring.
//
// Terms: n ranks; the buffer of `count` elements is cut into n chunks
// (chunk c belongs, fully reduced, to rank c-1 after the first pass); each
// chunk is cut into segments of at most segElems elements, and segments are
// the unit of pipelining: segment g of a chunk moves to the next step as soon
// as it is reduced, while later segments are still on the wire.
//
// Reduce-scatter step s (0 <= s < n-1): send chunk (r-s) to the right
// neighbour, receive chunk (r-s-1) from the left into a receive slot and
// reduce it into the buffer. Slots are a small pool reused round-robin; a
// receive into a slot waits for the reduce that drained the slot's previous
// use, which bounds memory and paces the sender.
//
// All-gather step s: send chunk (r+1-s) (fully reduced) to the right, receive
// chunk (r-s) from the left straight into the buffer.
//
// Bytes on the wire per rank: 2 (n-1)/n N; steps: 2 (n-1).
Schedule buildAllReduceRing(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("ring");
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype);
  auto* base = static_cast<std::byte*>(a.buf);

  const StepId pre = premultiply(s, a, base);
  if (n == 1 || a.count == 0) return s;

  size_t segElems = std::max<size_t>(1, a.segmentBytes / es);
  const size_t maxChunk = ring::chunkLen(a.count, n, 0);
  // Keep every message index inside the tag's 24 bits.
  while (2 * size_t(n) * ring::numSegments(maxChunk, segElems) > kMaxTagIndex) segElems *= 2;
  const size_t maxSeg = ring::numSegments(maxChunk, segElems);

  auto segPtr = [&](int chunk, size_t g) {
    return base + (ring::chunkStart(a.count, n, chunk) + g * segElems) * es;
  };
  auto segBytes = [&](int chunk, size_t g) {
    return ring::segmentLen(ring::chunkLen(a.count, n, chunk), segElems, g) * es;
  };
  auto segs = [&](int chunk) { return ring::numSegments(ring::chunkLen(a.count, n, chunk), segElems); };

  const int right = ring::right(r, n), left = ring::left(r, n);
  const size_t numSlots = std::min<size_t>(std::max<size_t>(2 * maxSeg, 2), 8);
  std::byte* slotMem = s.scratch(numSlots * segElems * es);
  std::vector<StepId> slotFree(numSlots, kNoStep);
  size_t slotUse = 0;

  // reduced[g]: the step after which segment g of the chunk this rank will
  // forward next holds its partial result. sentInRs[c][g]: the reduce-scatter
  // send that last reads segment g of chunk c before the all-gather
  // overwrites it.
  std::vector<StepId> reduced(maxSeg, kNoStep);
  std::vector<std::vector<StepId>> sentInRs(n, std::vector<StepId>(maxSeg, kNoStep));

  for (int step = 0; step < n - 1; ++step) {
    const int sendChunk = ring::mod(long(r) - step, n);
    const int recvChunk = ring::mod(long(r) - step - 1, n);
    for (size_t g = 0; g < segs(sendChunk); ++g) {
      sentInRs[sendChunk][g] = s.send(right, collTag(a.seq, step * maxSeg + g), segPtr(sendChunk, g),
                                      segBytes(sendChunk, g), {pre, reduced[g]});
    }
    // Receive and reduce segment by segment, so a slot's next receive can
    // name the reduce that drains it even within one step.
    for (size_t g = 0; g < segs(recvChunk); ++g) {
      const size_t slot = (slotUse + g) % numSlots;
      std::byte* slotPtr = slotMem + slot * segElems * es;
      StepId in = s.recv(left, collTag(a.seq, step * maxSeg + g), slotPtr, segBytes(recvChunk, g), {slotFree[slot]});
      reduced[g] = s.reduce(segPtr(recvChunk, g), slotPtr, segBytes(recvChunk, g), {in, pre});
      slotFree[slot] = reduced[g];
    }
    slotUse += segs(recvChunk);
  }

  const int owned = ring::right(r, n);
  if (a.op == ReduceOp::Avg) {
    s.setScaleFactor(1.0 / n);
    for (size_t g = 0; g < segs(owned); ++g) reduced[g] = s.scale(segPtr(owned, g), segBytes(owned, g), {reduced[g]});
  }

  const uint64_t agBase = uint64_t(n - 1) * maxSeg;
  for (int step = 0; step < n - 1; ++step) {
    const int sendChunk = ring::mod(long(r) + 1 - step, n);
    const int recvChunk = ring::mod(long(r) - step, n);
    std::vector<StepId> recvd(maxSeg, kNoStep);
    for (size_t g = 0; g < segs(recvChunk); ++g) {
      recvd[g] = s.recv(left, collTag(a.seq, agBase + step * maxSeg + g), segPtr(recvChunk, g),
                        segBytes(recvChunk, g), {sentInRs[recvChunk][g]});
    }
    for (size_t g = 0; g < segs(sendChunk); ++g) {
      s.send(right, collTag(a.seq, agBase + step * maxSeg + g), segPtr(sendChunk, g), segBytes(sendChunk, g),
             {reduced[g]});
    }
    reduced = recvd;
  }
  return s;
}

}  // namespace ringx
