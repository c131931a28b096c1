// CUDA counterparts of reduce.h's reduce, n-way reduce and scale, with the
// same semantics (all are built from reduce_functors.h), for buffers in
// device memory. Each enqueues its kernels on `stream`, which must belong to
// the current device, and returns without waiting for them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/common/types.h"

namespace ringx {

// dst[i] = op(dst[i], src[i]) for i in [0, count); dst and src may not overlap
// unless equal. Throws Error(Unsupported) for the pairs reduceFn rejects, and
// Error(Internal) when the launch fails.
void reduceCuda(void* dst, const void* src, size_t count, DType dtype, ReduceOp op, cudaStream_t stream);

// The n-way reduce of reduceNFn: dst[i] = op over srcs[0..nsrc)[i] in index
// order, 16-bit floats accumulated in float32. `srcs` is a host array of
// device pointers, read before the call returns. dst may equal a source.
// One kernel reads up to 32 sources; beyond that each further 31 take one more
// kernel (folding into dst), 16-bit floats are rounded once per kernel, and
// dst may equal only one of the first 32 sources. Throws
// Error(InvalidArgument) when nsrc < 1, Error(Unsupported) for the pairs
// reduceNFn rejects, and Error(Internal) when the launch fails.
void reduceNCuda(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                 cudaStream_t stream);

// buf[i] *= factor, as scale() computes it. Floating dtypes only (throws
// Error(Unsupported) otherwise); Error(Internal) when the launch fails.
void scaleCuda(void* buf, size_t count, DType dtype, double factor, cudaStream_t stream);

// dst[0, bytes) = src[0, bytes), device memory both, unless *flag (device
// memory, or host memory mapped into the device's address space) has
// `failedBit` set when the kernel runs. Error(Internal) when the launch fails.
void copyUnlessFailedCuda(void* dst, const void* src, size_t bytes, const uint32_t* flag, uint32_t failedBit,
                          cudaStream_t stream);

// Loads every kernel above, for every dtype and op, and the flag kernels
// (flags_cuda.h) into the current device's context and caches what their
// launches query, so that no later launch does either. Error(Internal) when
// CUDA fails.
void loadCudaKernels();

}  // namespace ringx
