// The ipc path's arithmetic, without a device: how a collective is cut into
// rounds that fit a rank's buffer, where each rank's part of a round lies in
// its buffer, and which all_reduce variant a size takes. Unit-tested on its
// own (test_ipc_path.cc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/algorithms/coll_args.h"
#include "core/patterns/ring.h"

namespace ringx {

enum class IpcShot : uint8_t { One, Two };

// One-shot: every rank reads the whole round out of every buffer and
// reduces it: one flag exchange, (n-1) N bytes read per rank. Two-shot:
// each rank reduces its 1/n portion (reduce-scatter), then copies the
// others' reduced portions (all-gather): two flag exchanges, 2 (n-1)/n N
// bytes. With link latency a (one flag exchange) and per-rank read
// bandwidth b, two-shot wins when a < (n - 2) N / (n b), i.e. never at 2
// ranks and from N = n a b / (n - 2) up. Neither constant has been measured
// (no GPU has run this path): a = 10 us for a flag written to host memory
// and seen by a peer's polling kernel over PCIe, b = 100 GB/s of NVLink
// reads per GPU, so from 2 MB at 4 ranks; vLLM's custom all-reduce takes
// two-shot from about 512 KiB.
inline constexpr double kIpcFlagExchangeSeconds = 10e-6;
inline constexpr double kIpcReadBytesPerSecond = 100e9;

inline IpcShot ipcAllReduceShot(size_t bytes, int n) {
  if (n <= 2) return IpcShot::One;
  const double crossover = n * kIpcFlagExchangeSeconds * kIpcReadBytesPerSecond / (n - 2);
  return double(bytes) >= crossover ? IpcShot::Two : IpcShot::One;
}

// Whether each rank fills its buffer with one piece per destination rank
// (reduce_scatter, all_to_all, scatter) rather than one piece in all.
inline bool ipcPerDestination(Collective c) {
  return c == Collective::ReduceScatter || c == Collective::AllToAll || c == Collective::Scatter;
}

// Elements of one block a round carries: as many as the buffer holds, one
// piece per destination where the collective has them. 0 when the buffer
// cannot hold one element per piece.
inline size_t ipcRoundElems(const CollArgs& a, size_t bufferBytes) {
  const size_t pieces = ipcPerDestination(a.coll) ? size_t(a.size) : 1;
  return bufferBytes / (pieces * dtypeSize(a.dtype));
}

// The rounds an op of `count` elements per block takes (0 for none).
inline size_t ipcRounds(size_t count, size_t roundElems) { return ring::numSegments(count, roundElems); }

// Round k's first element and length.
inline std::pair<size_t, size_t> ipcRound(size_t count, size_t roundElems, size_t k) {
  return {k * roundElems, ring::segmentLen(count, roundElems, k)};
}

// Two-shot: rank q's portion of a round of `len` elements (first element,
// length), the part it reduces for everyone.
inline std::pair<size_t, size_t> ipcPortion(size_t len, int n, int q) {
  return {ring::chunkStart(len, n, q), ring::chunkLen(len, n, q)};
}

}  // namespace ringx
