#include "core/select/select.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/algorithms/hier_steps.h"
#include "core/algorithms/host_layout.h"
#include "core/common/error.h"
#include "core/patterns/hierarchy.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

namespace {

// The alpha-beta-gamma model's constants, in microseconds and microseconds
// per byte. Measured on the 2-core development VM (posix shared memory via
// UCX): alpha is the one-way time of a small tagged message through the
// progress threads (ucx_perftest tag_lat plus a thread wake-up); beta is the
// inverse of ucx_perftest tag_bw at 4 MiB (about 3.3 GB/s); gamma is the
// inverse of the float32 sum kernel's rate over cache-cold buffers (about
// 5 GB/s). Re-measure with benchmarks/collectives.py and update together.
struct Constants {
  double alphaUs = 8.0;
  double betaUsPerByte = 1.0 / 3300.0;
  double gammaUsPerByte = 1.0 / 5000.0;
  // Shared memory: a counter hand-off between ranks (a cache line moving
  // between cores, plus a yield when ranks outnumber cores), and one-core
  // memcpy at about 10 GB/s.
  double shmSyncUs = 1.0;
  double copyUsPerByte = 1.0 / 10000.0;
  // When a host's ranks outnumber its cores, a rank that waits for another
  // (a hand-off, a message) waits for the scheduler to run the ranks queued
  // before it: this much per rank queued on each core (a wake-up and a time
  // slice's start), fitted to all_reduce times at world 4, 8 and 16 on 2
  // cores (docs/algorithms.md).
  double roundUsPerRank = 30.0;
  // Single copy (CMA): the publish-match-finish hand-offs of one op, one
  // process_vm_readv call's fixed cost (0.45 us for 4 KiB), and its copy
  // rate between two processes (11-12 GB/s from 256 KiB to 16 MiB, 5.7 GB/s
  // at 64 MiB, where memcpy also drops). The hand-off constant puts the
  // crossover with the slot algorithms at 30-40 KiB at world 2, where
  // interleaved A/B runs of both found it (32-128 KiB, docs/algorithms.md).
  double cmaSyncUs = 5.0;
  double cmaCallUs = 0.5;
  double cmaUsPerByte = 1.0 / 11000.0;
  // What a single-copy broadcast costs beyond that when a host has 4 ranks
  // or more per core, per byte beyond one slot: fitted where the slot
  // broadcast began to win in every pattern (2 cores, 256 KiB slots,
  // 2026-11-30, docs/algorithms.md): from 512 KiB to 16 MiB at world 8 and
  // 16; below, the single copy was as fast with compute between calls. At
  // worlds 3 and 4 the slots won at 1 MiB only, not at 4-16 MiB.
  double cmaOversubscribedUsPerByte = 1.0 / 7700.0;
  // Between hosts (a group that spans several), measured on the namespace
  // test bed with 1 Gbit/s links (benchmarks/testbed.py): alpha is the
  // one-way time of an 8-byte send/recv between ranks on two hosts (the
  // median of four runs, which gave 14-66 us), beta the inverse of one TCP
  // stream's rate each way (117-119 MB/s). The
  // algorithms that move the whole buffer (or half of it) as one message per
  // round reached 70% of that rate over UCX's TCP transport where the
  // segmented ring reached all of it, hence their efficiency factor.
  double interAlphaUs = 50.0;
  double interBetaUsPerByte = 1.0 / 117.0;
  double interWholeMessageEfficiency = 0.7;
};
constexpr Constants kCost{};

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

const Algorithm* find(Collective coll, std::string_view name) {
  for (const auto& alg : algorithms()) {
    if (alg.coll == coll && alg.name == name) return &alg;
  }
  return nullptr;
}

}  // namespace

AlgoOverride::AlgoOverride(const std::string& spec) : spec_(spec) {
  std::string_view rest = spec_;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view entry = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (entry.empty()) continue;
    size_t colon = entry.find(':');
    bool matched = false;
    for (int ci = 0; ci < kNumCollectives; ++ci) {
      const Collective c = Collective(ci);
      std::string_view name = entry;
      if (colon != std::string_view::npos) {
        if (trim(entry.substr(0, colon)) != collectiveName(c)) continue;
        name = trim(entry.substr(colon + 1));
      }
      if (find(c, name)) {
        perColl_[int(c)] = std::string(name);
        matched = true;
      } else if (colon != std::string_view::npos) {
        throw Error(ErrorKind::InvalidArgument, "ringx: RINGX_ALGO entry '" + std::string(entry) +
                                                    "' names no algorithm of " + std::string(collectiveName(c)) +
                                                    "; choose from: " + algorithmNames(c));
      }
    }
    if (!matched) {
      std::string known;
      for (int ci = 0; ci < kNumCollectives; ++ci) {
        known += std::string(ci ? "; " : "") + std::string(collectiveName(Collective(ci))) + ": " +
                 algorithmNames(Collective(ci));
      }
      throw Error(ErrorKind::InvalidArgument,
                  "ringx: RINGX_ALGO entry '" + std::string(entry) + "' names no algorithm (" + known + ")");
    }
  }
}

