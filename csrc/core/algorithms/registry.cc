#include "core/algorithms/registry.h"

#include <array>

#include "core/algorithms/host_layout.h"

namespace ringx {

namespace {

bool always(const CollArgs&) { return true; }
// The host's processes cannot read device memory: the shared-memory,
// single-copy and hierarchical algorithms run on host buffers only.
bool sharedMemory(const CollArgs& a) { return a.shm != nullptr && !a.device; }
bool sharedMemoryEvenBlocks(const CollArgs& a) { return sharedMemory(a) && a.evenSplits; }
bool singleCopy(const CollArgs& a) { return sharedMemory(a) && a.cma != nullptr; }
// The single-copy reduce-scatter reads peers' inputs as they are, so it
// cannot scale each by its own rank's PREMUL_SUM factor.
bool singleCopyUnscaled(const CollArgs& a) { return singleCopy(a) && a.op != ReduceOp::PremulSum; }
// With two ranks the chain is the binomial tree's one edge.
bool threeOrMore(const CollArgs& a) { return a.size >= 3; }
bool hierarchical(const CollArgs& a) { return a.hosts != nullptr && !a.device; }
bool hierarchicalEven(const CollArgs& a) { return hierarchical(a) && a.hosts->even; }

constexpr std::array kAlgorithms{
    Algorithm{"ring", Collective::AllReduce,
              "reduce-scatter then all-gather around a ring, pipelined in segments; bandwidth-optimal",
              "any world size", &always, &buildAllReduceRing},
    Algorithm{"recursive_doubling", Collective::AllReduce,
              "log2(n) rounds of whole-buffer exchange with a partner; latency-optimal for small messages",
              "any world size (non-powers of two fold the extra ranks in first)", &always,
              &buildAllReduceRecursiveDoubling},
    Algorithm{"rabenseifner", Collective::AllReduce,
              "reduce-scatter by recursive halving, all-gather by recursive doubling: ring bandwidth in 2 log2(n) steps",
              "any world size (non-powers of two fold the extra ranks in first)", &always,
              &buildAllReduceRabenseifner},
    Algorithm{"shm", Collective::AllReduce,
              "two-shot through shared memory: copy in, fused n-way reduce of 1/n per rank, copy out",
              "all ranks on one host", &sharedMemory, &buildAllReduceShm},
    Algorithm{"oneshot", Collective::AllReduce,
              "one-shot through shared memory: every rank copies its whole buffer in and reduces all n copies "
              "itself; one hand-off per chunk instead of two, for small buffers",
              "all ranks on one host", &sharedMemory, &buildAllReduceOneShot},
    Algorithm{"cma", Collective::AllReduce,
              "two-shot with one copy: each rank reads its 1/n of every peer's buffer (process_vm_readv) and "
              "reduces it in place, then reads the other reduced slices",
              "all ranks on one host, able to read each other's memory", &singleCopy, &buildAllReduceCma},
    Algorithm{"hier", Collective::AllReduce,
              "shared-memory reduce-scatter on each host, an all-reduce among the ranks with the same local rank "
              "on every host (all at once), shared-memory all-gather; pipelined block by block",
              "more than one host, at least 2 ranks on some host", &hierarchical,
              &buildAllReduceHier},
    Algorithm{"binomial", Collective::Broadcast, "pipelined binomial tree from the root", "any root",
              &always, &buildBroadcastBinomial},
    Algorithm{"chain", Collective::Broadcast,
              "segments travel from the root along the ring of ranks, each rank forwarding what "
              "it received; every link carries the buffer once",
              "world size 3 or more", &threeOrMore, &buildBroadcastChain},
    Algorithm{"shm", Collective::Broadcast,
              "the root copies slot-sized chunks into shared memory, the others copy them out, pipelined",
              "all ranks on one host", &sharedMemory, &buildBroadcastShm},
    Algorithm{"cma", Collective::Broadcast,
              "every other rank reads the root's buffer straight out of its memory (process_vm_readv): one copy",
              "all ranks on one host, able to read each other's memory", &singleCopy, &buildBroadcastCma},
    Algorithm{"hier", Collective::Broadcast,
              "a broadcast among one rank per host from the root's host, then a shared-memory broadcast on each "
              "host; pipelined block by block",
              "more than one host, at least 2 ranks on some host", &hierarchical, &buildBroadcastHier},
    Algorithm{"ring", Collective::AllGather, "blocks travel around a ring, pipelined in segments", "any world size",
              &always, &buildAllGatherRing},
    Algorithm{"bruck", Collective::AllGather,
              "ceil(log2 n) rounds: rank r sends the blocks it has gathered to rank r-2^k and "
              "receives as many from r+2^k; latency-optimal for small blocks",
              "any world size", &always, &buildAllGatherBruck},
    Algorithm{"shm", Collective::AllGather,
              "each rank copies its block into shared memory and every rank copies all blocks out, chunk by chunk",
              "all ranks on one host", &sharedMemory, &buildAllGatherShm},
    Algorithm{"cma", Collective::AllGather,
              "every rank reads every peer's block straight out of its memory (process_vm_readv): one copy",
              "all ranks on one host, able to read each other's memory", &singleCopy, &buildAllGatherCma},
    Algorithm{"hier", Collective::AllGather,
              "an all-gather among the ranks with the same local rank on every host (all at once), then a "
              "shared-memory all-gather of what each gathered",
              "more than one host, the same number (at least 2) of ranks on each", &hierarchicalEven,
              &buildAllGatherHier},
    Algorithm{"binomial", Collective::Reduce, "pipelined binomial tree towards the root, reducing at each level",
              "any root", &always, &buildReduceBinomial},
    Algorithm{"shm", Collective::Reduce,
              "the shared-memory all-reduce's copy in and fused n-way reduce; only the root copies out",
              "all ranks on one host", &sharedMemory, &buildReduceShm},
    Algorithm{"ring", Collective::ReduceScatter, "partial sums travel around a ring, pipelined in segments",
              "any world size", &always, &buildReduceScatterRing},
    Algorithm{"shm", Collective::ReduceScatter,
              "each rank copies its input into shared memory and reduces its own block out of all n, chunk by chunk",
              "all ranks on one host", &sharedMemory, &buildReduceScatterShm},
    Algorithm{"cma", Collective::ReduceScatter,
              "each rank reads its block of every peer's input (process_vm_readv) and reduces it into its output",
              "all ranks on one host, able to read each other's memory; not PREMUL_SUM", &singleCopyUnscaled,
              &buildReduceScatterCma},
    Algorithm{"hier", Collective::ReduceScatter,
              "a shared-memory reduce-scatter on each host into the blocks of the ranks with each local rank, "
              "then a reduce-scatter of those among the same local rank on every host (all at once)",
              "more than one host, the same number (at least 2) of ranks on each", &hierarchicalEven,
              &buildReduceScatterHier},
    Algorithm{"pairwise", Collective::AllToAll, "every pair of ranks exchanges its blocks directly, all at once",
              "any split sizes", &always, &buildAllToAllPairwise},
    Algorithm{"shm", Collective::AllToAll,
              "each rank copies its blocks into shared memory and every rank copies out the ones addressed to it",
              "all ranks on one host, all_to_all_single without split sizes", &sharedMemoryEvenBlocks,
              &buildAllToAllShm},
    Algorithm{"cma", Collective::AllToAll,
              "every rank reads its block straight out of each peer's input (process_vm_readv): one copy",
              "all ranks on one host, able to read each other's memory; any split sizes", &singleCopy,
              &buildAllToAllCma},
    Algorithm{"binomial", Collective::Gather, "subtrees gather into contiguous runs on the way up a binomial tree",
              "any root", &always, &buildGatherBinomial},
    Algorithm{"direct", Collective::Gather,
              "every rank sends its block straight to the root; across hosts, each block crosses "
              "one link once",
              "any root", &always, &buildGatherDirect},
    Algorithm{"shm", Collective::Gather,
              "each rank copies its block into shared memory and the root copies all blocks out, chunk by chunk",
              "all ranks on one host", &sharedMemory, &buildGatherShm},
    Algorithm{"cma", Collective::Gather,
              "the root reads every rank's block straight out of its memory (process_vm_readv): one copy",
              "all ranks on one host, able to read each other's memory", &singleCopy, &buildGatherCma},
    Algorithm{"binomial", Collective::Scatter, "subtree runs split off on the way down a binomial tree", "any root",
              &always, &buildScatterBinomial},
    Algorithm{"direct", Collective::Scatter,
              "the root sends every block straight to its rank; across hosts, each block crosses "
              "one link once",
              "any root", &always, &buildScatterDirect},
    Algorithm{"shm", Collective::Scatter,
              "the root copies a piece of every block into its slot and each rank copies its own piece out",
              "all ranks on one host", &sharedMemory, &buildScatterShm},
    Algorithm{"cma", Collective::Scatter,
              "every rank reads its block straight out of the root's input (process_vm_readv): one copy",
              "all ranks on one host, able to read each other's memory", &singleCopy, &buildScatterCma},
    Algorithm{"dissemination", Collective::Barrier, "ceil(log2 n) rounds of zero-byte messages to rank r+2^k",
              "any world size", &always, &buildBarrierDissemination},
    Algorithm{"shm", Collective::Barrier, "every rank announces one empty chunk in shared memory and waits for all",
              "all ranks on one host", &sharedMemory, &buildBarrierShm},
};

}  // namespace

std::span<const Algorithm> algorithms() { return kAlgorithms; }

bool takesSeparateBlocks(const Algorithm& alg) {
  return alg.build == &buildAllGatherCma || alg.build == &buildGatherCma || alg.build == &buildScatterCma ||
         alg.build == &buildAllToAllCma || alg.build == &buildGatherDirect ||
         alg.build == &buildScatterDirect;
}

std::string algorithmNames(Collective coll) {
  std::string out;
  for (const auto& alg : kAlgorithms) {
    if (alg.coll != coll) continue;
    if (!out.empty()) out += ", ";
    out += alg.name;
  }
  return out;
}

}  // namespace ringx
