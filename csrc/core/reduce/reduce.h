// Type-erased reduction kernels, chosen once per collective from a dtype x op table.
//
// Semantics shared by the CPU and CUDA paths:
// - float16 and bfloat16 are widened to float32, combined, and rounded back to
//   nearest-even in every call, so each reduction step accumulates in float32.
// - Sum/Avg/PremulSum all reduce as a sum; Avg and PremulSum are completed by
//   scale() (Avg by 1/n once, PremulSum by the factor before summing).
// - bool is logical: Sum/Max/BOr = or, Product/Min/BAnd = and, BXor = xor.
// - BAnd/BOr/BXor exist for integer and bool types only; Avg/PremulSum for
//   floating types only. Everything else is defined for every dtype.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/common/types.h"

namespace ringx {

// dst[i] = op(dst[i], src[i]) for i in [0, count). dst and src may not overlap
// unless equal.
using ReduceFn = void (*)(void* dst, const void* src, size_t count);

// dst[i] = op(a[i], b[i]): the out-of-place form, so a receive slot and a
// local input combine into a third buffer in one pass. dst may equal a or b.
using Reduce2Fn = void (*)(void* dst, const void* a, const void* b, size_t count);

// dst[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])..., srcs[nsrc-1][i]):
// the fused n-way form, so an intra-host reduce reads every peer's buffer once
// and writes once. 16-bit floats accumulate all sources in float32 and round
// once. nsrc >= 1 (else InvalidArgument); dst may equal a source.
using ReduceNFn = void (*)(void* dst, const void* const* srcs, int nsrc, size_t count);

bool reduceSupported(DType dtype, ReduceOp op);

// Throws ringx::Error(Unsupported) naming the dtype and op when not supported.
ReduceFn reduceFn(DType dtype, ReduceOp op);
Reduce2Fn reduce2Fn(DType dtype, ReduceOp op);
ReduceNFn reduceNFn(DType dtype, ReduceOp op);

// buf[i] *= factor, computed in float32 for 16-bit types and in the type's own
// precision otherwise. Floating dtypes only (throws Unsupported otherwise).
void scale(void* buf, size_t count, DType dtype, double factor);

// The instruction sets the CPU loops are compiled for (GCC target_clones
// names), and the one this CPU runs.
std::vector<std::string> cpuKernelTargets();
std::string cpuKernelTargetInUse();

}  // namespace ringx
