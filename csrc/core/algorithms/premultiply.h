// PREMUL_SUM for the all-reduces that scale their input in place before the sum.
#pragma once

#include "core/algorithms/coll_args.h"
#include "core/engine/schedule.h"

namespace ringx {

// The step that scales this rank's buffer by the PREMUL_SUM factor, or
// kNoStep for every other op.
inline StepId premultiply(Schedule& s, const CollArgs& a, void* buf) {
  if (a.op != ReduceOp::PremulSum) return kNoStep;
  s.setScaleFactor(a.premulFactor);
  return s.scale(buf, a.bytes());
}

}  // namespace ringx
