// A world of ranks on simulated devices (core/device/sim_device.h), for the
// device tests. Rank r runs on sim:r. The helpers' own calls into a device are
// made on it (OnDevice), as a torch user's thread would with its device set,
// so that what the simulated device records off its device is ringx's.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "core/device_paths/host_staging.h"
#include "core/device/sim_device.h"
#include "core/transport/loopback/loopback_transport.h"
#include "core/transport/shm/cma.h"
#include "core/transport/shm/shm_area.h"
#include "test_support.h"

namespace ringx::test {

using namespace std::chrono_literals;

inline std::unique_ptr<DeviceStream> streamOn(SimDevice& device) {
  OnDevice on(&device);
  return device.newStream();
}

// One rank: its device, the group's streams on it and the caller's stream.
struct SimRank {
  explicit SimRank(int r, int maxDelayUs = 200)
      : device(SimDeviceOptions{r, maxDelayUs, uint64_t(r) + 7}), order(device), caller(streamOn(device)) {}
  SimDevice device;
  DeviceOrder order;
  std::unique_ptr<DeviceStream> caller;
};

struct SimWorld {
  // rendezvousBytes: as makeLoopbackWorld's.
  explicit SimWorld(int size, int maxDelayUs = 200, std::chrono::milliseconds timeout = 20s,
                    size_t rendezvousBytes = SIZE_MAX)
      : world(makeLoopbackWorld(size, rendezvousBytes)), areas(size), cmas(size) {
    onEachRank(size, [&](int r) {
      areas[r] = ShmArea::create(store, "t", r, size, 4096);
      cmas[r] = Cma::create(store, "t", r, size, CmaMode::On);
    });
    CommOptions o;
    o.timeout = timeout;
    for (int r = 0; r < size; ++r) {
      comms.push_back(std::make_unique<Communicator>(std::move(world.transports[r]), o));
      ranks.push_back(std::make_unique<SimRank>(r, maxDelayUs));
    }
  }
  ~SimWorld() { comms.clear(); }

  LoopbackWorld world;
  MemoryStore store;
  std::vector<std::unique_ptr<ShmArea>> areas;
  std::vector<std::unique_ptr<Cma>> cmas;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<SimRank>> ranks;
};

// A device buffer the caller's stream fills from `host` (enqueued, so still
// pending when the collective is issued).
inline std::shared_ptr<std::byte> deviceCopyOf(SimRank& r, const std::vector<std::byte>& host) {
  OnDevice on(&r.device);
  auto d = r.device.allocDevice(host.size());
  r.caller->copy(d.get(), host.data(), host.size());
  return d;
}

// The device tests' usual op: a sum of `n` int64 in place at `buf`.
inline CollArgs int64AllReduce(int rank, int size, uint64_t seq, void* buf, size_t n) {
  CollArgs a{Collective::AllReduce, rank, size, seq};
  a.dtype = DType::I64;
  a.count = n;
  a.buf = buf;
  return a;
}

// What the caller sees once its stream has waited for `done`: the stream
// copies the buffer out, then the host waits for the stream.
inline std::vector<std::byte> readAfter(SimRank& r, DeviceEvent& done, const void* d, size_t bytes) {
  OnDevice on(&r.device);
  std::vector<std::byte> out(bytes);
  r.caller->wait(done);
  r.caller->copy(out.data(), d, bytes);
  r.caller->synchronize();
  return out;
}

inline std::vector<std::byte> pattern(int rank, size_t bytes, DType dtype) {
  std::vector<std::byte> b(bytes);
  const size_t n = bytes / dtypeSize(dtype);
  for (size_t i = 0; i < n; ++i) {
    const int v = rank * 1000 + int(i % 97) + 1;
    if (dtype == DType::I64) {
      int64_t x = v;
      std::memcpy(b.data() + i * 8, &x, 8);
    } else {
      float x = float(v);
      std::memcpy(b.data() + i * 4, &x, 4);
    }
  }
  return b;
}

}  // namespace ringx::test
