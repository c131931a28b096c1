#include "core/algorithms/registry.h"
#include "core/algorithms/send_window.h"
#include "core/patterns/ring.h"
#include "core/select/select.h"

namespace ringx {

// Pipelined chain broadcast: the root's buffer travels segment by segment
// along the ring root, root+1, ..., root-1.
//
// Terms: each rank receives segment g from its left neighbour straight into
// its buffer and forwards it to its right neighbour as soon as it has arrived;
// the last rank of the chain only receives, and each keeps kSendsInFlight
// sends posted (send_window.h). Segments are the cost model's pipeline size
// (chainSegmentBytes), so a short buffer still fills the chain.
//
// Bytes on the wire: N into and out of every rank but the ends, so a link
// carries the buffer once each way, where the binomial tree's root sends it
// ceil(log2 n) times; steps: n - 2 + segments. Across hosts whose link is the
// bottleneck that is the difference between N and log2(n) N over the link.
Schedule buildBroadcastChain(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("chain");
  if (a.size == 1 || a.count == 0) return s;
  const size_t es = dtypeSize(a.dtype);
  const size_t seg =
      ring::segmentWithin(a.count, std::max<size_t>(1, chainSegmentBytes(a) / es), kMaxTagIndex);
  const size_t nseg = ring::numSegments(a.count, seg);
  const int pos = ring::mod(a.rank - a.root, a.size);
  const int left = ring::left(a.rank, a.size);
  const int right = ring::right(a.rank, a.size);
  const bool forwards = pos != a.size - 1;
  auto* buf = static_cast<std::byte*>(a.buf);
  SendWindow window;
  for (size_t g = 0; g < nseg; ++g) {
    std::byte* p = buf + g * seg * es;
    const size_t bytes = ring::segmentLen(a.count, seg, g) * es;
    const StepId have = pos > 0 ? s.recv(left, collTag(a.seq, g), p, bytes) : kNoStep;
    if (forwards) window.pace(s, s.send(right, collTag(a.seq, g), p, bytes, {have}));
  }
  return s;
}

}  // namespace ringx
