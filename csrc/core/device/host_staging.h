// The host-staged data path: a collective on device buffers that the host's
// schedule runs, for a UCX without device-memory transports and for the
// simulated device. Everything the device does is enqueued on the
// communicator's stream when the collective is issued:
//
//   wait for the caller's stream as it is now
//   copy the input regions to page-locked host buffers, record `staged`
//   wait for a host flag the schedule sets when it ends
//   copy the output regions back, record `done`
//
// The op's schedule starts once `staged` has fired and ends once `done` has
// (both polled, never waited on), so the caller's stream can wait for
// `done` at once without blocking the host, as with NCCL. One stream, so a
// collective reads what an earlier one on the same communicator wrote.
// Ops on it therefore stage in issue order; their host schedules overlap.
//
// A schedule that fails still sets the flag (the stream must not wait
// forever), and the host buffers live until the device is done with them.
//
// With no regions this is the ordering of the device-resident path: the
// schedule (CollArgs::device) starts once the caller's stream got to the
// call and `done` fires once it ended. Its device steps then go on another
// stream than `comm`: one waiting on the flag would wait for itself.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/algorithms/coll_args.h"
#include "core/device/device.h"
#include "core/engine/schedule.h"

namespace ringx {

struct DeviceRegion {
  void* device = nullptr;
  size_t bytes = 0;
  bool in = false;   // read by the collective: copied to the host first
  bool out = false;  // written by it: copied back after
};

class HostStaging {
 public:
  // `cuts` (byte offsets 0 = c0 < c1 < ... < cn = the region's size) split
  // one region into n pieces, each its own collective: the copy to the host
  // of piece k + 1 overlaps the schedule of piece k, whose copy back
  // overlaps the schedules after it. Empty: one piece.
  HostStaging(Device& device, DeviceStream& comm, DeviceStream& caller, std::vector<DeviceRegion> regions,
              std::vector<size_t> cuts = {});

  void* host(size_t region) const;
  size_t pieces() const;
  // Piece k: its offset in the region and its bytes.
  std::pair<size_t, size_t> piece(size_t k) const;
  // The op's schedule: `schedule` between the two copies; with pieces, one
  // schedule per piece, in order.
  Schedule wrap(Schedule schedule) const;
  Schedule wrap(std::vector<Schedule> pieces) const;
  // Fires once the outputs are back on the device.
  const std::shared_ptr<DeviceEvent>& done() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// The device regions a collective reads and writes (buf, input).
std::vector<DeviceRegion> regionsOf(const CollArgs& a);
// Throws InvalidArgument, its message after `prefix` ("ringx: <op> (rank R,
// seq S): "), when `caller` is capturing a graph: nothing of a collective
// may join a capture (HostStaging checks it too, before it enqueues).
void refuseCapture(DeviceStream& caller, const std::string& prefix);
// Points a collective's buffers at the staging copies of regionsOf(a).
void pointAtHost(CollArgs& a, const HostStaging& staging);

}  // namespace ringx
