#include "core/algorithms/cma_exchange.h"
#include "core/algorithms/registry.h"

namespace ringx {

// Intra-host broadcast with one copy per byte (Linux CMA).
//
// Terms: the buffer is cut into n pieces; the other ranks are numbered
// j = 1 .. n - 1 from the root on. Every rank publishes its buffer; once
// every rank has published the same call, rank j reads every piece but piece
// j straight out of the root's memory, while the root writes piece j into
// rank j's buffer (process_vm_writev). The root would otherwise idle: this
// way every rank copies (n - 1)/n N, all at once. The root returns only once
// every peer has finished (core/algorithms/cma_exchange.h).
//
// Memory traffic: (n - 1) N in all, (n - 1)/n N per rank, against N more
// (the root's copy into the slots) for the slot algorithm; two counter
// hand-offs for the whole op.
Schedule buildBroadcastCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  if (a.size == 1 || a.count == 0) return s;
  const int n = a.size, r = a.rank, root = a.root;
  const size_t es = dtypeSize(a.dtype), count = a.count;
  auto* buf = static_cast<std::byte*>(a.buf);
  auto pieceStart = [=](int j) { return count * size_t(j) / size_t(n) * es; };
  const CmaRecord mine{reinterpret_cast<uint64_t>(buf), a.bytes(), 0};
  addCmaExchange(
      s, a.shm, a.cma, cmaIdentity(a, &buildBroadcastCma), mine,
      [=](CmaExchange& x) {
        if (r == root) {
          for (int j = 1; j < n; ++j) {
            const int q = (root + j) % n;
            x.addWrite(q, x.record(q).addr + pieceStart(j), buf + pieceStart(j),
                       pieceStart(j + 1) - pieceStart(j));
          }
          return;
        }
        const int me = (r - root + n) % n;
        for (int k = 0; k < n; ++k) {
          const int j = (me + 1 + k) % n;
          if (j != me)
            x.addRead(root, x.record(root).addr + pieceStart(j), buf + pieceStart(j),
                      pieceStart(j + 1) - pieceStart(j));
        }
      },
      kNoStep, root);
  return s;
}

}  // namespace ringx
