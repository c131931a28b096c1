#include "core/algorithms/registry.h"

namespace ringx {

// Pairwise-exchange all-to-all: every rank posts all of its receives and
// sends at once, to peers in the order r+1, r+2, ... (and from r-1, r-2, ...)
// so that no single rank is everyone's first target. Blocks may differ in
// size per peer (all_to_all_single's split sizes); zero-byte blocks are
// still exchanged so both sides agree the block was empty.
//
// Bytes on the wire per rank: its blocks for the n-1 others; steps: 1.
Schedule buildAllToAllPairwise(const CollArgs& a) {
  Schedule s(a.dtype, a.op);
  s.setAlgorithm("pairwise");
  const int n = a.size, r = a.rank;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = static_cast<const std::byte*>(a.input);
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    s.recv(from, collTag(a.seq, 0), out + a.recvOffsets[from], a.recvBytes[from]);
  }
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    s.send(to, collTag(a.seq, 0), in + a.sendOffsets[to], a.sendBytes[to]);
  }
  if (a.sendBytes[r]) s.copy(out + a.recvOffsets[r], in + a.sendOffsets[r], a.sendBytes[r]);
  return s;
}

}  // namespace ringx
