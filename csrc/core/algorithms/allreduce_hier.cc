#include <algorithm>
#include <cstring>
#include <vector>

#include "core/algorithms/hier_steps.h"
#include "core/algorithms/premultiply.h"
#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/patterns/ring.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

namespace {

// Blocks whose reduce-scatter runs before the all-gather of a block waiting
// for its inter-host phase: with two, the next block's inter-host phase is
// already on the wire when one ends, so the link never idles on shared memory.
constexpr size_t kLookahead = 2;

}  // namespace

// Hierarchical all-reduce for a group on several hosts: the narrow
// inter-host link carries each host's partial sum once instead of every
// rank's data, and every rank of a host uses it at the same time.
//
// Terms: the buffer is cut into slot-sized chunks as in the shared-memory
// all-reduce (allreduce_shm.cc), and each chunk into P portions, P the most
// ranks any host has (HostLayout::portions). On a host with L ranks, local
// rank l owns the portions p with p % L == l (one each when every host has
// P ranks; all P on a host with one rank), and its "share" is those portions
// laid end to end in a scratch buffer. Consecutive chunks form
// PipelineBlocks, each taken through three phases:
//   1. intra-host reduce-scatter (shared memory): every rank copies each
//      chunk into its slot; each rank reduces its portions out of its
//      host's L slots into its share;
//   2. inter-host all-reduce of each portion's share among its owners, one
//      rank per host (HostLayout::ownersOf; all portions at once), by the
//      cheapest flat all-reduce for that many hosts and bytes;
//   3. intra-host all-gather (shared memory): every rank copies its share
//      back into its portions of its slot, and every rank copies all
//      portions out into its buffer.
// The shared-memory chunks run in one order on every rank (the slots allow
// no other): block b's reduce-scatter, then block b - kLookahead + 1's
// all-gather, so the shared-memory phases of some blocks run while others
// are on the wire.
// AVG and PREMUL_SUM sum in every phase: the factor is applied once, to the
// input (PREMUL_SUM) or to the share before the all-gather (AVG).
//
// Bytes across a host's link each way: 2 (H-1)/H N for H hosts, however many
// ranks each has, against 2 (n-1)/n N on the busiest link of a flat ring
// over all n ranks.
Schedule buildAllReduceHier(const CollArgs& a) {
  const HostLayout& h = *a.hosts;
  ShmArea* shm = h.shm;
  const int L = h.localSize(), l = h.localRank, P = h.portions();
  const ReduceOp sumOp = a.op == ReduceOp::Avg || a.op == ReduceOp::PremulSum ? ReduceOp::Sum : a.op;
  Schedule s(a.dtype, sumOp, a.device);
  auto* buf = static_cast<std::byte*>(a.buf);
  StepId prev = premultiply(s, a, buf);
  if (a.count == 0) {
    s.setAlgorithm("hier");
    return s;
  }
  const size_t es = dtypeSize(a.dtype);
  const DType dtype = a.dtype;
  const ReduceNFn reduce = reduceNFn(a.dtype, sumOp);
  const ShmArea::SlotHeader header = identityOf(a);
  const PipelineBlocks pipeline(a.count, h.chunkBytes / es);
  const size_t chunkElems = pipeline.chunkElems(), blocks = pipeline.size();
  std::vector<int> owned;
  for (int p = l; p < P; p += L) owned.push_back(p);
  // Where the share of block b's j-th owned portion starts ([b * owned + j]):
  // the portions before it, of its chunks and the earlier blocks', end to end.
  std::vector<size_t> shareAt(blocks * owned.size() + 1, 0);
  for (size_t b = 0, k = 0; b < blocks; ++b) {
    const size_t count = pipeline.len(b);
    for (const int p : owned) {
      shareAt[k + 1] = shareAt[k];
      for (size_t at = 0; at < count; at += chunkElems) {
        shareAt[k + 1] += ring::chunkLen(std::min(chunkElems, count - at), P, p);
      }
      ++k;
    }
  }
  std::byte* share = s.scratch(shareAt.back() * es);
  const double avg = a.op == ReduceOp::Avg ? 1.0 / a.size : 1.0;
  // Chunk `at` (of `m` elements) of block b: where each owned portion's
  // share of it starts (this block's earlier chunks' shares before it).
  auto sharesOf = [&](size_t b, size_t at) {
    std::vector<std::byte*> starts(owned.size());
    for (size_t j = 0; j < owned.size(); ++j) {
      size_t before = 0;
      for (size_t c = 0; c < at; c += chunkElems) before += ring::chunkLen(chunkElems, P, owned[j]);
      starts[j] = share + (shareAt[b * owned.size() + j] + before) * es;
    }
    return starts;
  };

  // Alone on its host (L == 1), a rank's share is its whole buffer, gathered
  // into and out of the share by plain copies.
  auto copyBlock = [&](size_t b, bool out) {
    std::vector<StepId> done;
    for (size_t at = 0; at < pipeline.len(b); at += chunkElems) {
      std::byte* chunk = buf + (pipeline.start(b) + at) * es;
      const size_t m = std::min(chunkElems, pipeline.len(b) - at);
      const std::vector<std::byte*> shares = sharesOf(b, at);
      for (size_t j = 0; j < owned.size(); ++j) {
        const size_t off = ring::chunkStart(m, P, owned[j]) * es, bytes = ring::chunkLen(m, P, owned[j]) * es;
        if (!bytes) continue;
        if (!out) {
          done.push_back(s.copy(shares[j], chunk + off, bytes, {prev}));
          continue;
        }
        const StepId back = s.copy(chunk + off, shares[j], bytes, {prev});
        done.push_back(avg != 1.0 ? s.scale(chunk + off, bytes, {back}) : back);
      }
    }
    done.push_back(prev);
    prev = s.join(done);
  };
  auto scatterBlock = [&](size_t b) {
    if (!shm) return copyBlock(b, false);
    const ShmChunks part(shm, pipeline.len(b), chunkElems);
    part.forEach([&](uint64_t id, int, size_t at, size_t m) {
      const std::byte* chunk = buf + (pipeline.start(b) + at) * es;
      const std::vector<std::byte*> outs = sharesOf(b, at);
      prev = shmCopyIn(s, shm, id, header, [=](std::byte* slot) { std::memcpy(slot, chunk, m * es); }, prev);
      prev = shmReadAll(
          s, shm, id, header,
          [=](int which) {
            std::vector<const void*> srcs(static_cast<size_t>(L));
            for (size_t j = 0; j < owned.size(); ++j) {
              const size_t off = ring::chunkStart(m, P, owned[j]) * es, len = ring::chunkLen(m, P, owned[j]);
              if (!len) continue;
              for (int q = 0; q < L; ++q) srcs[size_t(q)] = shm->slot(q, which) + off;
              reduce(outs[j], srcs.data(), L, len);
            }
          },
          prev);
    });
  };
  auto gatherBlock = [&](size_t b, StepId acrossDone) {
    const StepId both[] = {prev, acrossDone};
    prev = s.join(both);
    if (!shm) return copyBlock(b, true);
    const ShmChunks part(shm, pipeline.len(b), chunkElems);
    part.forEach([&](uint64_t id, int, size_t at, size_t m) {
      std::byte* chunk = buf + (pipeline.start(b) + at) * es;
      const std::vector<std::byte*> ins = sharesOf(b, at);
      prev = shmCopyIn(
          s, shm, id, header,
          [=](std::byte* slot) {
            for (size_t j = 0; j < owned.size(); ++j) {
              const size_t off = ring::chunkStart(m, P, owned[j]) * es, len = ring::chunkLen(m, P, owned[j]);
              if (!len) continue;
              std::memcpy(slot + off, ins[j], len * es);
              if (avg != 1.0) scale(slot + off, len, dtype, avg);
            }
          },
          prev);
      prev = shmReadAll(
          s, shm, id, header,
          [=](int which) {
            for (int p = 0; p < P; ++p) {
              const size_t off = ring::chunkStart(m, P, p) * es, len = ring::chunkLen(m, P, p) * es;
              if (len) std::memcpy(chunk + off, shm->slot(p % L, which) + off, len);
            }
          },
          prev);
    });
  };

  std::vector<StepId> acrossDone(blocks, kNoStep);
  std::string_view inter;
  for (size_t t = 0; t < blocks + kLookahead - 1; ++t) {
    if (t < blocks) {
      scatterBlock(t);
      std::vector<StepId> last{prev};
      for (size_t j = 0; j < owned.size(); ++j) {
        const size_t k = t * owned.size() + j;
        CollArgs across = acrossHostsArgs(a, sumOp);
        across.buf = share + shareAt[k] * es;
        across.count = shareAt[k + 1] - shareAt[k];
        auto [ends, name] = appendAcrossHosts(s, a, across, prev, h.ownersOf(owned[j]), t * size_t(P) + size_t(owned[j]),
                                              blocks * size_t(P));
        last.insert(last.end(), ends.begin(), ends.end());
        inter = name;
      }
      acrossDone[t] = s.join(last);
    }
    if (t + 1 >= kLookahead) gatherBlock(t + 1 - kLookahead, acrossDone[t + 1 - kLookahead]);
  }
  // Set last: appending the inter-host phases to a schedule that has not yet
  // reduced (a rank alone on its host) takes their factor.
  if (avg != 1.0) s.setScaleFactor(avg);
  s.setAlgorithm("hier(" + std::string(inter) + ")");
  return s;
}

}  // namespace ringx
