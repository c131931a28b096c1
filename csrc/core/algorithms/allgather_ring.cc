#include <vector>

#include "core/algorithms/registry.h"
#include "core/patterns/ring.h"

namespace ringx {

// Ring all-gather.
//
// Terms: the output holds n blocks of `count` elements, block q being rank
// q's input. Step s (0 <= s < n-1): send block (r-s) to the right
// neighbour, receive block (r-s-1) from the left straight into the output.
// Blocks are cut into segments so that segment g is forwarded as soon as it
// arrived, while later segments are still on the wire.
//
// Bytes on the wire per rank: (n-1)/n N of the N-byte output; steps: n-1.
Schedule buildAllGatherRing(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("ring");
  const int n = a.size, r = a.rank;
  const size_t es = dtypeSize(a.dtype);
  const size_t blockBytes = a.count * es;
  auto* out = static_cast<std::byte*>(a.buf);
  StepId own = kNoStep;
  if (a.input && a.input != out + r * blockBytes && blockBytes) own = s.copy(out + r * blockBytes, a.input, blockBytes);
  if (n == 1 || a.count == 0) return s;

  size_t segElems = std::max<size_t>(1, a.segmentBytes / es);
  while (size_t(n) * ring::numSegments(a.count, segElems) > kMaxTagIndex) segElems *= 2;
  const size_t nseg = ring::numSegments(a.count, segElems);
  const int right = ring::right(r, n), left = ring::left(r, n);

  std::vector<StepId> have(nseg, own);
  for (int step = 0; step < n - 1; ++step) {
    const int sendBlock = ring::mod(long(r) - step, n);
    const int recvBlock = ring::mod(long(r) - step - 1, n);
    std::vector<StepId> next(nseg);
    for (size_t g = 0; g < nseg; ++g) {
      const size_t off = g * segElems * es, bytes = ring::segmentLen(a.count, segElems, g) * es;
      next[g] = s.recv(left, collTag(a.seq, step * nseg + g), out + recvBlock * blockBytes + off, bytes);
      s.send(right, collTag(a.seq, step * nseg + g), out + sendBlock * blockBytes + off, bytes, {have[g]});
    }
    have = std::move(next);
  }
  return s;
}

}  // namespace ringx
