#include <vector>

#include "core/algorithms/registry.h"
#include "core/patterns/ring.h"

namespace ringx {

// Ring reduce-scatter, out of place: the input (n blocks of `count`) is only
// read (PREMUL_SUM reads a copy scaled by this rank's factor), and rank r
// ends with block r reduced over all ranks.
//
// Terms: step s (0 <= s < n-1) sends the partial sum of block (r-s-1) to the
// right and receives the partial sum of block (r-s-2) from the left, folding
// this rank's own input block into it. Step 0 sends straight from the input;
// partial sums live in two banks of receive slots used on alternate steps (a
// bank is refilled only after the next step's send has read it); the last
// step receives straight into the output. Blocks are cut into segments so
// that each moves on as soon as it is reduced.
//
// Bytes on the wire per rank: (n-1)/n N of the N-byte input; steps: n-1.
Schedule buildReduceScatterRing(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("ring");
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype), blockBytes = a.count * es;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = static_cast<const std::byte*>(a.input);
  if (a.count == 0) return s;
  // PREMUL_SUM scales each rank's own input by its own factor before the
  // sum: into a scratch copy, since the input is only read.
  StepId pre = kNoStep;
  if (a.op == ReduceOp::PremulSum) {
    s.setScaleFactor(a.premulFactor);
    auto* scaled = s.scratch(size_t(n) * blockBytes);
    pre = s.scale(scaled, size_t(n) * blockBytes, {s.copy(scaled, in, size_t(n) * blockBytes)});
    in = scaled;
  }
  const bool avg = a.op == ReduceOp::Avg && n > 1;
  if (avg) s.setScaleFactor(1.0 / n);
  if (n == 1) {
    s.copy(out, in, blockBytes, {pre});
    return s;
  }

  size_t segElems = std::max<size_t>(1, a.segmentBytes / es);
  while (size_t(n) * ring::numSegments(a.count, segElems) > kMaxTagIndex) segElems *= 2;
  const size_t nseg = ring::numSegments(a.count, segElems);
  const int right = ring::right(r, n), left = ring::left(r, n);
  std::byte* banks[2] = {s.scratch(blockBytes), s.scratch(blockBytes)};
  std::vector<StepId> bankRead[2] = {std::vector<StepId>(nseg, kNoStep), std::vector<StepId>(nseg, kNoStep)};
  std::vector<StepId> partial(nseg, pre);

  for (int step = 0; step < n - 1; ++step) {
    const int sendBlock = ring::mod(long(r) - step - 1, n);
    const int recvBlock = ring::mod(long(r) - step - 2, n);
    const bool last = step == n - 2;
    std::byte* fill = banks[step % 2];
    const std::byte* held = banks[(step + 1) % 2];
    for (size_t g = 0; g < nseg; ++g) {
      const size_t off = g * segElems * es, len = ring::segmentLen(a.count, segElems, g) * es;
      const std::byte* src = step == 0 ? in + sendBlock * blockBytes + off : held + off;
      StepId sent = s.send(right, collTag(a.seq, step * nseg + g), src, len, {partial[g]});
      if (step > 0) bankRead[(step + 1) % 2][g] = sent;
    }
    for (size_t g = 0; g < nseg; ++g) {
      const size_t off = g * segElems * es, len = ring::segmentLen(a.count, segElems, g) * es;
      std::byte* dst = last ? out + off : fill + off;
      StepId got = s.recv(left, collTag(a.seq, step * nseg + g), dst, len, {last ? kNoStep : bankRead[step % 2][g]});
      partial[g] = s.reduce(dst, in + recvBlock * blockBytes + off, len, {got, pre});
      if (last && avg) s.scale(dst, len, {partial[g]});
    }
  }
  return s;
}

}  // namespace ringx
