// Every algorithm describes itself in one table row: the registry feeds
// RINGX_ALGO, RINGX_DEBUG=INFO output and error messages.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/algorithms/coll_args.h"
#include "core/engine/schedule.h"

namespace ringx {

struct Algorithm {
  std::string_view name;
  Collective coll;
  std::string_view description;
  std::string_view constraints;  // human-readable; `applies` is the check
  bool (*applies)(const CollArgs&);
  Schedule (*build)(const CollArgs&);
};

std::span<const Algorithm> algorithms();

// The names registered for one collective, comma separated, for messages.
std::string algorithmNames(Collective coll);

// Whether `alg` reads or writes CollArgs::blocks (and inputBlocks) in place:
// the single-copy all_gather, gather, scatter and all_to_all, and the direct
// gather and scatter; the others need the blocks packed.
bool takesSeparateBlocks(const Algorithm& alg);

// Builders, one per file (<coll>_<alg>.cc).
Schedule buildAllReduceRing(const CollArgs& a);
Schedule buildAllReduceRecursiveDoubling(const CollArgs& a);
Schedule buildAllReduceShm(const CollArgs& a);
Schedule buildAllReduceOneShot(const CollArgs& a);
Schedule buildAllReduceRabenseifner(const CollArgs& a);
Schedule buildAllReduceHier(const CollArgs& a);
Schedule buildAllGatherHier(const CollArgs& a);
Schedule buildReduceScatterHier(const CollArgs& a);
Schedule buildBroadcastShm(const CollArgs& a);
Schedule buildBroadcastHier(const CollArgs& a);
Schedule buildAllGatherShm(const CollArgs& a);
Schedule buildAllToAllShm(const CollArgs& a);
Schedule buildReduceScatterShm(const CollArgs& a);
Schedule buildBroadcastBinomial(const CollArgs& a);
Schedule buildBroadcastChain(const CollArgs& a);
Schedule buildAllGatherRing(const CollArgs& a);
Schedule buildAllGatherBruck(const CollArgs& a);
Schedule buildReduceBinomial(const CollArgs& a);
Schedule buildReduceScatterRing(const CollArgs& a);
Schedule buildAllToAllPairwise(const CollArgs& a);
Schedule buildGatherBinomial(const CollArgs& a);
Schedule buildScatterBinomial(const CollArgs& a);
Schedule buildGatherDirect(const CollArgs& a);
Schedule buildScatterDirect(const CollArgs& a);
Schedule buildBarrierDissemination(const CollArgs& a);
Schedule buildBarrierShm(const CollArgs& a);
Schedule buildGatherShm(const CollArgs& a);
Schedule buildScatterShm(const CollArgs& a);
Schedule buildReduceShm(const CollArgs& a);
Schedule buildAllGatherCma(const CollArgs& a);
Schedule buildAllToAllCma(const CollArgs& a);
Schedule buildBroadcastCma(const CollArgs& a);
Schedule buildGatherCma(const CollArgs& a);
Schedule buildAllReduceCma(const CollArgs& a);
Schedule buildReduceScatterCma(const CollArgs& a);
Schedule buildScatterCma(const CollArgs& a);

}  // namespace ringx
