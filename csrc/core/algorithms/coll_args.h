// What an algorithm needs to know to emit its schedule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/common/types.h"

namespace ringx {

class ShmArea;

enum class Collective : uint8_t {
  AllReduce,
  Broadcast,
  AllGather,
  Reduce,
  ReduceScatter,
  AllToAll,
  Gather,
  Scatter,
  Barrier,
};
inline constexpr int kNumCollectives = 9;

constexpr std::string_view collectiveName(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::Broadcast: return "broadcast";
    case Collective::AllGather: return "all_gather";
    case Collective::Reduce: return "reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllToAll: return "all_to_all";
    case Collective::Gather: return "gather";
    case Collective::Scatter: return "scatter";
    case Collective::Barrier: return "barrier";
  }
  return "?";
}

struct CollArgs {
  CollArgs(Collective coll, int rank, int size, uint64_t seq) : coll(coll), rank(rank), size(size), seq(seq) {}

  Collective coll;
  int rank;
  int size;
  uint64_t seq;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  double premulFactor = 1.0;  // PremulSum only
  // Buffers. In-place collectives (all_reduce, broadcast, reduce) use `buf`
  // alone. Otherwise `input` is read and `buf` written; `count` is the
  // elements of one rank's block (all_gather, reduce_scatter, gather,
  // scatter: the input of all_gather and scatter's output are one block).
  void* buf = nullptr;
  const void* input = nullptr;
  size_t count = 0;
  // all_to_all: bytes sent to / received from each rank, and where in
  // `input` / `buf` each rank's block starts.
  std::vector<size_t> sendBytes, sendOffsets, recvBytes, recvOffsets;
  // all_to_all_single without split sizes: every block of every rank has the
  // same size, which each rank knows without asking the others.
  bool evenSplits = false;
  int root = 0;
  size_t segmentBytes = 256 * 1024;
  // Memory shared by all ranks when they are on one host; null otherwise.
  ShmArea* shm = nullptr;

  size_t bytes() const { return count * dtypeSize(dtype); }
};

// Collective tags: 24 bits of sequence number, 24 of message index. The top
// bit stays clear: point-to-point traffic owns it.
inline constexpr uint64_t kTagIndexBits = 24;
inline constexpr uint64_t kMaxTagIndex = (uint64_t{1} << kTagIndexBits) - 1;
inline uint64_t collTag(uint64_t seq, uint64_t index) {
  return ((seq & 0xffffff) << kTagIndexBits) | (index & kMaxTagIndex);
}

// Point-to-point tags: the top bit, then the user's 32-bit tag. Messages with
// equal tags between two ranks match in the order they were sent.
inline constexpr uint64_t kP2PTagBit = uint64_t{1} << 63;
inline uint64_t p2pTag(int32_t userTag) { return kP2PTagBit | uint32_t(userTag); }

}  // namespace ringx