std::string_view AlgoOverride::forCollective(Collective coll) const { return perColl_[int(coll)]; }

namespace {

// The inter-host part of a hierarchical algorithm: the cheapest flat version
// of the same collective among one rank per host, on `count` elements.
double acrossHostsUs(const CollArgs& a, size_t count) {
  CollArgs across = acrossHostsArgs(a, a.op);
  across.count = count;
  return estimateUs(cheapestAlgorithm(across), across);
}

// How many ranks take turns at each core: those of an all-reduce on one host
// whose ranks outnumber its cores (the only collective measured that way so
// far; the others keep the model as measured with a core per rank), else 1.
double turnsPerCore(const CollArgs& a) {
  if (!a.shm || a.coll != Collective::AllReduce) return 1.0;
  return std::max(1.0, double(a.size) / a.shm->cores());
}

// What ranks taking turns add to each wait for another rank: the scheduler
// running the ranks queued on a core before the awaited one.
double schedulerRoundUs(const CollArgs& a) {
  const double turns = turnsPerCore(a);
  return turns > 1 ? turns * kCost.roundUsPerRank : 0.0;
}

// Which host each of the group's ranks is on, for the broadcasts' link use:
// the layout's where the hierarchical algorithms apply, else, across hosts,
// one host per rank (no host holds two), else one host for all.
std::vector<int> hostOfRanks(const CollArgs& a) {
  std::vector<int> hostOf(size_t(a.size), 0);
  if (a.hosts) {
    for (int hh = 0; hh < a.hosts->hosts; ++hh) {
      for (int r : a.hosts->hostRanks[size_t(hh)]) hostOf[size_t(r)] = hh;
    }
  } else if (a.crossHost) {
    for (int r = 0; r < a.size; ++r) hostOf[size_t(r)] = r;
  }
  return hostOf;
}

}  // namespace

size_t chainSegmentBytes(const CollArgs& a) {
  // The chain's time is (N / s + n - 2) (alpha + s beta): smallest at
  // s = sqrt(N alpha / ((n - 2) beta)).
  const double alpha = a.crossHost ? kCost.interAlphaUs : kCost.alphaUs;
  const double beta = a.crossHost ? kCost.interBetaUsPerByte : kCost.betaUsPerByte;
  const double hops = std::max(1, a.size - 2);
  const double best = std::sqrt(double(a.bytes()) * alpha / (hops * beta));
  const double most = double(std::max<size_t>(1, a.segmentBytes));
  return size_t(std::clamp(best, std::min(16384.0, most), most));
}

