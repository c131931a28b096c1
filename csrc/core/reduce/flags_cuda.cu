// The ipc path's flag kernels. Their arithmetic is flags.h's, which the
// simulated device runs on the CPU in the tests.
#include <cuda_runtime.h>

#include <string>

#include "core/common/error.h"
#include "core/reduce/flags.h"
#include "core/reduce/flags_cuda.h"

namespace ringx {
namespace {

struct FlagList {
  const volatile uint32_t* p[flags::kMaxFlags];
};

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(ErrorKind::Internal, std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
  }
}

FlagList listOf(const uint32_t* const* words, int n, const char* what) {
  if (n < 0 || n > flags::kMaxFlags) {
    throw Error(ErrorKind::InvalidArgument, std::string(what) + ": at most " + std::to_string(flags::kMaxFlags) +
                                                " flag words, got " + std::to_string(n));
  }
  FlagList list{};
  for (int i = 0; i < n; ++i) list.p[i] = words[i];
  return list;
}

// volatile loads go to memory each pass (system memory is not cached in
// L1 for them); the fence after the wait keeps the reads of peers' data
// that follow on the stream from being satisfied before the flag was seen.
__global__ void waitFlagsKernel(FlagList words, int n, uint32_t atLeast, const volatile uint32_t* cancel,
                                volatile uint32_t* taint) {
  auto load = [&](int i) { return *words.p[i]; };
  while (!flags::reached(load, n, atLeast, *cancel)) __nanosleep(200);
  __threadfence_system();
  const uint32_t failed = flags::failureSeen(load, n, *cancel);
  if (failed) *taint = failed;
}

// The kernels before this one on the stream have finished and their writes
// are performed; the fence orders them, for every observer in the system,
// before the flag writes.
__global__ void signalFlagsKernel(FlagList targets, int n, uint32_t round, const volatile uint32_t* taint) {
  __threadfence_system();
  const uint32_t value = flags::signalValue(round, *taint);
  for (int i = 0; i < n; ++i) *const_cast<volatile uint32_t*>(targets.p[i]) = value;
}

}  // namespace

void waitFlagsCuda(const uint32_t* const* words, int n, uint32_t atLeast, const uint32_t* cancel, uint32_t* taint,
                   cudaStream_t stream) {
  const FlagList list = listOf(words, n, "waitFlagsCuda");
  waitFlagsKernel<<<1, 1, 0, stream>>>(list, n, atLeast, cancel, taint);
  check(cudaGetLastError(), "waitFlagsCuda");
}

void signalFlagsCuda(uint32_t* const* targets, int n, uint32_t round, const uint32_t* taint, cudaStream_t stream) {
  const FlagList list = listOf(const_cast<const uint32_t* const*>(targets), n, "signalFlagsCuda");
  signalFlagsKernel<<<1, 1, 0, stream>>>(list, n, round, taint);
  check(cudaGetLastError(), "signalFlagsCuda");
}

void loadFlagKernels() {
  cudaFuncAttributes attributes{};
  check(cudaFuncGetAttributes(&attributes, waitFlagsKernel), "loadFlagKernels");
  check(cudaFuncGetAttributes(&attributes, signalFlagsKernel), "loadFlagKernels");
}

}  // namespace ringx
