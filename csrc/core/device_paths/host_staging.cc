#include "core/device_paths/host_staging.h"

#include <algorithm>
#include <atomic>

#include "core/common/error.h"

namespace ringx {

struct HostStaging::State {
  Device* device = nullptr;
  std::vector<std::shared_ptr<std::byte>> host;
  // Per output region: where the copies back land, on the device, until the
  // op is known to have succeeded.
  std::vector<std::shared_ptr<std::byte>> back;
  std::shared_ptr<std::byte> flag;
  std::vector<std::shared_ptr<DeviceEvent>> staged, done;  // per piece
  // Pieces whose schedule ended; the flag counts the leading run of them
  // (piece k's copy back waits for flag >= k + 1). Touched by the thread
  // that progresses the op, one at a time.
  std::vector<bool> ended;
  uint32_t released = 0;
  std::vector<size_t> cuts;

  void store(uint32_t value) {
    std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(flag.get())).store(value, std::memory_order_release);
  }
  void release(size_t piece) {
    ended[piece] = true;
    while (released < ended.size() && ended[released]) ++released;
    store(released);
  }
  // Lets the stream past its waits, and its copies into the caller's
  // tensors skip, unless every piece ended.
  void failUnlessEnded() {
    if (released < ended.size()) store(kFlagFailed | uint32_t(ended.size()));
  }

  // Whatever ended the op (or if it never ran), the stream gets past its
  // waits, and the host buffers outlive the copies that use them. The last
  // owner may be any thread (the callback pool's, usually): the events and
  // buffers go here, on the device.
  ~State() {
    if (done.empty()) return;  // refused before it enqueued anything
    OnDevice on(device);
    failUnlessEnded();
    if (!done.back()->query()) done.back()->synchronize();
    staged.clear();
    done.clear();
    host.clear();
    back.clear();
    flag.reset();
  }
};

void refuseCapture(DeviceStream& caller, const std::string& prefix) {
  if (caller.capturing()) {
    throw Error(ErrorKind::InvalidArgument,
                prefix + "the current stream is capturing a CUDA graph, and CUDA graph capture is not supported "
                         "(ringx's order stream waits for a flag the host sets, which a graph cannot replay); "
                         "issue the collective outside the capture");
  }
}

DeviceOrder::DeviceOrder(Device& device) : device_(device) {
  OnDevice on(&device);
  in_ = device.newStream();
  out_ = device.newStream();
}

DeviceOrder::~DeviceOrder() {
  OnDevice on(&device_);
  inFlight_.clear();
  in_.reset();
  out_.reset();
}

void DeviceOrder::orderAfter(const std::vector<DeviceRegion>& regions, DeviceStream& stream) {
  std::erase_if(inFlight_, [](const Touched& t) { return t.done->query(); });
  for (const Touched& t : inFlight_) {
    const bool overlaps = std::any_of(regions.begin(), regions.end(), [&](const DeviceRegion& r) {
      const auto* begin = static_cast<const std::byte*>(r.device);
      return r.bytes && begin < t.end && t.begin < begin + r.bytes;
    });
    if (overlaps) stream.wait(*t.done);
  }
}

void DeviceOrder::touch(const std::vector<DeviceRegion>& regions, const std::shared_ptr<DeviceEvent>& done) {
  for (const DeviceRegion& r : regions) {
    const auto* begin = static_cast<const std::byte*>(r.device);
    if (r.bytes) inFlight_.push_back({begin, begin + r.bytes, done});
  }
}

