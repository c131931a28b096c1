// What an algorithm needs to know to emit its schedule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/common/identity.h"
#include "core/common/types.h"
#include "core/device/device.h"

namespace ringx {

class Cma;
class ShmArea;
struct HostLayout;

struct CollArgs {
  CollArgs(Collective coll, int rank, int size, uint64_t seq) : coll(coll), rank(rank), size(size), seq(seq) {}

  Collective coll;
  int rank;
  int size;
  uint64_t seq;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  double premulFactor = 1.0;  // PremulSum only
  // Buffers. In-place collectives (all_reduce, broadcast, reduce) use `buf`
  // alone. Otherwise `input` is read and `buf` written; `count` is the
  // elements of one rank's block (all_gather, reduce_scatter, gather,
  // scatter: the input of all_gather and scatter's output are one block).
  void* buf = nullptr;
  const void* input = nullptr;
  size_t count = 0;
  // all_gather's outputs (on every rank), gather's outputs and scatter's
  // inputs (on the root) when the caller passed separate tensors: block q's
  // address, each `bytes()` long, none overlapping another or the rank's
  // other buffer. all_to_all's outputs likewise, block q recvBytes[q] long,
  // and its inputs in `inputBlocks`, block j sendBytes[j] long; none of
  // either list overlaps another. Only the algorithms takesSeparateBlocks()
  // names use them; for the others the caller packs the blocks into `buf` /
  // `input` instead. Empty: the blocks lie back to back in `buf` / `input`.
  std::vector<void*> blocks;
  std::vector<const void*> inputBlocks;
  // all_to_all: bytes sent to / received from each rank, and where in
  // `input` / `buf` each rank's block starts (where it would start packed,
  // when the blocks are separate).
  std::vector<size_t> sendBytes, sendOffsets, recvBytes, recvOffsets;
  // all_to_all_single without split sizes: every block of every rank has the
  // same size, which each rank knows without asking the others.
  bool evenSplits = false;
  int root = 0;
  size_t segmentBytes = 256 * 1024;
  // Memory shared by all ranks when they are on one host; null otherwise.
  ShmArea* shm = nullptr;
  // Single-copy reads of peers' memory, when every rank can make them; only
  // with `shm`.
  const Cma* cma = nullptr;
  // The group spans hosts: the network algorithms cross a slower link (the
  // cost model's inter-host constants apply).
  bool crossHost = false;
  // Set when the hierarchical algorithms apply (core/algorithms/host_layout.h).
  const HostLayout* hosts = nullptr;
  // Set when buf and input are device memory the schedule works on in place
  // (the device-resident path); only the network algorithms apply then.
  DeviceQueue device;

  size_t bytes() const { return count * dtypeSize(dtype); }
};

// Collective tags: 24 bits of sequence number, 24 of message index. The top
// bit stays clear: point-to-point traffic owns it.
inline constexpr uint64_t kTagIndexBits = 24;
inline constexpr uint64_t kMaxTagIndex = (uint64_t{1} << kTagIndexBits) - 1;
inline uint64_t collTag(uint64_t seq, uint64_t index) {
  return ((seq & 0xffffff) << kTagIndexBits) | (index & kMaxTagIndex);
}
// The message index of a collective's identity (algorithms stay below it).
inline constexpr uint64_t kIdentityTagIndex = kMaxTagIndex;

// The identity every rank must share for this call (see core/common/identity.h).
// all_to_all leaves the count out: with split sizes the ranks' totals may
// differ, and a rank may pass split sizes where another passes none (as gloo
// allows); each block's length is checked by its receive, or against the
// peer's table, instead. A barrier is its kind and number alone.
inline CollIdentity identityOf(const CollArgs& a) {
  CollIdentity id;
  id.seq = a.seq;
  id.kind = uint8_t(a.coll);
  if (a.coll == Collective::Barrier) return id;
  id.dtype = uint8_t(a.dtype);
  id.count = a.coll == Collective::AllToAll ? 0 : a.count;
  const bool rooted = a.coll == Collective::Broadcast || a.coll == Collective::Reduce ||
                      a.coll == Collective::Gather || a.coll == Collective::Scatter;
  id.root = rooted ? a.root : -1;
  const bool reduction =
      a.coll == Collective::AllReduce || a.coll == Collective::Reduce || a.coll == Collective::ReduceScatter;
  id.op = reduction ? uint8_t(a.op) : 0;
  id.flags = reduction ? kReduction : 0;
  return id;
}

// Point-to-point tags: the top bit, then the user's 32-bit tag. Messages with
// equal tags between two ranks match in the order they were sent.
inline constexpr uint64_t kP2PTagBit = uint64_t{1} << 63;
inline uint64_t p2pTag(int32_t userTag) { return kP2PTagBit | uint32_t(userTag); }

}  // namespace ringx
