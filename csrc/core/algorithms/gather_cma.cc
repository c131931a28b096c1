#include <cstring>

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
// A root whose blocks are separate tensors (CollArgs::blocks) publishes a
// table of their addresses instead of one buffer: in its slot when it fits,
// so peers copy their entry out of shared memory, else in its memory, where
// they read it with one more process_vm_readv. The blocks are then copied
// in place, with no packing before a scatter or unpacking after a gather.
//
// Memory traffic: N in all (N the root's output), N/n per rank.

namespace {

// What the root publishes: its contiguous buffer, or its blocks' table.
struct RootRecord {
  CmaRecord record;
  CmaExchange::Fill fill;
};

RootRecord rootRecord(Schedule& s, const CollArgs& a, const void* contiguous) {
  const size_t total = size_t(a.size) * a.bytes();
  if (a.blocks.empty()) return {CmaRecord{reinterpret_cast<uint64_t>(contiguous), total, 0}, {}};
  const size_t tableBytes = a.blocks.size() * sizeof(uint64_t);
  auto* table = reinterpret_cast<uint64_t*>(s.scratch(tableBytes));
  for (size_t q = 0; q < a.blocks.size(); ++q) table[q] = reinterpret_cast<uint64_t>(a.blocks[q]);
  if (tableBytes > a.shm->slotBytes()) return {CmaRecord{0, total, reinterpret_cast<uint64_t>(table)}, {}};
  return {CmaRecord{0, total, reinterpret_cast<uint64_t>(table), tableBytes},
          [=](std::byte* slot) { std::memcpy(slot, table, tableBytes); }};
}

// Where block q lies in the root's memory, from the root's record.
uint64_t rootBlock(const CmaExchange& x, int root, int q, size_t blockBytes) {
  const CmaRecord& rec = x.record(root);
  if (!rec.table) return rec.addr + uint64_t(q) * blockBytes;
  uint64_t at = 0;
  if (rec.inlineBytes)
    std::memcpy(&at, x.peerSlot(root) + size_t(q) * sizeof(at), sizeof(at));
  else
    x.cma().read(root, &at, rec.table + uint64_t(q) * sizeof(at), sizeof(at));
  return at;
}

}  // namespace

Schedule buildGatherCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  if (a.count == 0) return s;
  const int r = a.rank, root = a.root;
  const size_t blockBytes = a.bytes();
  const void* in = a.input;
  RootRecord mine = r == root ? rootRecord(s, a, a.buf)
                              : RootRecord{CmaRecord{reinterpret_cast<uint64_t>(in), blockBytes, 0}, {}};
  addCmaExchange(
      s, a.shm, a.cma, cmaIdentity(a, &buildGatherCma), mine.record,
      [=](CmaExchange& x) { x.addWrite(root, rootBlock(x, root, r, blockBytes), in, blockBytes); },
      kNoStep, root, std::move(mine.fill));
  return s;
}

Schedule buildScatterCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  if (a.count == 0) return s;
  const int r = a.rank, root = a.root;
  const size_t blockBytes = a.bytes();
  void* out = a.buf;
  RootRecord mine = r == root ? rootRecord(s, a, a.input) : RootRecord{};
  addCmaExchange(
      s, a.shm, a.cma, cmaIdentity(a, &buildScatterCma), mine.record,
      [=](CmaExchange& x) { x.addRead(root, rootBlock(x, root, r, blockBytes), out, blockBytes); },
      kNoStep, root, std::move(mine.fill));
  return s;
}

}  // namespace ringx
