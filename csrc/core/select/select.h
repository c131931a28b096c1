// Picks the algorithm for one call: a RINGX_ALGO override when it names an
// algorithm of this collective, else the cheapest by the alpha-beta model.
#pragma once

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

const Algorithm& selectAlgorithm(const CollArgs& args, const AlgoOverride& override);

// The model's choice alone, for the algorithms that pick their own parts
// (the inter-host phase of a hierarchical one).
const Algorithm& cheapestAlgorithm(const CollArgs& args);

}  // namespace ringx
