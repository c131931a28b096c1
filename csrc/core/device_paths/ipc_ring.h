// The ipc path's chunked ring all_reduce, for buffers larger than two-shot
// serves well and for ops larger than the ipc buffer: each rank reads only
// its left peer's buffer, one chunk a step, with kIpcRingSlots chunks in
// flight (ipc_plan.h's IpcRingPlan says which chunk a step works on).
// ipc_collective.h enqueues it in place of the one-shot and two-shot rounds
// and keeps the rest: the verdict, the final copy, the failure handling.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/algorithms/coll_args.h"
#include "core/device/device.h"
#include "core/device_paths/ipc_peers.h"
#include "core/device_paths/ipc_plan.h"

namespace ringx {

// Enqueues on `s` the ring's device work for all_reduce `a`: `in` (a.count
// elements, device memory) reduced over the ranks into `out` (device memory
// of the op's own; Avg left as a sum). Its flag values are `first` ..
// `first + plan.writes() - 1`, reserved by the caller. Every wait also ends
// on `cancel`'s failed bit and then sets `taint`, as in the other rounds.
// Returns the words it waits on.
std::vector<IpcAwaited> enqueueIpcRing(DeviceStream& s, const IpcPeers& peers, const IpcRingPlan& plan,
                                       const CollArgs& a, const std::byte* in, std::byte* out, uint32_t first,
                                       const uint32_t* cancel, uint32_t* taint);

}  // namespace ringx
