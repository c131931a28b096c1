#include "core/algorithms/cma_exchange.h"
#include "core/algorithms/registry.h"

namespace ringx {

// Intra-host all-gather with one copy per byte (Linux CMA).
//
// Every rank publishes its input block; once every rank has published the
// same call, rank r copies its own block into block r of its output and
// reads every peer q's block straight into block q, starting with r + 1 so
// that the ranks do not all read rank 0 first. A rank returns only once every
// peer has finished reading its input (core/algorithms/cma_exchange.h).
//
// Memory traffic per rank: N copied once (N the output), against 1 + 1/n N
// for the slot algorithm; two counter hand-offs for the whole op. Outputs
// that are separate tensors (CollArgs::blocks) are read into in place, so a
// list of them costs no copy more than one tensor does.
Schedule buildAllGatherCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  if (a.count == 0) return s;
  const int n = a.size, r = a.rank;
  const size_t blockBytes = a.bytes();
  auto* out = static_cast<std::byte*>(a.buf);
  const std::vector<void*> blocks = a.blocks;
  auto block = [=](int q) {
    return blocks.empty() ? out + q * blockBytes : static_cast<std::byte*>(blocks[size_t(q)]);
  };
  const auto* in = a.input ? static_cast<const std::byte*>(a.input) : block(r);
  const CmaRecord mine{reinterpret_cast<uint64_t>(in), blockBytes, 0};
  addCmaExchange(s, a.shm, a.cma, cmaIdentity(a, &buildAllGatherCma), mine, [=](CmaExchange& x) {
    if (in != block(r)) x.addRead(r, x.record(r).addr, block(r), blockBytes);
    for (int k = 1; k < n; ++k) {
      const int q = (r + k) % n;
      x.addRead(q, x.record(q).addr, block(q), blockBytes);
    }
  });
  return s;
}

}  // namespace ringx
