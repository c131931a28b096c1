#include <algorithm>

#include "core/algorithms/registry.h"
#include "core/algorithms/send_window.h"
#include "core/patterns/ring.h"

namespace ringx {

namespace {

// Blocks travel in the pipeline's segments, kSendsInFlight at a time per
// peer, as the chain broadcast's do (send_window.h): on the test bed a 64 MiB
// gather sent as one message per block took 336-345 ms on 2 x 2 hosts and
// 171-180 on 3 + 1, in segments 288-298 and 151 (2026-11-30, one run each).
struct Segments {
  size_t elems, count, es;
  explicit Segments(const CollArgs& a)
      : elems(ring::segmentWithin(
            a.count, std::max<size_t>(1, a.segmentBytes / dtypeSize(a.dtype)), kMaxTagIndex)),
        count(ring::numSegments(a.count, elems)),
        es(dtypeSize(a.dtype)) {}
  size_t offset(size_t g) const { return g * elems * es; }
  size_t bytes(const CollArgs& a, size_t g) const {
    return ring::segmentLen(a.count, elems, g) * es;
  }
};

}  // namespace

// Direct gather: every rank sends its block straight to the root, which
// receives all of them at once into their places in the output (or into
// the caller's separate output tensors, a.blocks).
//
// Across hosts each block crosses the links between its rank and the root
// once, so the root host's link carries the (n - L) blocks from the other
// hosts and nothing more: the least any gather can. The binomial tree sends
// its subtrees' runs through intermediate ranks, which can cross a link
// twice and forwards only once a whole run is in.
Schedule buildGatherDirect(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("direct");
  const size_t block = a.bytes();
  if (block == 0) return s;
  const Segments seg(a);
  if (a.rank != a.root) {
    const auto* in = static_cast<const std::byte*>(a.input);
    SendWindow window;
    for (size_t g = 0; g < seg.count; ++g) {
      window.pace(s, s.send(a.root, collTag(a.seq, g), in + seg.offset(g), seg.bytes(a, g)));
    }
    return s;
  }
  auto* out = static_cast<std::byte*>(a.buf);
  for (int q = 0; q < a.size; ++q) {
    auto* to = a.blocks.empty() ? out + size_t(q) * block
                                : static_cast<std::byte*>(a.blocks[size_t(q)]);
    if (q == a.rank) {
      s.copy(to, a.input, block);
      continue;
    }
    for (size_t g = 0; g < seg.count; ++g) {
      s.recv(q, collTag(a.seq, g), to + seg.offset(g), seg.bytes(a, g));
    }
  }
  return s;
}

// Direct scatter, the mirror: the root sends every block straight to its
// rank, from the input or from the caller's separate input tensors.
Schedule buildScatterDirect(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("direct");
  const size_t block = a.bytes();
  if (block == 0) return s;
  const Segments seg(a);
  auto* out = static_cast<std::byte*>(a.buf);
  if (a.rank != a.root) {
    for (size_t g = 0; g < seg.count; ++g) {
      s.recv(a.root, collTag(a.seq, g), out + seg.offset(g), seg.bytes(a, g));
    }
    return s;
  }
  const auto* in = static_cast<const std::byte*>(a.input);
  for (int q = 0; q < a.size; ++q) {
    const auto* from = a.blocks.empty() ? in + size_t(q) * block
                                        : static_cast<const std::byte*>(a.blocks[size_t(q)]);
    if (q == a.rank) {
      s.copy(out, from, block);
      continue;
    }
    SendWindow window;
    for (size_t g = 0; g < seg.count; ++g) {
      window.pace(s, s.send(q, collTag(a.seq, g), from + seg.offset(g), seg.bytes(a, g)));
    }
  }
  return s;
}

}  // namespace ringx
