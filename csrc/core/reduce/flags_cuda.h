// CUDA kernels for the ipc path's flags (flags.h): one thread each, since a
// flag costs one word of system memory and the wait must not hold SMs that
// other ranks' kernels sharing the GPU need. Pointers are device addresses
// of host memory the device maps (cudaHostGetDevicePointer). Each enqueues
// on `stream`, of the current device, and returns; Error(Internal) when the
// launch fails, Error(InvalidArgument) past flags::kMaxFlags words.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ringx {

// Spins until every *words[i] >= atLeast or *cancel has flags::kFailed,
// then sets *taint to flags::kFailed when any of them has it.
void waitFlagsCuda(const uint32_t* const* words, int n, uint32_t atLeast, const uint32_t* cancel, uint32_t* taint,
                   cudaStream_t stream);
// After a system-scope fence, writes flags::signalValue(round, *taint) to
// every target.
void signalFlagsCuda(uint32_t* const* targets, int n, uint32_t round, const uint32_t* taint, cudaStream_t stream);
// Loads both kernels into the current device's context (loadCudaKernels).
void loadFlagKernels();

}  // namespace ringx
