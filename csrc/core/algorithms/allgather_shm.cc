#include "core/algorithms/registry.h"
#include "core/algorithms/shm_steps.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// Intra-host all-gather through shared memory.
//
// Terms: this rank's block is cut into slot-sized pieces; chunk k is piece k,
// numbered like the all-reduce's chunks and alternating between the two
// slots. For each chunk:
//   1. copy in: piece k of the input into this rank's slot (once every rank
//      has released the chunk that last used it); counter := 2 id - 1;
//   2. copy out: once every counter >= 2 id - 1, piece k of every rank's slot
//      into that rank's block of the output; release the chunk.
//
// Memory traffic per rank: N/n copied in, N copied out (N the output); no
// bytes on any wire.
Schedule buildAllGatherShm(const CollArgs& a) {
  Schedule s(a.dtype, a.op, a.device);
  s.setAlgorithm("shm");
  if (a.count == 0) return s;
  auto* out = static_cast<std::byte*>(a.buf);
  const auto* in = a.input ? static_cast<const std::byte*>(a.input) : out + a.rank * a.count * dtypeSize(a.dtype);
  shmGatherBlocks(s, a, in, out, true);
  return s;
}

}  // namespace ringx
