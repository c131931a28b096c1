#include <algorithm>

#include "core/algorithms/registry.h"
#include "core/algorithms/send_window.h"
#include "core/patterns/ring.h"

namespace ringx {

namespace {

// One block's trip between a rank and the root: in the pipeline's segments,
// kSendsInFlight sends posted at a time, as the chain broadcast's
// (send_window.h). On the test bed a 64 MiB gather sent as one message per
// block took 336-345 ms on 2 x 2 hosts and 171-180 on 3 + 1, in segments
// 288-298 and 151 (2026-11-30, one run each).
class BlockSegments {
 public:
  explicit BlockSegments(const CollArgs& a)
      : seq_(a.seq),
        es_(dtypeSize(a.dtype)),
        total_(a.count),
        elems_(ring::segmentWithin(total_, std::max<size_t>(1, a.segmentBytes / es_),
                                   kMaxTagIndex)) {}

  void send(Schedule& s, int peer, const std::byte* from) const {
    SendWindow window;
    for (size_t g = 0; g < count(); ++g) {
      window.pace(s, s.send(peer, collTag(seq_, g), from + offset(g), bytes(g)));
    }
  }
  void recv(Schedule& s, int peer, std::byte* to) const {
    for (size_t g = 0; g < count(); ++g) s.recv(peer, collTag(seq_, g), to + offset(g), bytes(g));
  }

 private:
  size_t count() const { return ring::numSegments(total_, elems_); }
  size_t offset(size_t g) const { return g * elems_ * es_; }
  size_t bytes(size_t g) const { return ring::segmentLen(total_, elems_, g) * es_; }

  uint64_t seq_;
  size_t es_, total_, elems_;
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
  const BlockSegments segments(a);
  const auto* in = static_cast<const std::byte*>(a.input);
  if (a.rank != a.root) {
    segments.send(s, a.root, in);
    return s;
  }
  auto* out = static_cast<std::byte*>(a.buf);
  for (int q = 0; q < a.size; ++q) {
    auto* to = a.blocks.empty() ? out + size_t(q) * block
                                : static_cast<std::byte*>(a.blocks[size_t(q)]);
    if (q == a.rank) {
      s.copy(to, in, block);
    } else {
      segments.recv(s, q, to);
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
  const BlockSegments segments(a);
  auto* out = static_cast<std::byte*>(a.buf);
  if (a.rank != a.root) {
    segments.recv(s, a.root, out);
    return s;
  }
  const auto* in = static_cast<const std::byte*>(a.input);
  for (int q = 0; q < a.size; ++q) {
    const auto* from = a.blocks.empty() ? in + size_t(q) * block
                                        : static_cast<const std::byte*>(a.blocks[size_t(q)]);
    if (q == a.rank) {
      s.copy(out, from, block);
    } else {
      segments.send(s, q, from);
    }
  }
  return s;
}

}  // namespace ringx
