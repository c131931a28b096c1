// RINGX_HD marks what nvcc compiles for the device as well as the host: the
// arithmetic the CUDA kernels and the CPU loops (or the simulated device)
// share, so that the CPU tests run the same code.
#pragma once

#if defined(__CUDACC__)
#define RINGX_HD __host__ __device__
#else
#define RINGX_HD
#endif
