#include "core/common/identity.h"

namespace ringx {

std::string describe(const CollIdentity& id) {
  std::string s = std::string(collectiveName(Collective(id.kind))) + " (";
  if (id.flags & kSparse) s += "sparse, ";
  if (id.flags & kReduction) s += std::string(reduceOpName(ReduceOp(id.op))) + ", ";
  if (id.root >= 0) s += "root " + std::to_string(id.root) + ", ";
  if (Collective(id.kind) != Collective::Barrier) s += std::string(dtypeName(DType(id.dtype))) + ", ";
  if (id.count) s += std::to_string(id.count) + (id.count == 1 ? " element, " : " elements, ");
  return s + "seq " + std::to_string(id.seq) + ")";
}

std::string mismatch(const CollIdentity& mine, const CollIdentity& theirs, int theirRank) {
  if (mine == theirs) return {};
  if (theirs.flags & kRejected) {
    const std::string call = std::string(collectiveName(Collective(theirs.kind))) + " (" +
                             (theirs.root >= 0 ? "root " + std::to_string(theirs.root) + ", " : "") + "seq " +
                             std::to_string(theirs.seq) + ")";
    return "rank " + std::to_string(theirRank) + " rejected its arguments to " + call +
           " (its error says why) while this rank called " + describe(mine) +
           "; the group is no longer usable, create a new one";
  }
  std::string what;
  auto differs = [&](bool d, const char* field) {
    if (d) what += std::string(what.empty() ? "" : ", ") + field;
  };
  differs(mine.kind != theirs.kind, "the collective");
  differs(mine.seq != theirs.seq, "the sequence number (how many collectives each rank has called)");
  differs(mine.root != theirs.root, "the root");
  // A sparse call has no element count or algorithm to compare with a dense one.
  const bool layoutDiffers = (mine.flags & kSparse) != (theirs.flags & kSparse);
  differs(layoutDiffers, "the layout (one rank's tensor is sparse)");
  differs(mine.op != theirs.op || (mine.flags & ~kSparse) != (theirs.flags & ~kSparse), "the reduce op");
  differs(mine.dtype != theirs.dtype, "the dtype");
  differs(!layoutDiffers && mine.count != theirs.count,
          "the element count (the ranks passed tensors of different sizes)");
  differs(!layoutDiffers && (mine.algorithm != theirs.algorithm || mine.segmentBytes != theirs.segmentBytes),
          "the algorithm or its segment size (set RINGX_ALGO and RINGX_CHUNK_BYTES alike on every rank)");
  return "rank " + std::to_string(theirRank) + " called " + describe(theirs) + " where this rank called " +
         describe(mine) + "; they differ in " + what +
         ". Every rank must call the same collectives in the same order with the same root, reduce "
         "op, dtype and size; the group is no longer usable, create a new one";
}

}  // namespace ringx
