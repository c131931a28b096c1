#include <algorithm>
#include <vector>

#include "core/algorithms/registry.h"

namespace ringx {

namespace {

// Blocks start, start+1, ..., start+count-1 (mod n) as at most two runs of
// the output: the second begins at block 0 where the first passes block n-1.
// Sender and receiver cut the same block range, so their pieces match.
std::vector<std::pair<int, int>> runsOf(int start, int count, int n) {
  if (start + count <= n) return {{start, count}};
  return {{start, n - start}, {0, count - (n - start)}};
}

}  // namespace

// Bruck all-gather, written straight into the output.
//
// Terms: the output holds n blocks, block q being rank q's input. Before
// round k rank r holds the 2^k blocks r, r+1, ... (mod n); in round k it
// sends the first min(2^k, n - 2^k) of them to rank r - 2^k and receives as
// many, those after its own run, from rank r + 2^k. A run that wraps past
// block n-1 travels as two messages. Every receive is posted at once; a
// round's sends wait for the rounds before it.
//
// Bytes on the wire per rank: (n-1)/n N of the N-byte output, as the ring;
// steps: ceil(log2 n) instead of n-1, each one whole message (or two).
Schedule buildAllGatherBruck(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("bruck");
  const int n = a.size, r = a.rank;
  const size_t blockBytes = a.count * dtypeSize(a.dtype);
  auto* out = static_cast<std::byte*>(a.buf);
  // Done once every block this rank holds so far is in the output.
  StepId held = kNoStep;
  if (a.input && a.input != out + r * blockBytes && blockBytes) {
    held = s.copy(out + r * blockBytes, a.input, blockBytes);
  }
  if (n == 1 || a.count == 0) return s;

  std::vector<StepId> lastRound;
  for (int k = 0, d = 1; d < n; ++k, d *= 2) {
    if (!lastRound.empty()) {
      lastRound.push_back(held);
      held = s.join(lastRound);
    }
    const int m = std::min(d, n - d);
    const int from = (r + d) % n, to = (r - d + n) % n;
    lastRound.clear();
    for (const auto& [block, blocks] : runsOf((r + d) % n, m, n)) {
      lastRound.push_back(s.recv(from, collTag(a.seq, 2 * k + int(lastRound.size())),
                                 out + block * blockBytes, size_t(blocks) * blockBytes));
    }
    int piece = 0;
    for (const auto& [block, blocks] : runsOf(r, m, n)) {
      s.send(to, collTag(a.seq, 2 * k + piece++), out + block * blockBytes,
             size_t(blocks) * blockBytes, {held});
    }
  }
  return s;
}

}  // namespace ringx
