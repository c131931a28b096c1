#include "core/device/host_staging.h"

#include <algorithm>
#include <atomic>

#include "core/common/error.h"

namespace ringx {

namespace {

constexpr uint32_t kScheduleEnded = 1;

}  // namespace

struct HostStaging::State {
  std::vector<std::shared_ptr<std::byte>> host;
  std::shared_ptr<std::byte> flag;
  std::shared_ptr<DeviceEvent> staged;
  std::shared_ptr<DeviceEvent> done;

  void release() {
    std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(flag.get())).store(kScheduleEnded,
                                                                                std::memory_order_release);
  }

  // Whatever ended the op (or if it never ran), the stream gets past its
  // wait, and the host buffers outlive the copies that use them.
  ~State() {
    release();
    if (!done->query()) done->synchronize();
  }
};

HostStaging::HostStaging(Device& device, DeviceStream& comm, DeviceStream& caller,
                         std::vector<DeviceRegion> regions)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.flag = device.allocPinned(sizeof(uint32_t));
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(s.flag.get())).store(0, std::memory_order_relaxed);
  s.staged = device.newEvent();
  s.done = device.newEvent();
  for (const DeviceRegion& r : regions) s.host.push_back(device.allocPinned(r.bytes));

  auto callerNow = device.newEvent();
  caller.record(*callerNow);
  comm.wait(*callerNow);
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].in) comm.copy(s.host[i].get(), regions[i].device, regions[i].bytes);
  }
  comm.record(*s.staged);
  comm.waitFlag(reinterpret_cast<const uint32_t*>(s.flag.get()), kScheduleEnded);
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].out) comm.copy(regions[i].device, s.host[i].get(), regions[i].bytes);
  }
  comm.record(*s.done);
}

void* HostStaging::host(size_t region) const { return state_->host.at(region).get(); }

const std::shared_ptr<DeviceEvent>& HostStaging::done() const { return state_->done; }

Schedule HostStaging::wrap(Schedule schedule) const {
  Schedule s(schedule.dtype(), schedule.op());
  s.setScaleFactor(schedule.scaleFactor());
  auto state = state_;
  s.onAbandon([state] { state->release(); });
  const StepId staged = s.pollDevice([state] { return state->staged->query(); });
  std::vector<StepId> last = s.appendAfter(std::move(schedule), staged);
  if (last.empty()) last.push_back(staged);
  s.pollDevice(
      [state] {
        state->release();
        return state->done->query();
      },
      last);
  return s;
}

std::vector<DeviceRegion> regionsOf(const CollArgs& a) {
  const size_t es = dtypeSize(a.dtype);
  const size_t block = a.count * es;
  const size_t all = block * size_t(a.size);
  auto extent = [](const std::vector<size_t>& bytes, const std::vector<size_t>& offsets) {
    size_t end = 0;
    for (size_t i = 0; i < bytes.size(); ++i) end = std::max(end, offsets[i] + bytes[i]);
    return end;
  };
  size_t inBytes = 0, bufBytes = 0;
  bool bufIn = false;
  switch (a.coll) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::Reduce:
      bufBytes = block;
      bufIn = true;
      break;
    case Collective::AllGather:
    case Collective::Gather:
      inBytes = block;
      bufBytes = a.buf ? all : 0;
      break;
    case Collective::ReduceScatter:
    case Collective::Scatter:
      inBytes = a.input ? all : 0;
      bufBytes = block;
      break;
    case Collective::AllToAll:
      inBytes = extent(a.sendBytes, a.sendOffsets);
      bufBytes = extent(a.recvBytes, a.recvOffsets);
      break;
    case Collective::Barrier:
      break;
  }
  std::vector<DeviceRegion> regions;
  if (a.buf) regions.push_back({a.buf, bufBytes, bufIn, true});
  if (a.input && a.input == a.buf) {
    regions.back().in = true;
  } else if (a.input) {
    regions.push_back({const_cast<void*>(a.input), inBytes, true, false});
  }
  return regions;
}

void pointAtHost(CollArgs& a, const HostStaging& staging) {
  size_t i = 0;
  const bool shared = a.input && a.input == a.buf;
  if (a.buf) a.buf = staging.host(i++);
  if (shared) {
    a.input = a.buf;
  } else if (a.input) {
    a.input = staging.host(i);
  }
}

}  // namespace ringx
