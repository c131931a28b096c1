// The hazards a real GPU would meet at first contact (issue 41), on the
// simulated device, which keeps a CUDA runtime's per-thread current device
// and capture mode, graph capture and lazy kernel loading
// (core/device/sim_device.h). Each case failed before its fix.
#include <catch2/catch.hpp>

#include <future>
#include <thread>

#include "core/device/host_staging.h"
#include "sim_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

// What rank r's all_reduce of `n` int64 gives.
std::vector<int64_t> sumOfPatterns(int size, size_t n) {
  std::vector<int64_t> want(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (int q = 0; q < size; ++q) want[i] += q * 1000 + int64_t(i % 97) + 1;
  }
  return want;
}

// Issues `ops` all_reduces of `n` int64 on rank r, host-staged or
// device-resident, all in flight at once, and checks each result. Only the
// caller's own calls (the buffers, reading the results) run on its device:
// the rank's thread stays on device 0, as an issuing thread may.
void allReduces(SimWorld& w, int r, bool resident, DeviceStream* compute, int ops, size_t n, uint64_t firstSeq) {
  SimRank& me = *w.ranks[r];
  const int size = int(w.comms.size());
  const auto in = pattern(r, n * 8, DType::I64);
  std::vector<std::shared_ptr<std::byte>> bufs;
  std::vector<std::shared_ptr<DeviceEvent>> done;
  std::vector<std::future<std::optional<Error>>> results;
  for (int k = 0; k < ops; ++k) {
    bufs.push_back(deviceCopyOf(me, in));
    const uint64_t seq = firstSeq + uint64_t(k);
    CollArgs a{Collective::AllReduce, r, size, seq};
    a.dtype = DType::I64;
    a.count = n;
    a.buf = bufs.back().get();
    if (resident) a.device = DeviceQueue{&me.device, compute};
    HostStaging staging(me.device, *me.comm, *me.caller, resident ? std::vector<DeviceRegion>{} : regionsOf(a));
    if (!resident) pointAtHost(a, staging);
    done.push_back(staging.done());
    auto promise = std::make_shared<std::promise<std::optional<Error>>>();
    results.push_back(promise->get_future());
    auto op = std::make_unique<Op>("all_reduce", seq, staging.wrap(buildAllReduceRing(a)));
    op->onDone = [promise](const Error* e) { promise->set_value(e ? std::optional<Error>(*e) : std::nullopt); };
    w.comms[r]->submit(std::move(op));
  }
  const auto want = sumOfPatterns(size, n);
  for (int k = 0; k < ops; ++k) {
    RANK_REQUIRE_NO_ERROR(results[size_t(k)].get());
    const auto got = readAfter(me, *done[size_t(k)], bufs[size_t(k)].get(), n * 8);
    RANK_REQUIRE(std::memcmp(got.data(), want.data(), n * 8) == 0);
  }
  OnDevice on(&me.device);
  bufs.clear();
  done.clear();
}

}  // namespace

// Hazard 1: CUDA's current device is per thread and starts at 0; a thread's
// first call makes a context on it. The progress thread, the callback pool
// and an issuing thread that never set a device would each have made one on
// GPU 0 for every rank. Ranks here are on sim:0-3, and each device counts the
// calls made while another was current.
TEST_CASE("device hazards: every call into a rank's device is made on that device, on every thread") {
  const bool resident = GENERATE(false, true);
  CAPTURE(resident);
  const int size = 4;
  SimWorld w(size, 100);
  std::vector<std::unique_ptr<DeviceStream>> compute;
  for (auto& rank : w.ranks) compute.push_back(streamOn(rank->device));
  // 128 KiB: past what submit() runs inline, so the progress thread runs it.
  onEachRank(size, [&](int r) { allReduces(w, r, resident, compute[size_t(r)].get(), 3, 16384, 1); });
  // The last releases run on the callback pool; shutting down waits for them.
  w.comms.clear();
  for (int r = 0; r < size; ++r) {
    const SimDevice& d = w.ranks[size_t(r)]->device;
    INFO("rank " << r << " on " << d.name() << ": " << d.offDeviceCalls() << " of " << d.calls()
                 << " calls off the device, the first: " << d.offDevice());
    CHECK(d.calls() > 0);
    CHECK(d.offDeviceCalls() == 0);
  }
}

// Hazard 2, at issue: enqueueing anything behind a capturing stream would make
// ringx's order stream join the capture (and a graph cannot replay the host's
// part of a collective).
TEST_CASE("device hazards: a collective on a capturing stream is refused before anything joins the capture") {
  const bool global = GENERATE(false, true);
  CAPTURE(global);
  SimRank me(0);
  std::vector<int64_t> v(64, 1);
  auto d = deviceCopyOf(me, std::vector<std::byte>(64 * 8));
  me.caller->synchronize();
  me.device.beginCapture(*me.caller, global);
  CollArgs a{Collective::AllReduce, 0, 2, 1};
  a.dtype = DType::I64;
  a.count = 64;
  a.buf = d.get();
  try {
    HostStaging staging(me.device, *me.comm, *me.caller, regionsOf(a));
    FAIL("HostStaging accepted a capturing stream");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::InvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("CUDA graph capture is not supported"));
  }
  me.device.endCapture(*me.caller);
  CHECK(me.device.capturedCalls() == 0);
}

// Hazard 2, off the caller's thread: while any thread captures in CUDA's
// default (global) mode, an event query from a thread in global mode fails.
// ringx's threads query events all the time; they switch to thread-local
// mode for it.
TEST_CASE("device hazards: another thread's graph capture does not fail ringx's event queries") {
  const int size = 2;
  SimWorld w(size, 100);
  auto side = streamOn(w.ranks[0]->device);
  w.ranks[0]->device.beginCapture(*side, true);
  onEachRank(size, [&](int r) { allReduces(w, r, false, nullptr, 2, 16384, 1); });
  w.ranks[0]->device.endCapture(*side);
}

// Hazard 3: CUDA loads a kernel lazily, at its first launch. A device-resident
// op launches its reduce on the thread that progresses it, while the order
// stream may wait on a flag only that thread sets; the load must have been
// done on the issuing thread, before the op runs.
TEST_CASE("device hazards: the kernels are loaded on the issuing thread before a device-resident op runs") {
  const int size = 2;
  SimWorld w(size, 100);
  std::vector<std::unique_ptr<DeviceStream>> compute;
  for (auto& rank : w.ranks) compute.push_back(streamOn(rank->device));
  std::vector<std::thread::id> issuer(size);
  onEachRank(size, [&](int r) {
    issuer[size_t(r)] = std::this_thread::get_id();
    allReduces(w, r, true, compute[size_t(r)].get(), 1, 16384, 1);
  });
  for (int r = 0; r < size; ++r) {
    const SimDevice& d = w.ranks[size_t(r)]->device;
    CAPTURE(r);
    REQUIRE(d.kernelsLoadedBy());
    CHECK_FALSE(d.kernelsLoadedLazily());
    CHECK(*d.kernelsLoadedBy() == issuer[size_t(r)]);
  }
}
