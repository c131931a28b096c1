// The ipc data path: a collective on device buffers of ranks on one host,
// moved and reduced device to device by ringx's kernels through each rank's
// registered buffer (ipc_peers.h), ordered by flags in host shared memory.
// Everything the device does is enqueued when the collective is issued, on
// the group's out() stream (DeviceOrder), so the caller's stream waits for
// `done` without the host blocking, as with NCCL:
//
//   wait for the caller's stream as it is now, and the ops in flight on the
//   same memory
//   for each round k (as much of the op as one buffer holds; rounds are
//   numbered across the group's ipc ops, so a reused buffer's flags never
//   match an earlier round):
//     wait until every peer signalled Left k-1: none reads this rank's
//       buffer any more
//     copy this rank's part of the round into its buffer; signal Arrive k
//       (after a system-scope fence: the copy is visible first)
//     wait until every peer signalled Arrive k
//     read the peers' buffers into device memory of the op's own:
//       one-shot: reduce the whole round out of every buffer;
//       two-shot: reduce this rank's 1/n portion out of every buffer back
//       into its own, signal Reduced k, wait for every peer's, copy their
//       portions;
//       the data movers copy the pieces they need
//     signal Left k
//   (or, all_reduce on the chunked ring: those rounds' flags and buffers,
//   each rank reading only its left peer's, chunk by chunk: ipc_ring.h)
//   wait for the host's verdict (every peer called the same collective),
//   average if asked, copy into the caller's tensors unless tainted, record
//   `done`
//
// The host's schedule publishes this op's identity in the control segment,
// compares every peer's (a mismatch fails the op naming the rank), sets the
// verdict, then polls `done` (naming the peers the device still waits on).
//
// Failure: every device wait also ends when the op's verdict word has the
// failed bit, which the host sets when the op fails for any reason (timeout,
// dead peer, mismatch, an abort). A wait that ended on a failure taints the
// op: its later signals carry the failed bit to its peers, whose waits end
// and taint in turn, and the copy into the caller's tensors is skipped. A
// rank whose device saw a peer's failure fails its op naming that peer. A
// failed group is not to be used again (its flags keep the failed bit), as
// the torch layer's next call says.
#pragma once

#include <memory>
#include <optional>

#include "core/algorithms/coll_args.h"
#include "core/device/device.h"
#include "core/device_paths/host_staging.h"
#include "core/device_paths/ipc_cost.h"
#include "core/device_paths/ipc_peers.h"
#include "core/device_paths/ipc_plan.h"
#include "core/engine/schedule.h"

namespace ringx {

class IpcCollective {
 public:
  // Whether the path implements `a`: every collective but the barrier, its
  // blocks packed in buf and input, all_to_all with even splits only. Not
  // whether the dtype and op exist (the constructor throws Unsupported).
  static bool supports(const CollArgs& a);
  // Enqueues the op (a.buf and a.input are device memory of the order's
  // device, a.seq its sequence number in the group). An all_reduce runs
  // ipcAllReduceAlgo's choice, `forced` where it applies. Throws before
  // enqueuing anything: InvalidArgument when `caller` is capturing or `a` is
  // not supported, Unsupported for a dtype x op that does not exist.
  IpcCollective(DeviceOrder& order, DeviceStream& caller, IpcPeers& peers, const CollArgs& a,
                std::optional<IpcAlgo> forced = std::nullopt);

  // The host's part, to submit as the op's schedule (once).
  Schedule schedule() const;
  // Fires once the caller's tensors hold the result (or, failed, never will).
  const std::shared_ptr<DeviceEvent>& done() const;
  // "ipc_one_shot", "ipc_two_shot", "ipc_ring", "ipc_copy".
  const char* algorithm() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ringx
