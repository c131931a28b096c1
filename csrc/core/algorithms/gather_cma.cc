#include "core/algorithms/cma_exchange.h"
#include "core/algorithms/registry.h"

namespace ringx {

// Intra-host gather and scatter with one copy per byte (Linux CMA).
//
// Gather: every rank publishes its buffer (the root its output); once every
// rank has published the same call, every other rank q writes its input
// straight into block q of the root's output (process_vm_writev) while the
// root copies its own block, all at once. Scatter: the root publishes its
// input, the n blocks back to back; every rank reads its block out of it.
// Either way a rank returns only once no peer still copies from or into its
// buffer (core/algorithms/cma_exchange.h).
//
// Memory traffic: N in all (N the root's output), N/n per rank.
Schedule buildGatherCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  if (a.count == 0) return s;
  const int r = a.rank, root = a.root;
  const size_t blockBytes = a.bytes();
  const void* in = a.input;
  const CmaRecord mine = r == root
                             ? CmaRecord{reinterpret_cast<uint64_t>(a.buf), a.size * blockBytes, 0}
                             : CmaRecord{reinterpret_cast<uint64_t>(in), blockBytes, 0};
  addCmaExchange(
      s, a.shm, a.cma, cmaIdentity(a, &buildGatherCma), mine,
      [=](CmaExchange& x) {
        x.addWrite(root, x.record(root).addr + r * blockBytes, in, blockBytes);
      },
      kNoStep, root);
  return s;
}

Schedule buildScatterCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  if (a.count == 0) return s;
  const int r = a.rank, root = a.root;
  const size_t blockBytes = a.bytes();
  void* out = a.buf;
  const CmaRecord mine{r == root ? reinterpret_cast<uint64_t>(a.input) : 0,
                       r == root ? a.size * blockBytes : 0, 0};
  addCmaExchange(
      s, a.shm, a.cma, cmaIdentity(a, &buildScatterCma), mine,
      [=](CmaExchange& x) {
        x.addRead(root, x.record(root).addr + r * blockBytes, out, blockBytes);
      },
      kNoStep, root);
  return s;
}

}  // namespace ringx
