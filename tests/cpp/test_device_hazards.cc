// The hazards a real GPU would meet at first contact (issue 41), on the
// simulated device, which keeps a CUDA runtime's per-thread current device
// and capture mode, graph capture and lazy kernel loading
// (core/device/sim_device.h). Each case failed before its fix.
#include <catch2/catch.hpp>

#include <future>
#include <thread>

#include "core/device_paths/host_staging.h"
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
    HostStaging staging(me.order, *me.caller, resident ? std::vector<DeviceRegion>{} : regionsOf(a));
    if (!resident) pointAtHost(a, staging);
    done.push_back(staging.done());
    results.push_back(submitOp(*w.comms[r], "all_reduce", seq, staging.wrap(buildAllReduceRing(a))));
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
  const std::vector<std::byte> zeros(64 * 8);
  auto d = deviceCopyOf(me, zeros);
  me.caller->synchronize();
  me.device.beginCapture(*me.caller, global);
  CollArgs a{Collective::AllReduce, 0, 2, 1};
  a.dtype = DType::I64;
  a.count = 64;
  a.buf = d.get();
  try {
    HostStaging staging(me.order, *me.caller, regionsOf(a));
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

namespace {

// A one-step schedule of its own op on rank r's device: a send of `src` to
// `peer` or a receive into `dst` from it, host-staged, as ProcessGroupRingx
// issues send and recv on CUDA tensors. Returns when the op ends.
std::future<std::optional<Error>> p2p(SimWorld& w, int r, uint64_t seq, bool send, int peer, void* buf, size_t bytes,
                                      std::shared_ptr<DeviceEvent>& done) {
  SimRank& me = *w.ranks[size_t(r)];
  HostStaging staging(me.order, *me.caller, {{buf, bytes, send, !send}});
  Schedule s(DType::U8, ReduceOp::Sum);
  if (send) {
    s.send(peer, p2pTag(7), staging.host(0), bytes);
  } else {
    s.recv(peer, p2pTag(7), staging.host(0), bytes);
  }
  done = staging.done();
  auto promise = std::make_shared<std::promise<std::optional<Error>>>();
  auto ended = promise->get_future();
  auto op = std::make_unique<Op>(send ? "send" : "recv", seq, staging.wrap(std::move(s)));
  op->bytes = bytes;
  op->onDone = [promise](const Error* e) { promise->set_value(e ? std::optional<Error>(*e) : std::nullopt); };
  w.comms[size_t(r)]->submit(std::move(op));
  return ended;
}

}  // namespace

// Hazard 4: a ring exchange, each rank sending to the next and receiving from
// the one before, issued as send then recv. Large sends complete only once
// the peer's receive took them (rendezvous, as UCX's for large messages).
// With one stream per group the receive's copies waited behind the send's
// host flag, so no rank's receive was ever posted: every rank timed out.
TEST_CASE("device hazards: a 64 MiB ring exchange, send then recv on every rank, completes") {
  const int size = GENERATE(2, 3, 4);
  CAPTURE(size);
  // Under ThreadSanitizer every byte copied costs its shadow too: 64 MiB at
  // worlds 2-4 took 122 s there, past ctest's limit. 8 MiB still needs the
  // rendezvous (1 MiB and more).
#if defined(__SANITIZE_THREAD__)
  const size_t bytes = size_t(8) << 20;
#else
  const size_t bytes = size_t(64) << 20;
#endif
  SimWorld w(size, 100, 60s, size_t(1) << 20);
  onEachRank(size, [&](int r) {
    SimRank& me = *w.ranks[size_t(r)];
    const auto mine = pattern(r, bytes, DType::I64);
    auto src = deviceCopyOf(me, mine);
    std::shared_ptr<std::byte> dst;
    {
      OnDevice on(&me.device);
      dst = me.device.allocDevice(bytes);
    }
    std::shared_ptr<DeviceEvent> sent, received;
    auto sendEnded = p2p(w, r, 1, true, (r + 1) % size, src.get(), bytes, sent);
    auto recvEnded = p2p(w, r, 2, false, (r + size - 1) % size, dst.get(), bytes, received);
    RANK_REQUIRE_NO_ERROR(sendEnded.get());
    RANK_REQUIRE_NO_ERROR(recvEnded.get());
    const auto got = readAfter(me, *received, dst.get(), bytes);
    RANK_REQUIRE(got == pattern((r + size - 1) % size, bytes, DType::I64));
    OnDevice on(&me.device);
    src.reset();
    dst.reset();
  });
}

// Hazard 7: DDP issues a bucket's all_reduce as soon as its gradients are
// ready, and the next one before the last has ended. Both ranks issue two
// all_reduces on other memory, in the same order; rank 1's first one waits
// (a gate in its schedule, as a peer slow to get there) until both ranks'
// second schedule has run, or 5 s. With one stream per group the second op
// was staged behind the first's host flag, so its schedule waited for the
// first: the collectives ran one after the other. (The ops still end in
// issue order: their copies back follow each other on the group's stream,
// as NCCL's kernels do.)
TEST_CASE("device hazards: a collective on other memory runs while an earlier one waits for a peer") {
  const bool resident = GENERATE(false, true);
  CAPTURE(resident);
  const int size = 2;
  const size_t n = 16384;
  SimWorld w(size, 100);
  std::vector<std::unique_ptr<DeviceStream>> compute;
  for (auto& rank : w.ranks) compute.push_back(streamOn(rank->device));
  std::atomic<bool> gateOpen{false};
  std::promise<void> rank0Waited;
  auto rank0Done = rank0Waited.get_future();
  std::atomic<bool> secondRan[size] = {false, false};
  bool secondRanFirst[size] = {false, false};
  onEachRank(size, [&](int r) {
    SimRank& me = *w.ranks[size_t(r)];
    const auto in = pattern(r, n * 8, DType::I64);
    auto first = deviceCopyOf(me, in);
    auto second = deviceCopyOf(me, in);
    std::vector<std::shared_ptr<DeviceEvent>> done;
    std::vector<std::future<std::optional<Error>>> ended;
    for (void* buf : {first.get(), second.get()}) {
      const uint64_t seq = done.size() + 1;
      CollArgs a{Collective::AllReduce, r, size, seq};
      a.dtype = DType::I64;
      a.count = n;
      a.buf = buf;
      if (resident) a.device = DeviceQueue{&me.device, compute[size_t(r)].get()};
      std::vector<DeviceRegion> regions = regionsOf(a);
      if (resident) {
        for (DeviceRegion& region : regions) region.in = region.out = false;
      }
      HostStaging staging(me.order, *me.caller, regions);
      if (!resident) pointAtHost(a, staging);
      done.push_back(staging.done());
      Schedule s(DType::I64, ReduceOp::Sum);
      const StepId gate = r == 1 && seq == 1 ? s.poll([&gateOpen] { return gateOpen.load(); }, nullptr) : kNoStep;
      std::vector<StepId> last = s.appendAfter(buildAllReduceRing(a), gate);
      if (seq == 2) {
        s.poll(
            [&secondRan, r] {
              secondRan[r] = true;
              return true;
            },
            nullptr, {s.join(last)});
      }
      ended.push_back(submitOp(*w.comms[size_t(r)], "all_reduce", seq, staging.wrap(std::move(s))));
    }
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!secondRan[r] && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    secondRanFirst[r] = secondRan[r];
    if (r == 0) {
      rank0Waited.set_value();
    } else {
      rank0Done.wait();
      gateOpen = true;
    }
    RANK_REQUIRE_NO_ERROR(ended[0].get());
    RANK_REQUIRE_NO_ERROR(ended[1].get());
    const auto want = sumOfPatterns(size, n);
    for (size_t k = 0; k < 2; ++k) {
      const auto got = readAfter(me, *done[k], (k ? second : first).get(), n * 8);
      RANK_REQUIRE(std::memcmp(got.data(), want.data(), n * 8) == 0);
    }
    OnDevice on(&me.device);
    first.reset();
    second.reset();
  });
  CHECK(secondRanFirst[0]);
  CHECK(secondRanFirst[1]);
}

// Hazard 5: a host-staged op copied its host buffers back into the caller's
// tensors whether its schedule had ended or failed, so a failure left partial
// results there (and the caller, whose wait() does not block, might never
// hear of it). Here the schedule writes into its host buffer, then fails;
// in pieces, the first piece ends and the second fails.
TEST_CASE("device hazards: a failed host-staged op leaves the caller's tensor as it was") {
  const bool inPieces = GENERATE(false, true);
  CAPTURE(inPieces);
  SimWorld w(1, 100);
  SimRank& me = *w.ranks[0];
  const size_t n = 4096, bytes = n * 8;
  const auto in = pattern(0, bytes, DType::I64);
  const std::vector<std::byte> partial(bytes, std::byte{0x5a});
  auto d = deviceCopyOf(me, in);
  const std::vector<size_t> cuts = inPieces ? std::vector<size_t>{0, bytes / 2, bytes} : std::vector<size_t>{};
  HostStaging staging(me.order, *me.caller, {{d.get(), bytes, true, true}}, cuts);
  std::vector<Schedule> pieces;
  for (size_t k = 0; k < staging.pieces(); ++k) {
    auto [off, len] = staging.piece(k);
    Schedule s(DType::I64, ReduceOp::Sum);
    const StepId wrote = s.copy(static_cast<std::byte*>(staging.host(0)) + off, partial.data() + off, len);
    if (k + 1 == staging.pieces()) {
      s.poll([]() -> bool { throw Error(ErrorKind::InvalidArgument, "injected failure"); }, nullptr, {wrote});
    }
    pieces.push_back(std::move(s));
  }
  auto err = runOp(*w.comms[0], "all_reduce", 1, staging.wrap(std::move(pieces)));
  REQUIRE(err);
  CHECK(readAfter(me, *staging.done(), d.get(), bytes) == in);
  OnDevice on(&me.device);
  d.reset();
}

// Hazard 6: Work.wait(timeout) on a device op returned at once, whatever the
// device's progress, so a timeout never fired. It blocks the host until the
// op's device end, as NCCL's does, or raises once the timeout passes. Rank 1
// issues its half of the all_reduce only after rank 0's timed wait gave up.
TEST_CASE("device hazards: a timed wait on a device op blocks the host until the op ends or the timeout passes") {
  const int size = 2;
  const size_t n = 4096;
  SimWorld w(size, 100);
  std::promise<void> rank0GaveUp;
  auto gaveUp = rank0GaveUp.get_future();
  onEachRank(size, [&](int r) {
    SimRank& me = *w.ranks[size_t(r)];
    if (r == 1) gaveUp.wait();
    const auto in = pattern(r, n * 8, DType::I64);
    auto buf = deviceCopyOf(me, in);
    CollArgs a = int64AllReduce(r, size, 1, buf.get(), n);
    HostStaging staging(me.order, *me.caller, regionsOf(a));
    pointAtHost(a, staging);
    std::shared_ptr<DeviceEvent> done = staging.done();
    auto ended = submitOp(*w.comms[size_t(r)], "all_reduce", 1, staging.wrap(buildAllReduceRing(a)));
    if (r == 0) {
      const auto before = std::chrono::steady_clock::now();
      const bool ended = done->waitUntil(before + 150ms);
      const auto blocked = std::chrono::steady_clock::now() - before;
      RANK_REQUIRE(!ended);
      RANK_REQUIRE(blocked >= 150ms);
      rank0GaveUp.set_value();
    }
    RANK_REQUIRE(done->waitUntil(std::chrono::steady_clock::now() + 10s));
    RANK_REQUIRE_NO_ERROR(ended.get());
    const auto got = readAfter(me, *done, buf.get(), n * 8);
    const auto want = sumOfPatterns(size, n);
    RANK_REQUIRE(std::memcmp(got.data(), want.data(), n * 8) == 0);
    OnDevice on(&me.device);
    buf.reset();
  });
}