double estimateUs(const Algorithm& alg, const CollArgs& a) {
  const double n = a.size, N = double(a.bytes());
  // The network algorithms' per-message and per-byte costs: a group that
  // spans hosts is as slow as its inter-host link.
  // Ranks that take turns at a core wait a scheduler round at each message and
  // copy and reduce one after another.
  const double turns = turnsPerCore(a);
  const double alpha = (a.crossHost ? kCost.interAlphaUs : kCost.alphaUs) + schedulerRoundUs(a);
  const double beta = (a.crossHost ? kCost.interBetaUsPerByte : kCost.betaUsPerByte) * turns;
  const double gamma = kCost.gammaUsPerByte * turns;
  const double wholeBeta = a.crossHost ? beta / kCost.interWholeMessageEfficiency : beta;
  const double lg = std::ceil(std::log2(std::max(1.0, n)));
  // Slot-sized chunks of `bytes`, for the shared-memory algorithms (a.shm set).
  auto shmChunks = [&](double bytes) { return std::max(1.0, std::ceil(bytes / double(a.shm->slotBytes()))); };
  // The power-of-two all-reduces: p ranks take part, the others fold in and out.
  const double p = std::exp2(std::floor(std::log2(std::max(1.0, n))));
  const double foldUs = p == n ? 0 : 2 * (alpha + N * beta);
  if (alg.build == &buildAllReduceRing) {
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * N * beta +
           (n - 1) / n * N * gamma;
  }
  if (alg.build == &buildAllReduceHier) {
    // Two shared-memory passes over this host's L ranks (copy in, reduce
    // 1/L; copy 1/L in, copy all out), then the cheapest flat all-reduce
    // among the hosts. Every local rank's share crosses the host's one link,
    // so that part is costed with the whole buffer.
    const HostLayout& h = *a.hosts;
    // On uneven hosts the busiest host's L ranks (its pieces) set the
    // shared-memory time, and every rank must reach the same estimate; a
    // rank alone on its host takes all its host's pieces across, whose link
    // carries what an even host's does. On the 3 + 1 and 2 + 1 + 1 test
    // beds (2026-11-30 night, docs/many-hosts.md) it took 0.69-0.96x the
    // flat ring's time at 64 MiB, quiet and beside two busy loops.
    const double L = h.portions();
    const double chunks = std::max(1.0, std::ceil(N / double(h.chunkBytes)));
    const double local = chunks * 4 * kCost.shmSyncUs + N * ((2 + 1 / L) * kCost.copyUsPerByte + kCost.gammaUsPerByte);
    return local + acrossHostsUs(a, a.count);
  }
  if (alg.build == &buildBroadcastHier) {
    // Taken only where it crosses the busiest link fewer times than the flat
    // binomial tree over all ranks would for this root and layout (on 2 x 2
    // hosts: roots 1 and 3, not 0 and 2), so the choice follows the link
    // bytes, not the flat tree's estimate alone. Then: the inter-host
    // broadcast, and the last pipeline block's shared-memory broadcast
    // (about 1/16 of the buffer; the others run while later blocks cross).
    const HostLayout& h = *a.hosts;
    const std::vector<int> hostOf = hostOfRanks(a);
    const int rootHost = hostOf[size_t(a.root)];
    if (hierarchy::busiestLinkEdgesAcrossHosts(h.hosts, rootHost) >= hierarchy::busiestLinkEdges(hostOf, a.root)) {
      return std::numeric_limits<double>::infinity();
    }
    const double lastBlock = std::min(N, std::max(N / 16, double(h.chunkBytes)));
    return acrossHostsUs(a, a.count) + 2 * kCost.shmSyncUs + 2 * lastBlock * kCost.copyUsPerByte;
  }
  if (alg.build == &buildAllGatherHier || alg.build == &buildReduceScatterHier) {
    // N is one block. A shared-memory pass over the H blocks of each of
    // the L local ranks (all_gather: H copied in, n copied out; reduce_
    // scatter: n copied in, H reduced from L), and the cheapest flat
    // collective among the hosts, costed with the L ranks' blocks together
    // since they share the host's link. Both are pipelined: only one block's
    // shared-memory pass is not beside the link's.
    const HostLayout& h = *a.hosts;
    const double chunks = std::max(1.0, std::ceil(n * N / double(h.shm->slotBytes())));
    const double local = chunks * 2 * kCost.shmSyncUs + (n + h.hosts) * N * kCost.copyUsPerByte +
                         (alg.build == &buildReduceScatterHier ? n * N * kCost.gammaUsPerByte : 0);
    const double blocks = double(PipelineBlocks(a.count, h.chunkBytes / dtypeSize(a.dtype)).size());
    const double across = acrossHostsUs(a, a.count * size_t(h.localSize()));
    return local / blocks + std::max(across, local * (blocks - 1) / blocks);
  }
  if (alg.build == &buildAllReduceOneShot && turns == 1) {
    // Forced only (RINGX_ALGO=all_reduce:oneshot) while every rank has a core:
    // against the two-shot at world 2 on the 2-core VM (2026-11-29, three
    // alternating runs, docs/algorithms.md) its time after the last rank's
    // arrival was level at 8 B-4 KiB, but whole calls took 1.0-1.7x the
    // two-shot's with a compute gap or another group's call between them,
    // where the two-shot's second wait keeps the ranks leaving together.
    return std::numeric_limits<double>::infinity();
  }
  if (alg.build == &buildAllReduceShm || alg.build == &buildAllReduceOneShot) {
    // Hand-offs per slot-sized chunk: three for the two-shot, one for the
    // one-shot. Memory traffic per rank: the two-shot copies in all but its
    // own 1/n, reduces 1/n of the chunk from n copies and copies the rest
    // out; the one-shot copies all in and reduces all of it from n copies.
    const double chunks = shmChunks(N);
    const double work = alg.build == &buildAllReduceShm
                            ? N * ((2 - 1 / n) * kCost.copyUsPerByte + kCost.gammaUsPerByte)
                            : N * (kCost.copyUsPerByte + n * kCost.gammaUsPerByte);
    const double handOffs = alg.build == &buildAllReduceShm ? 3 : 1;
    return chunks * handOffs * (kCost.shmSyncUs + schedulerRoundUs(a)) + work * turns;
  }
  if (alg.build == &buildReduceShm) {
    // The two-shot all-reduce's three hand-offs and its traffic (the root
    // alone copies out, and it is the slowest rank).
    const double chunks = shmChunks(N);
    return chunks * 3 * kCost.shmSyncUs + N * ((2 - 1 / n) * kCost.copyUsPerByte + kCost.gammaUsPerByte);
  }
  if (alg.build == &buildBroadcastBinomial && a.crossHost) {
    // Pipelined, the tree is as fast as its busiest link: a host sends the
    // buffer once per child it has on other hosts (the root's host
    // ceil(log2 n) times when every rank has a host of its own).
    const int edges = std::max(1, hierarchy::busiestLinkEdges(hostOfRanks(a), a.root));
    return lg * alpha + edges * N * beta;
  }
  if (alg.build == &buildBroadcastChain) {
    // Forced only (RINGX_ALGO=broadcast:chain) on one host, where no link is
    // shared and every hop costs a copy and a wake-up: through UCX's shared
    // memory (RINGX_SHM=0, world 4 on the 2-core VM, 2026-11-30, two
    // alternating runs, three patterns) it took 0.97-2.0x the tree's time at
    // 256 KiB, 1.08-2.9x at 1 MiB, 0.70-1.38x at 4 MiB, 0.98-1.25x at 16 MiB.
    if (!a.crossHost) return std::numeric_limits<double>::infinity();
    // Segments plus the chain's fill, each a message and a segment over the
    // busiest link, which carries the buffer once per chain edge crossing it.
    const double seg = std::min(N, double(chainSegmentBytes(a)));
    const double segments = std::max(1.0, std::ceil(N / std::max(1.0, seg)));
    const int edges = std::max(1, hierarchy::chainBusiestLinkEdges(hostOfRanks(a), a.root));
    return (segments + n - 2) * (alpha + seg * beta * edges);
  }
  if ((alg.build == &buildGatherBinomial || alg.build == &buildScatterBinomial) && a.crossHost) {
    // N is one block. The busiest link's blocks (the tree forwards whole
    // subtree runs, which can cross a link twice), and more: a rank forwards
    // a run only once all of it is in, so the root's largest subtree (the
    // virtual ranks from the top power of two below n) waits for all but one
    // of its blocks on the way, gather's before it crosses to the root,
    // scatter's after. On the test bed (8 x 1, 64 MiB) the tree took 1.15x
    // the direct gather's time and 1.7x its scatter's.
    const int blocks = hierarchy::binomialGatherBusiestLinkBlocks(hostOfRanks(a), a.root);
    int top = 1;
    while (2 * top < a.size) top *= 2;
    const int waiting = a.size > 1 ? tree::binomialSubtreeSize(top, a.size) - 1 : 0;
    return lg * alpha + (blocks + waiting) * N * beta;
  }
  if (alg.build == &buildGatherDirect || alg.build == &buildScatterDirect) {
    // N is one block. The root handles n - 1 messages one after another
    // (the on-host per-message cost each); across hosts they travel at once,
    // one inter-host latency, and the root host's link carries the other
    // hosts' blocks; on one host the root's memory takes every block.
    if (!a.crossHost) return (n - 1) * (alpha + N * beta);
    const int blocks = hierarchy::directGatherBusiestLinkBlocks(hostOfRanks(a), a.root);
    return alpha + (n - 1) * kCost.alphaUs + blocks * N * beta;
  }
  if (alg.build == &buildBroadcastShm) {
    // A counter hand-off per chunk; the root's copy-in of one chunk overlaps
    // the others' copy-out of the previous one.
    const double chunks = shmChunks(N);
    return chunks * kCost.shmSyncUs + (N + N / chunks) * kCost.copyUsPerByte;
  }
  // Single copy: one exchange per op, every rank copying at once; the time
  // is the busiest rank's.
  if (alg.build == &buildAllGatherCma) {
    // N is one block: n - 1 read, one copied locally.
    return kCost.cmaSyncUs + (n - 1) * (kCost.cmaCallUs + N * kCost.cmaUsPerByte) + N * kCost.copyUsPerByte;
  }
  if (alg.build == &buildBroadcastCma) {
    // The root writes one piece into each rank, which reads the other n - 2.
    // Every rank must run for the exchange's two hand-offs, where the slot
    // broadcast's readers copy out whenever they are scheduled.
    const bool crowded = a.shm && a.size >= 4 * a.shm->cores();
    const double beyondSlot = crowded ? std::max(0.0, N - double(a.shm->slotBytes())) : 0.0;
    return kCost.cmaSyncUs + (n - 1) * (kCost.cmaCallUs + N / n * kCost.cmaUsPerByte) +
           beyondSlot * kCost.cmaOversubscribedUsPerByte;
  }
  if (alg.build == &buildAllReduceCma || alg.build == &buildReduceScatterCma) {
    // Forced only (RINGX_ALGO=all_reduce:cma, reduce_scatter:cma): against
    // the slot algorithms on the 2-core VM (2026-11-28, docs/algorithms.md)
    // neither won in every pattern. The all-reduce lost at world 2 up to
    // 1 MiB (1.3-1.4x at 64-256 KiB) and at world 4 at every size from
    // 64 KiB to 16 MiB (1.1-1.5x); it won only at world 2 from 4 MiB
    // (0.7-0.9x). The reduce-scatter won back to back at world 2 from
    // 256 KiB (0.67-0.9x) but lost at world 4, 256 KiB, with another
    // group's collective between calls (1.4x), and was level at 4 MiB.
    // Five rounds at world 2 in all three patterns put both within
    // 0.87-1.05x of the slot algorithms from 1 MiB, ranges overlapping,
    // and 1.01-1.22x slower at 256 KiB.
    // The slot algorithms' copies land in slots that stay in cache, which
    // leaves a single copy little to save in a reduction.
    return std::numeric_limits<double>::infinity();
  }
  // N is one block, which each rank reads (scatter) or writes (gather).
  if (alg.build == &buildGatherCma || alg.build == &buildScatterCma) {
    return kCost.cmaSyncUs + kCost.cmaCallUs + N * kCost.cmaUsPerByte;
  }
  if (alg.build == &buildAllToAllCma) {
    // Taken at every size, with split sizes or without: with them the ranks'
    // byte counts differ, and so would their estimates, but the choice must
    // be the same on every rank; and a rank may pass split sizes where
    // another passes none (gloo allows it), so both forms must choose alike.
    // Small inputs go through the slots (CmaRecord::dataInline).
    return 0;
  }
  if (alg.build == &buildAllGatherRing) {
    return (n - 1) * (alpha + N * beta);
  }
  if (alg.build == &buildAllGatherBruck) {
    // Forced only (RINGX_ALGO=all_gather:bruck). Its estimate, the ring's
    // bytes in ceil(log2 n) rounds of whole messages, undercuts the ring's
    // for small blocks across hosts, but on the test bed (2026-11-30, 3 runs
    // in turns with the build before, docs/algorithms.md) it took 0.90-1.10x
    // the flat ring's time at 4 KiB on 8 x 1 and, as the inter-host phase of
    // the hierarchy, 1.02-1.16x on 4 x 2: with every host's ranks on 2 shared
    // cores a message costs more than a round of latency.
    return std::numeric_limits<double>::infinity();
  }
  if (alg.build == &buildAllGatherShm) {
    // N is one block: copied in once, and all n copied out.
    const double chunks = shmChunks(N);
    return chunks * 2 * kCost.shmSyncUs + (n + 1) * N * kCost.copyUsPerByte;
  }
  if (alg.build == &buildAllToAllShm) {
    // Forced only (RINGX_ALGO=all_to_all:shm, every rank calling without
    // split sizes): a rank may pass split sizes where another passes none
    // (gloo allows it), so both forms must choose alike, and without the
    // single copy the one algorithm that serves both is pairwise. With
    // UCX's and ringx's single copy both off (UCX_TLS=^cma RINGX_CMA=0) on
    // the 2-core VM (2026-11-28, two alternating runs, us) pairwise took
    // 13-17 against 10-16 at 4 KiB and 62-79 against 45-64 at 256 KiB at
    // world 2, 91-142 against 62-89 and 257-350 against 226-253 at world 4,
    // and was level at 4 MiB: the price of calls that mix, as gloo's do.
    return std::numeric_limits<double>::infinity();
  }
  if (alg.build == &buildReduceScatterRing) {
    return (n - 1) * (alpha + N * (beta + kCost.gammaUsPerByte));
  }
  if (alg.build == &buildReduceScatterShm) {
    // N is one block: every rank copies in the n - 1 blocks of the others
    // (all n for PREMUL_SUM, which scales them) and reduces one from n.
    const double chunks = shmChunks(n * N);
    const double copied = a.op == ReduceOp::PremulSum ? n : n - 1;
    return chunks * 2 * kCost.shmSyncUs + copied * N * kCost.copyUsPerByte + (n + 1) / 3 * N * kCost.gammaUsPerByte;
  }
  if (alg.build == &buildBarrierShm) return 2 * kCost.shmSyncUs;
  if (alg.build == &buildGatherShm) {
    // N is one block: copied in by every rank, all n copied out by the root.
    return shmChunks(N) * 2 * kCost.shmSyncUs + (n + 1) * N * kCost.copyUsPerByte;
  }
  if (alg.build == &buildScatterShm) {
    // N is one block: the root copies in all n, each rank copies out one.
    return shmChunks(n * N) * 2 * kCost.shmSyncUs + (n + 1) * N * kCost.copyUsPerByte;
  }
  if (alg.build == &buildReduceBinomial) {
    // Each round's receiver reduces what it received before it sends on.
    // Without that term the tree undercut reduce:shm at world 2 from
    // 256 KiB, where it took 1.36-1.91x shm's time (the medians of five
    // paired runs) in every pattern (2026-11-28, docs/algorithms.md).
    return lg * (alpha + N * (beta + kCost.gammaUsPerByte));
  }
  if (alg.build == &buildAllReduceRabenseifner) {
    return 2 * std::log2(p) * alpha + 2 * (p - 1) / p * N * wholeBeta +
           (p - 1) / p * N * gamma + foldUs;
  }
  if (alg.build == &buildAllReduceRecursiveDoubling) {
    return std::log2(p) * (alpha + N * (wholeBeta + gamma)) + foldUs;
  }
  return lg * (alpha + N * beta);
}

