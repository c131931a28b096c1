// Picks the algorithm for one call: a RINGX_ALGO override when it names an
// algorithm of this collective, else the cheapest by the alpha-beta model.
#pragma once

#include <mutex>
#include <optional>
#include <string>

#include "core/algorithms/registry.h"

namespace ringx {

// Parsed form of RINGX_ALGO: "ring" (any collective that has it) or
// "all_reduce:ring,broadcast:binomial". Throws InvalidArgument naming the
// valid choices when an entry matches no registered algorithm.
class AlgoOverride {
 public:
  explicit AlgoOverride(const std::string& spec);
  // Empty when the override says nothing for this collective.
  std::string_view forCollective(Collective coll) const;

 private:
  std::string spec_;
  std::string perColl_[kNumCollectives];
};

// Estimated microseconds for one algorithm on these arguments.
double estimateUs(const Algorithm& alg, const CollArgs& args);

// The chain broadcast's segment: the size that minimises its estimate
// (segments plus the chain's fill), between 16 KiB and args.segmentBytes.
// Every rank derives the same one from the same call.
size_t chainSegmentBytes(const CollArgs& args);

const Algorithm& selectAlgorithm(const CollArgs& args, const AlgoOverride& override);

// The model's choice alone, for the algorithms that pick their own parts
// (the inter-host phase of a hierarchical one).
const Algorithm& cheapestAlgorithm(const CollArgs& args);

// selectAlgorithm for a group, remembering the model's choice for the last
// call's shape: a training loop repeats its collectives on the same sizes,
// and scoring every registered algorithm took about 1,000 of the 12,000
// instructions ringx spent on an 8-byte all_reduce (callgrind, 2026-11-30).
// Calls with lists of separate blocks or split sizes, or on device memory,
// are scored every time. Safe to call from several threads.
class SelectionMemo {
 public:
  const Algorithm& select(const CollArgs& args, const AlgoOverride& override);

 private:
  // Every argument the algorithms' applies() and the cost model read.
  struct Shape {
    Collective coll;
    DType dtype;
    ReduceOp op;
    size_t count;
    int root, rank, size;
    bool evenSplits, crossHost;
    size_t segmentBytes;
    const void* shm;
    int shmCores;
    size_t shmSlotBytes;
    const void* cma;
    const void* hosts;
    bool operator==(const Shape&) const = default;
  };
  static std::optional<Shape> shapeOf(const CollArgs& args);

  std::mutex mu_;
  std::optional<Shape> last_;
  const Algorithm* chosen_ = nullptr;
};

}  // namespace ringx
