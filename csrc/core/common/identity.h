// What one collective call is, as every rank must agree on it: the kind of
// collective, its sequence number in the group, the root, the reduce op, the
// element type and the element count. Shared-memory chunks carry it in their
// slot header and network collectives send it to each peer they exchange
// data with, so ranks that called different things fail with an error that
// says what differs instead of combining unrelated bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/common/types.h"

namespace ringx {

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

// CollIdentity::flags.
inline constexpr uint8_t kReduction = 1;  // `op` is meaningful
// A sparse all_reduce: its ranks' element counts differ, and it meets a
// dense all_reduce only by mistake.
inline constexpr uint8_t kSparse = 16;
// Sent instead of the call by a rank that rejected its own arguments where
// the others could not see the problem (a root's list): they fail at once.
inline constexpr uint8_t kRejected = 2;
// Set by a single-copy exchange that failed after publishing its identity,
// for the peers that copy into its buffer or wait on its share
// (core/algorithms/cma_exchange.h).
inline constexpr uint8_t kFailedAfterPublishing = 4;
// Set with kFailedAfterPublishing when the engine ended such an exchange early
// (a timeout): its buffer went back to its caller, so no peer may copy from
// or into it any more.
inline constexpr uint8_t kWithdrawn = 8;

// Plain bytes, the same layout in every process of one build: it is copied
// into shared memory and onto the wire as it is.
struct CollIdentity {
  uint64_t seq = 0;
  uint64_t count = 0;  // elements every rank passes alike (0 where they may differ)
  int32_t root = -1;   // -1: the collective has no root
  uint8_t kind = 0;    // Collective
  uint8_t dtype = 0;   // DType
  uint8_t op = 0;      // ReduceOp for reductions, 0 otherwise
  uint8_t flags = 0;   // kReduction, kRejected, kSparse
  // The schedule's shape, which the ranks derive from their own settings
  // (RINGX_ALGO, RINGX_CHUNK_BYTES): 1 + the algorithm's row in the registry
  // and the pipelining segment, where the identity travels with messages.
  uint32_t segmentBytes = 0;
  uint8_t algorithm = 0;

  bool operator==(const CollIdentity&) const = default;
};
static_assert(sizeof(CollIdentity) == 32);

// "all_reduce (SUM, float32, 16 elements, seq 3)".
std::string describe(const CollIdentity& id);

// Empty when the identities match; otherwise what differs, for an error:
// "rank 1 called all_gather (float32, 16 elements, seq 3) where this rank
// called all_reduce (SUM, float32, 16 elements, seq 3): the collective
// differs. ...".
std::string mismatch(const CollIdentity& mine, const CollIdentity& theirs, int theirRank);

}  // namespace ringx