const Algorithm& selectAlgorithm(const CollArgs& args, const AlgoOverride& override) {
  std::string_view forced = override.forCollective(args.coll);
  if (!forced.empty()) {
    const Algorithm* alg = find(args.coll, forced);
    if (alg && alg->applies(args)) return *alg;
  }
  return cheapestAlgorithm(args);
}

const Algorithm& cheapestAlgorithm(const CollArgs& args) {
  const Algorithm* best = nullptr;
  double bestUs = std::numeric_limits<double>::infinity();
  for (const auto& alg : algorithms()) {
    if (alg.coll != args.coll || !alg.applies(args)) continue;
    double us = estimateUs(alg, args);
    if (us < bestUs) {
      bestUs = us;
      best = &alg;
    }
  }
  if (!best) {
    throw Error(ErrorKind::Internal, "ringx: no algorithm registered for " + std::string(collectiveName(args.coll)));
  }
  return *best;
}

std::optional<SelectionMemo::Shape> SelectionMemo::shapeOf(const CollArgs& a) {
  if (a.device || !a.blocks.empty() || !a.inputBlocks.empty() || !a.sendBytes.empty() ||
      !a.recvBytes.empty() || !a.sendOffsets.empty() || !a.recvOffsets.empty()) {
    return std::nullopt;
  }
  return Shape{a.coll,
               a.dtype,
               a.op,
               a.count,
               a.root,
               a.rank,
               a.size,
               a.evenSplits,
               a.crossHost,
               a.segmentBytes,
               a.shm,
               a.shm ? a.shm->cores() : 0,
               a.shm ? a.shm->slotBytes() : 0,
               a.cma,
               a.hosts};
}

const Algorithm& SelectionMemo::select(const CollArgs& args, const AlgoOverride& override) {
  if (!override.forCollective(args.coll).empty()) return selectAlgorithm(args, override);
  const std::optional<Shape> shape = shapeOf(args);
  if (!shape) return cheapestAlgorithm(args);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (chosen_ && last_ == shape) return *chosen_;
  }
  const Algorithm& alg = cheapestAlgorithm(args);
  std::lock_guard<std::mutex> lock(mu_);
  last_ = shape;
  chosen_ = &alg;
  return alg;
}

}  // namespace ringx
