// Rank and chunk arithmetic of a ring: pure functions, no network.
#pragma once

#include <algorithm>
#include <cstddef>

namespace ringx::ring {

inline int right(int rank, int size) { return (rank + 1) % size; }
inline int left(int rank, int size) { return (rank - 1 + size) % size; }
inline int mod(long v, int size) { return int(((v % size) + size) % size); }

// `count` elements split into `parts` chunks whose lengths differ by at most
// one, the longer ones first, so every rank derives the same boundaries.
inline size_t chunkStart(size_t count, int parts, int c) {
  size_t base = count / parts, rem = count % parts;
  return c * base + std::min<size_t>(c, rem);
}
inline size_t chunkLen(size_t count, int parts, int c) {
  return count / parts + (size_t(c) < count % parts ? 1 : 0);
}

// A chunk is cut into segments of at most `segElems` elements; the last one
// may be shorter.
inline size_t numSegments(size_t len, size_t segElems) { return (len + segElems - 1) / segElems; }
inline size_t segmentLen(size_t len, size_t segElems, size_t g) {
  return std::min(segElems, len - g * segElems);
}
// `segElems`, doubled as often as it takes to cut `len` into at most `most`
// segments (each segment's message index must fit a tag).
inline size_t segmentWithin(size_t len, size_t segElems, size_t most) {
  while (numSegments(len, segElems) > most) segElems *= 2;
  return segElems;
}

}  // namespace ringx::ring
