#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host gather: the all-gather's chunks (allgather_shm.cc,
// shmGatherBlocks), with only the root copying them out. For each slot-sized
// piece k of the block:
//   1. copy in: piece k of this rank's input into its slot; counter :=
//      2 id - 1;
//   2. once every counter >= 2 id - 1: the root copies piece k of every
//      rank's slot into that rank's block of its output; every rank releases
//      the chunk (a slot is rewritten only once every rank, the root
//      included, has released the chunk that used it last).
//
// Memory traffic: N/n copied in per rank, N copied out by the root (N the
// root's output); no bytes on any wire.
Schedule buildGatherShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  if (a.count == 0) return s;
  shmGatherBlocks(s, a, static_cast<const std::byte*>(a.input), static_cast<std::byte*>(a.buf), a.rank == a.root);
  return s;
}

}  // namespace ringx
