#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/algorithms/cma_exchange.h"
#include "core/algorithms/registry.h"

namespace ringx {

namespace {

size_t extent(const std::vector<size_t>& offsets, const std::vector<size_t>& bytes) {
  size_t end = 0;
  for (size_t j = 0; j < offsets.size(); ++j) end = std::max(end, offsets[j] + bytes[j]);
  return end;
}

// A rank's input goes through its slot (CmaRecord::dataInline) while the n
// ranks' inputs together stay within this; beyond it, peers read it in
// place. The slot path copies every byte twice but makes no system call. On
// the 2-core VM (2026-11-28, docs/algorithms.md) the slot path won at world 2
// up to 128 KiB and was level at 256 KiB, and at world 4 was level at 32-64
// KiB and lost from 128 KiB (a quarter slower at 256 KiB): each rank's copy
// into its slot comes before any peer can read, and four ranks' copies share
// two cores.
constexpr size_t kInlineHostBytes = 256 << 10;

// The smallest tail a sender writes into its receiver (writtenTail): each
// costs the sender a system call. Tails from this size up were measured
// (docs/algorithms.md), none smaller.
constexpr size_t kMinWrittenTailBytes = 16 << 10;

// Where a rank passes no split sizes, its blocks are its tensor's rows cut
// evenly: ranks whose tensors differ in size then disagree the same way.
constexpr const char* kSplitRule =
    "(rank j's output_split_sizes[i] must equal rank i's input_split_sizes[j]; without split "
    "sizes, a rank's blocks are its tensor's rows cut evenly); the group is no longer usable, "
    "create a new one";

// Entry j of a split table that lies in a slot.
CmaBlock entry(const std::byte* table, int j) {
  CmaBlock b;
  std::memcpy(&b, table + size_t(j) * sizeof(CmaBlock), sizeof(b));
  return b;
}

// Whether two ranks' table entries for each other agree in both directions.
bool agree(const CmaBlock& pToQ, const CmaBlock& qToP) {
  return pToQ.sendBytes == qToP.recvBytes && pToQ.recvBytes == qToP.sendBytes;
}

// Where one direction of a pair moves more bytes than the other, a reader
// alone would copy more than its peer: the sender writes the tail of its
// block into the receiver (process_vm_writev) so that both copy half the
// pair's difference more than the smaller direction. `bytes` is the
// direction's block, `back` the other direction's; both ranks of the pair
// compute the same split from their agreeing tables. A sender whose input
// lies in its slot writes nothing: the receiver copies the block from there.
size_t writtenTail(uint64_t bytes, uint64_t back, bool senderInline) {
  if (senderInline || bytes <= back) return 0;
  const size_t tail = (bytes - back) / 2 / 64 * 64;
  return tail >= kMinWrittenTailBytes ? tail : 0;
}

// The exchange between ranks p and q as their tables describe it (entry q
// of p's, entry p of q's): a third rank's check of a pair it is not in.
void checkPair(int p, int q, const CmaBlock& pToQ, const CmaBlock& qToP) {
  if (agree(pToQ, qToP)) return;
  throw Error(ErrorKind::InvalidArgument,
              "ranks " + std::to_string(p) + " and " + std::to_string(q) +
                  " disagree on their split sizes: rank " + std::to_string(p) + " sends rank " +
                  std::to_string(q) + " " + std::to_string(pToQ.sendBytes) + " bytes and expects " +
                  std::to_string(pToQ.recvBytes) + " from it, where rank " + std::to_string(q) +
                  " expects " + std::to_string(qToP.recvBytes) + " and sends " +
                  std::to_string(qToP.sendBytes) +
                  " " + kSplitRule);
}

}  // namespace

// Intra-host all-to-all, with or without split sizes, with one copy per byte
// (Linux CMA).
//
// Every rank publishes its input and a table of its n exchanges (where its
// block for rank j starts, how many bytes it sends j and expects from j).
// Once every rank has published the same call, rank r reads entry r of each
// peer's table, checks both directions against its own split sizes (so a
// pair that disagrees fails on both sides instead of copying the wrong
// bytes), and reads its block straight out of each peer's input into its
// output, starting with r + 1. Where a pair's two blocks differ in size, the
// sender of the larger writes its tail into the receiver instead
// (writtenTail), so both copy the same. A rank returns only once every peer
// has finished reading its input and writing into its output
// (core/algorithms/cma_exchange.h), except when every rank's input lies in
// its slot (below). An input that
// overlaps the output is first copied aside, since peers read it while this
// rank writes its output. Inputs and outputs that are separate tensors
// (CollArgs::inputBlocks, blocks) are read and written in place: the table
// then holds each input block's address, against a record address of 0.
//
// Memory traffic per rank: its received bytes, copied once, against twice
// for the slot algorithm; two counter hand-offs. Each rank's table lies in
// its slot (where it fits), and with it a small input (kInlineHostBytes):
// its peers then copy from the slot, twice copied but no system call.
Schedule buildAllToAllCma(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("cma");
  const int n = a.size, r = a.rank;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = static_cast<const std::byte*>(a.input);
  const size_t inBytes = extent(a.sendOffsets, a.sendBytes);
  // Where this rank's block for rank j lies, and where rank q's block goes:
  // in the schedule's scratch, which the steps below point into (small
  // calls are where building the schedule shows).
  auto** src = reinterpret_cast<const std::byte**>(s.scratch(n * sizeof(std::byte*)));
  auto** dst = reinterpret_cast<std::byte**>(s.scratch(n * sizeof(std::byte*)));
  for (int j = 0; j < n; ++j) {
    src[j] = a.inputBlocks.empty() ? in + a.sendOffsets[j]
                                   : static_cast<const std::byte*>(a.inputBlocks[size_t(j)]);
    dst[j] = a.blocks.empty() ? out + a.recvOffsets[j]
                              : static_cast<std::byte*>(a.blocks[size_t(j)]);
  }

  // The table in the slot whenever it fits, the input after it when small
  // (CmaRecord::inlineBytes, dataInline): peers then copy from shared
  // memory, and an input that overlaps the output is safe once it is there.
  const size_t tableBytes = (n * sizeof(CmaBlock) + 63) / 64 * 64;
  const bool tableInline = tableBytes <= a.shm->slotBytes();
  const bool inlined = tableInline && size_t(n) * inBytes <= kInlineHostBytes &&
                       tableBytes + inBytes <= a.shm->slotBytes();
  // Only a packed input read from this rank's memory can meet an output block.
  bool inputOverlapsOutput = false;
  if (!inlined && a.inputBlocks.empty() && inBytes) {
    for (int q = 0; q < n; ++q) {
      const size_t bytes = a.recvBytes[q];
      if (bytes && in < dst[q] + bytes && dst[q] < in + inBytes) inputOverlapsOutput = true;
    }
  }
  StepId staged = kNoStep;
  if (inputOverlapsOutput) {
    std::byte* copy = s.scratch(inBytes);
    staged = s.copy(copy, in, inBytes);
    in = copy;
    for (int j = 0; j < n; ++j) src[j] = in + a.sendOffsets[j];
  }
  // Separate input blocks read from this rank's memory: their addresses
  // stand as offsets from 0. Inline, every input lies packed in the slot.
  const bool absolute = !inlined && !a.inputBlocks.empty();
  auto* table = reinterpret_cast<CmaBlock*>(s.scratch(n * sizeof(CmaBlock)));
  for (int j = 0; j < n; ++j) {
    const uint64_t at = absolute ? reinterpret_cast<uint64_t>(src[j]) : a.sendOffsets[j];
    table[j] = {at, a.sendBytes[j], a.recvBytes[j], reinterpret_cast<uint64_t>(dst[j])};
  }
  const CmaRecord mine{absolute ? 0 : reinterpret_cast<uint64_t>(in), inBytes, reinterpret_cast<uint64_t>(table),
                       tableInline ? tableBytes + (inlined ? inBytes : 0) : 0, inlined ? 1u : 0u};
  CmaExchange::Fill fill;
  if (tableInline) {
    fill = [=](std::byte* slot) {
      std::memcpy(slot, table, n * sizeof(CmaBlock));
      if (!inlined) return;
      for (int j = 0; j < n; ++j) {
        const CmaBlock& b = table[j];
        if (b.sendBytes) std::memcpy(slot + tableBytes + b.sendOffset, src[j], b.sendBytes);
      }
    };
  }

  addCmaExchange(
      s, a.shm, a.cma, cmaIdentity(a, &buildAllToAllCma), mine,
      [=](CmaExchange& x) {
        for (int k = 0; k < n; ++k) {
          const int q = (r + k) % n;
          CmaBlock theirs = table[r];
          if (q != r && x.record(q).inlineBytes != 0)
            theirs = entry(x.peerSlot(q), r);
          else if (q != r)
            x.cma().read(q, &theirs, x.record(q).table + r * sizeof(CmaBlock), sizeof(theirs));
          if (!agree(theirs, table[q])) {
            throw Error(
                ErrorKind::InvalidArgument,
                "rank " + std::to_string(q) + " sends this rank " +
                    std::to_string(theirs.sendBytes) + " bytes and expects " +
                    std::to_string(theirs.recvBytes) + " from it, where this rank " + "expects " +
                    std::to_string(table[q].recvBytes) + " and sends " +
                    std::to_string(table[q].sendBytes) +
                    ": the ranks' split sizes disagree " + kSplitRule);
          }
          if (!x.record(q).dataInline) {
            const size_t written = q == r ? 0 : writtenTail(theirs.sendBytes, table[q].sendBytes, false);
            x.addRead(q, x.record(q).addr + theirs.sendOffset, dst[q], theirs.sendBytes - written);
          }
          const size_t tail = q == r ? 0 : writtenTail(table[q].sendBytes, theirs.sendBytes, inlined);
          if (tail) {
            const size_t head = table[q].sendBytes - tail;
            x.addWrite(q, theirs.recvAddr + head, src[q] + head, tail);
          }
        }
        // Every table in a slot: this rank checks the pairs it is not in as
        // well, so that every rank fails when any pair disagrees, as their
        // results would if they waited for the pair's verdict.
        bool tablesInline = true, dataInline = true;
        for (int q = 0; q < n; ++q) {
          tablesInline = tablesInline && x.record(q).inlineBytes != 0;
          dataInline = dataInline && x.record(q).dataInline != 0;
        }
        if (tablesInline) {
          for (int p = 0; p < n; ++p) {
            for (int q = p + 1; q < n; ++q) {
              if (p == r || q == r) continue;
              checkPair(p, q, entry(x.peerSlot(p), q), entry(x.peerSlot(q), p));
            }
          }
        }
        // No peer reads this rank's memory: it need not wait for their copies.
        if (dataInline) x.endWithOwnCopies();
        // Copies out of slots wait until every pair is checked, as reads do.
        for (int q = 0; q < n; ++q) {
          if (!x.record(q).dataInline) continue;
          const CmaBlock theirs = entry(x.peerSlot(q), r);
          const std::byte* from = x.peerSlot(q) + tableBytes + theirs.sendOffset;
          if (theirs.sendBytes) std::memcpy(dst[q], from, theirs.sendBytes);
        }
      },
      staged, -1, std::move(fill));
  return s;
}

}  // namespace ringx
