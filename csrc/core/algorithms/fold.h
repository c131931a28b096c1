// The fold of the power-of-two all-reduces (recursive doubling, Rabenseifner):
// the ranks beyond the largest power of two hand their data to a partner.
#pragma once

#include <cstddef>

#include "core/algorithms/coll_args.h"
#include "core/engine/schedule.h"

namespace ringx {

// With p the largest power of two <= n, ranks r >= p ("extras") send their
// buffer to rank r - p (message 0) and get the result back from it
// (message 1); rank r - p reduces the extra's buffer into its own through
// `tmp` (a scratch buffer of the whole size, the algorithm's to reuse).
struct Fold {
  int p = 1;
  bool done = false;      // nothing more to schedule: an extra, one rank, or no elements
  bool hasExtra = false;  // this rank serves extra r + p
  StepId last = kNoStep;  // the step the power-of-two part starts after
  std::byte* tmp = nullptr;
};

inline Fold foldIn(Schedule& s, const CollArgs& a, std::byte* buf, StepId last) {
  Fold f;
  f.last = last;
  if (a.size == 1 || a.count == 0) {
    f.done = true;
    return f;
  }
  while (f.p * 2 <= a.size) f.p *= 2;
  const size_t bytes = a.bytes();
  if (a.rank >= f.p) {
    f.done = true;
    s.send(a.rank - f.p, collTag(a.seq, 0), buf, bytes, {last});
    s.recv(a.rank - f.p, collTag(a.seq, 1), buf, bytes);
    return f;
  }
  f.tmp = s.scratch(bytes);
  f.hasExtra = a.rank + f.p < a.size;
  if (f.hasExtra) {
    StepId in = s.recv(a.rank + f.p, collTag(a.seq, 0), f.tmp, bytes);
    f.last = s.reduce(buf, f.tmp, bytes, {in, last});
  }
  return f;
}

// The result back to this rank's extra, once `last` is done.
inline void foldOut(Schedule& s, const CollArgs& a, const Fold& f, std::byte* buf, StepId last) {
  if (f.hasExtra) s.send(a.rank + f.p, collTag(a.seq, 1), buf, a.bytes(), {last});
}

}  // namespace ringx
