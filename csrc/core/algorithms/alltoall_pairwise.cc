#include <algorithm>
#include <cstdint>

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
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("pairwise");
  const int n = a.size, r = a.rank;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = static_cast<const std::byte*>(a.input);
  // all_to_all_single(x, x): receives would overwrite blocks not yet sent,
  // so the sends read a copy of the input taken before any receive lands.
  size_t inBytes = 0, outBytes = 0;
  for (int q = 0; q < n; ++q) {
    inBytes = std::max(inBytes, a.sendOffsets[q] + a.sendBytes[q]);
    outBytes = std::max(outBytes, a.recvOffsets[q] + a.recvBytes[q]);
  }
  StepId copied = kNoStep;
  const auto inAt = reinterpret_cast<uintptr_t>(in), outAt = reinterpret_cast<uintptr_t>(out);
  if (inBytes && outBytes && inAt < outAt + outBytes && outAt < inAt + inBytes) {
    std::byte* copy = s.scratch(inBytes);
    copied = s.copy(copy, in, inBytes);
    in = copy;
  }
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    s.recv(from, collTag(a.seq, 0), out + a.recvOffsets[from], a.recvBytes[from], {copied});
  }
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    s.send(to, collTag(a.seq, 0), in + a.sendOffsets[to], a.sendBytes[to], {copied});
  }
  if (a.sendBytes[r]) s.copy(out + a.recvOffsets[r], in + a.sendOffsets[r], a.sendBytes[r], {copied});
  return s;
}

}  // namespace ringx
