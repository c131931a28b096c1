// The host-staged data path: a collective on device buffers that the host's
// schedule runs, for a UCX without device-memory transports and for the
// simulated device. Everything the device does is enqueued when the
// collective is issued, on the group's two streams (DeviceOrder):
//
//   in:  wait for the caller's stream as it is now, and for the ops in
//        flight that touch the same memory
//        copy the input regions to page-locked host buffers, record `staged`
//   out: wait for `staged`
//        wait for a host flag the schedule sets when it ends
//        copy the output regions back into device memory of the op's own;
//        then, unless the flag says the op failed, into the caller's
//        tensors (device to device); record `done`
//
// The op's schedule starts once `staged` has fired and ends once `done` has
// (both polled, never waited on), so the caller's stream can wait for
// `done` at once without blocking the host, as with NCCL.
//
// Two streams, so that an op's copies in never wait behind an earlier op's
// host flag: consecutive collectives on other memory (DDP's buckets) run
// their host schedules side by side, and a send and a receive issued back to
// back (a ring exchange) both start at once, where on one stream the
// receive would wait for a send that waits, under rendezvous, for the peer's
// receive, itself behind the peer's send. An op on memory that an op in
// flight touches waits for that op's `done` first, so a collective reads
// what an earlier one on the same group wrote, whichever stream issued
// either. Copies back come in issue order.
//
// A schedule that fails still sets the flag, with kFlagFailed (the stream
// must not wait forever, and the caller's tensors keep what they held), and
// the buffers live until the device is done with them.
//
// With regions neither read nor written (in and out both false) nothing is
// copied: the ordering of the device-resident path, whose schedule
// (CollArgs::device) starts once the caller's stream and the ops on the same
// memory got there and whose `done` fires once it ended. Its device steps
// then go on another stream than `out`: one waiting on the flag would wait
// for itself.
#pragma once

#include <memory>
#include <mutex>
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

// A group's streams on its device, and the memory its ops in flight touch.
class DeviceOrder {
 public:
  explicit DeviceOrder(Device& device);
  ~DeviceOrder();
  DeviceOrder(const DeviceOrder&) = delete;
  DeviceOrder& operator=(const DeviceOrder&) = delete;
  Device& device() const { return device_; }
  DeviceStream& in() const { return *in_; }
  // The caller's stream waits for an op on this one.
  DeviceStream& out() const { return *out_; }

 private:
  friend class HostStaging;
  friend class IpcCollective;
  struct Touched {
    const std::byte* begin;
    const std::byte* end;
    std::shared_ptr<DeviceEvent> done;
  };
  // Makes `stream` wait for the ops in flight that touch `regions`, then
  // counts `regions` as touched until `done` fires. Under mu_.
  void orderAfter(const std::vector<DeviceRegion>& regions, DeviceStream& stream);
  void touch(const std::vector<DeviceRegion>& regions, const std::shared_ptr<DeviceEvent>& done);

  Device& device_;
  std::unique_ptr<DeviceStream> in_, out_;
  // Held while an op enqueues: ops issued from several threads then order
  // alike on both streams.
  std::mutex mu_;
  std::vector<Touched> inFlight_;
};

class HostStaging {
 public:
  // `cuts` (byte offsets 0 = c0 < c1 < ... < cn = the region's size) split
  // one region into n pieces, each its own collective: the copy to the host
  // of piece k + 1 overlaps the schedule of piece k, whose copy back
  // overlaps the schedules after it. Empty: one piece.
  HostStaging(DeviceOrder& order, DeviceStream& caller, std::vector<DeviceRegion> regions,
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
