// What an algorithm needs to know to emit its schedule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/common/types.h"

namespace ringx {

enum class Collective : uint8_t { AllReduce, Broadcast, AllGather };
inline constexpr int kNumCollectives = 3;

constexpr std::string_view collectiveName(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::Broadcast: return "broadcast";
    case Collective::AllGather: return "all_gather";
  }
  return "?";
}

struct CollArgs {
  Collective coll;
  int rank;
  int size;
  uint64_t seq;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  double premulFactor = 1.0;  // PremulSum only
  void* buf = nullptr;           // output (and input of in-place collectives)
  const void* input = nullptr;  // separate input, where the collective has one
  size_t count = 0;              // elements (all_gather: per rank)
  int root = 0;
  size_t segmentBytes = 256 * 1024;

  size_t bytes() const { return count * dtypeSize(dtype); }
};

// Collective tags: 24 bits of sequence number, 24 of message index. The top
// bit stays clear: point-to-point traffic owns it.
inline constexpr uint64_t kTagIndexBits = 24;
inline constexpr uint64_t kMaxTagIndex = (uint64_t{1} << kTagIndexBits) - 1;
inline uint64_t collTag(uint64_t seq, uint64_t index) {
  return ((seq & 0xffffff) << kTagIndexBits) | (index & kMaxTagIndex);
}

}  // namespace ringx
