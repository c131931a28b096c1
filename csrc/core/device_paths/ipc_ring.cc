#include "core/device_paths/ipc_ring.h"

#include "core/patterns/ring.h"

namespace ringx {

std::vector<IpcAwaited> enqueueIpcRing(DeviceStream& s, const IpcPeers& peers, const IpcRingPlan& plan,
                                       const CollArgs& a, const std::byte* in, std::byte* out, uint32_t first,
                                       const uint32_t* cancel, uint32_t* taint) {
  const int n = a.size, r = a.rank, left = ring::left(r, n), right = ring::right(r, n);
  const size_t es = dtypeSize(a.dtype), slotBytes = plan.slotElems * es, writes = plan.writes();
  const bool premul = a.op == ReduceOp::PremulSum;
  std::vector<IpcAwaited> awaited;
  if (writes == 0) return awaited;
  const uint32_t last = first + uint32_t(writes) - 1;

  // The flags, in the phases of one-shot and two-shot: Arrive (the writer's
  // write w is in its slot w mod slots), counted from the left peer only;
  // Left (the reader is done with the owner's write w), from the right peer
  // only, but at the end to every peer, as the next op of any kind waits for
  // every peer's Left before it refills the buffer.
  const uint32_t* leftWrote = peers.mailbox(r, IpcPeers::Arrive, left);
  const uint32_t* rightRead = peers.mailbox(r, IpcPeers::Left, right);
  uint32_t* tellRight = peers.mailbox(right, IpcPeers::Arrive, r);
  uint32_t* tellLeft = peers.mailbox(left, IpcPeers::Left, r);
  const auto everyoneRead = peers.inbox(IpcPeers::Left);
  const auto tellEveryone = peers.outbox(IpcPeers::Left);
  auto slot = [&](int q, size_t w) { return peers.buffer(q) + (w % plan.slots) * slotBytes; };

  // No peer still reads this rank's buffer for an earlier op.
  s.waitFlags(everyoneRead.data(), n - 1, first - 1, cancel, taint);
  for (int q = 0; q < n; ++q) {
    if (q != r) awaited.push_back({IpcPeers::Left, q, first - 1});
  }

  // w counts this rank's writes over the whole op, and the left peer's too:
  // every rank writes at the same steps, so at a step that reads, the left
  // peer's write w - 1 is the chunk this step takes from it. A write into
  // slot w mod slots waits until the right peer has read write w - slots
  // out of it.
  size_t w = 0;
  for (size_t k = 0; k < plan.rounds; ++k) {
    const auto [o, len] = ipcRound(a.count, plan.roundElems(), k);
    for (size_t step = 0; step < plan.stepsPerRound(); ++step) {
      const int c = ipcRingChunk(r, n, step);
      const size_t at = (o + ring::chunkStart(len, n, c)) * es, elems = ring::chunkLen(len, n, c),
                   bytes = elems * es;
      const bool reads = step > 0, writesSlot = step < plan.writesPerRound();
      const std::byte* theirs = reads ? slot(left, w - 1) : nullptr;
      std::byte* mine = writesSlot ? slot(r, w) : nullptr;
      if (reads) s.waitFlags(&leftWrote, 1, first + uint32_t(w - 1), cancel, taint);
      if (writesSlot && w >= plan.slots) s.waitFlags(&rightRead, 1, first + uint32_t(w - plan.slots), cancel, taint);
      if (step < size_t(n)) {
        // Reduce-scatter: this rank's part, premultiplied in its slot where
        // asked, folded after what the ranks before it summed.
        if (step == 0 || premul) s.copy(mine, in + at, bytes);
        if (premul) s.scale(mine, elems, a.dtype, a.premulFactor);
        if (reads) {
          const void* srcs[2] = {theirs, premul ? static_cast<const void*>(mine) : in + at};
          s.reduceN(mine, srcs, 2, elems, a.dtype, a.op);
        }
        if (step == size_t(n) - 1) s.copy(out + at, mine, bytes);
      } else if (writesSlot) {
        s.copy(mine, theirs, bytes);
        s.copy(out + at, mine, bytes);
      } else {
        s.copy(out + at, theirs, bytes);
      }
      if (writesSlot) s.signalFlags(&tellRight, 1, first + uint32_t(w), taint);
      // The op's last read is acknowledged to every peer below.
      const bool lastStep = k + 1 == plan.rounds && !writesSlot;
      if (reads && !lastStep) s.signalFlags(&tellLeft, 1, first + uint32_t(w - 1), taint);
      if (writesSlot) ++w;
    }
  }
  s.signalFlags(tellEveryone.data(), n - 1, last, taint);
  awaited.push_back({IpcPeers::Arrive, left, last});
  if (writes > plan.slots) awaited.push_back({IpcPeers::Left, right, last - uint32_t(plan.slots)});
  return awaited;
}

}  // namespace ringx
