#include "core/algorithms/registry.h"

namespace ringx {

// Dissemination barrier: in round k every rank sends a zero-byte message to
// rank r + 2^k and waits for one from rank r - 2^k before the next round.
// After ceil(log2 n) rounds each rank has heard, transitively, from all.
Schedule buildBarrierDissemination(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("dissemination");
  const int n = a.size, r = a.rank;
  StepId heard = kNoStep;
  uint64_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    s.send((r + dist) % n, collTag(a.seq, round), nullptr, 0, {heard});
    heard = s.recv((r - dist + n) % n, collTag(a.seq, round), nullptr, 0, {heard});
  }
  return s;
}

}  // namespace ringx
