// CUDA counterparts of reduce.h's reduce and scale, with the same semantics
// (both are built from reduce_functors.h), for buffers in device memory.
// Both enqueue one kernel on `stream` and return without waiting for it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/common/types.h"

namespace ringx {

// dst[i] = op(dst[i], src[i]) for i in [0, count); dst and src may not overlap
// unless equal. Throws Error(Unsupported) for the pairs reduceFn rejects, and
// Error(Internal) when the launch fails.
void reduceCuda(void* dst, const void* src, size_t count, DType dtype, ReduceOp op, cudaStream_t stream);

// buf[i] *= factor, as scale() computes it. Floating dtypes only (throws
// Error(Unsupported) otherwise); Error(Internal) when the launch fails.
void scaleCuda(void* buf, size_t count, DType dtype, double factor, cudaStream_t stream);

}  // namespace ringx