HostStaging::HostStaging(DeviceOrder& order, DeviceStream& caller, std::vector<DeviceRegion> regions,
                         std::vector<size_t> cuts)
    : state_(std::make_shared<State>()) {
  Device& device = order.device();
  OnDevice on(&device);
  // Before anything is enqueued: waiting for the caller's stream would make
  // the order stream join its capture.
  refuseCapture(caller, "ringx: ");
  State& s = *state_;
  s.device = &device;
  if (cuts.empty()) cuts = {0, regions.empty() ? 0 : regions[0].bytes};
  const size_t pieces = cuts.size() - 1;
  if (pieces > 1 && (regions.size() != 1 || cuts.back() != regions[0].bytes)) {
    throw Error(ErrorKind::InvalidArgument, "ringx: host staging cuts pieces out of exactly one whole region");
  }
  s.cuts = cuts;
  s.ended.assign(pieces, false);
  s.flag = device.allocPinned(sizeof(uint32_t));
  s.store(0);
  for (size_t k = 0; k < pieces; ++k) {
    s.staged.push_back(device.newEvent());
    s.done.push_back(device.newEvent());
  }
  for (const DeviceRegion& r : regions) {
    s.host.push_back(r.in || r.out ? device.allocPinned(r.bytes) : nullptr);
    s.back.push_back(r.out ? device.allocDevice(r.bytes) : nullptr);
  }

  // With one piece, [0, bytes) of every region; otherwise piece k of the one.
  auto part = [&](size_t i, size_t k) {
    return pieces == 1 ? std::pair<size_t, size_t>{0, regions[i].bytes}
                       : std::pair<size_t, size_t>{cuts[k], cuts[k + 1] - cuts[k]};
  };
  auto callerNow = device.newEvent();
  std::lock_guard<std::mutex> lock(order.mu_);
  DeviceStream& in = order.in();
  DeviceStream& out = order.out();
  caller.record(*callerNow);
  in.wait(*callerNow);
  order.orderAfter(regions, in);
  for (size_t k = 0; k < pieces; ++k) {
    for (size_t i = 0; i < regions.size(); ++i) {
      auto [off, len] = part(i, k);
      if (regions[i].in) in.copy(s.host[i].get() + off, static_cast<std::byte*>(regions[i].device) + off, len);
    }
    in.record(*s.staged[k]);
  }
  // A flag set early (an op that failed before it started) must not let the
  // copies back overtake the copies in.
  out.wait(*s.staged.back());
  // The copies back go to device memory of the op's own, piece by piece as
  // the pieces end; the caller's tensors get them in one device-side copy
  // at the end, which the device skips when the flag says the op failed. A
  // failed op so never writes into them, even with some pieces done.
  const auto* flag = reinterpret_cast<const uint32_t*>(s.flag.get());
  for (size_t k = 0; k < pieces; ++k) {
    out.waitFlag(flag, uint32_t(k + 1));
    for (size_t i = 0; i < regions.size(); ++i) {
      auto [off, len] = part(i, k);
      if (regions[i].out) out.copy(s.back[i].get() + off, s.host[i].get() + off, len);
    }
    if (k + 1 == pieces) {
      for (size_t i = 0; i < regions.size(); ++i) {
        if (regions[i].out) out.copyUnlessFailed(regions[i].device, s.back[i].get(), regions[i].bytes, flag);
      }
    }
    out.record(*s.done[k]);
  }
  order.touch(regions, s.done.back());
}

void* HostStaging::host(size_t region) const { return state_->host.at(region).get(); }

const std::shared_ptr<DeviceEvent>& HostStaging::done() const { return state_->done.back(); }

size_t HostStaging::pieces() const { return state_->ended.size(); }

std::pair<size_t, size_t> HostStaging::piece(size_t k) const {
  return {state_->cuts.at(k), state_->cuts.at(k + 1) - state_->cuts.at(k)};
}

Schedule HostStaging::wrap(Schedule schedule) const {
  std::vector<Schedule> one;
  one.push_back(std::move(schedule));
  return wrap(std::move(one));
}

Schedule HostStaging::wrap(std::vector<Schedule> pieces) const {
  if (pieces.size() != state_->ended.size()) {
    throw Error(ErrorKind::InvalidArgument, "ringx: host staging got " + std::to_string(pieces.size()) +
                                                " schedules for " + std::to_string(state_->ended.size()) + " pieces");
  }
  Schedule s(pieces[0].dtype(), pieces[0].op());
  s.setScaleFactor(pieces[0].scaleFactor());
  auto state = state_;
  s.onAbandon([state](const std::string&) { state->failUnlessEnded(); });
  // The polls run on whichever thread progresses the op.
  for (size_t k = 0; k < pieces.size(); ++k) {
    const StepId staged = s.pollDevice(state->device, [state, k] {
      OnDevice on(state->device);
      return state->staged[k]->query();
    });
    std::vector<StepId> last = s.appendAfter(std::move(pieces[k]), staged);
    if (last.empty()) last.push_back(staged);
    s.pollDevice(
        state->device,
        [state, k] {
          if (!state->ended[k]) state->release(k);
          OnDevice on(state->device);
          return state->done[k]->query();
        },
        last);
  }
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
  regions.reserve(2);
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
