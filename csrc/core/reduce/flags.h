// The arithmetic of the flag words that order the ipc path's rounds
// (core/device_paths/ipc_collective.h), in one place for the CUDA kernels
// (flags_cuda.cu) and the simulated device, which runs it on the CPU. A
// flag counts rounds; its top bit says the op failed, and compares above
// every count, so a failed peer (or this rank's own cancel word) ends every
// wait instead of leaving it to hang. nvcc compiles this as C++17.
#pragma once

#include <cstdint>

#include "core/reduce/hd.h"

namespace ringx::flags {

inline constexpr uint32_t kFailed = 0x80000000u;
// Rounds stay below the failed bit.
inline constexpr uint32_t kMaxRound = kFailed - 1;
// The most flag words one wait or signal takes: a kernel gets them by value.
inline constexpr int kMaxFlags = 32;

// Whether a wait for every flag load(i), i < n, to reach `atLeast` is over:
// all reached it, or `cancel` (the op's own verdict) has the failed bit.
template <class Load>
RINGX_HD bool reached(Load load, int n, uint32_t atLeast, uint32_t cancel) {
  if (cancel & kFailed) return true;
  for (int i = 0; i < n; ++i) {
    if (load(i) < atLeast) return false;
  }
  return true;
}

// kFailed when the wait ended on a failure: a flag or the cancel word that
// has the bit; 0 otherwise. Written to the op's taint word.
template <class Load>
RINGX_HD uint32_t failureSeen(Load load, int n, uint32_t cancel) {
  uint32_t failed = cancel & kFailed;
  for (int i = 0; i < n; ++i) failed |= load(i) & kFailed;
  return failed;
}

// What a signal writes for `round`: the failed bit travels on, so a peer
// that passed a wait on a failure taints every rank that waits on it.
RINGX_HD inline uint32_t signalValue(uint32_t round, uint32_t taint) { return round | (taint & kFailed); }

}  // namespace ringx::flags
