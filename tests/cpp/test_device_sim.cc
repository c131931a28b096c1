// The simulated device (core/device/sim_device.h) and the host-staged path
// on it (core/device_paths/host_staging.h): every algorithm against its host-only
// result, and the stream orderings NCCL users rely on. The device runs each
// enqueued item late, so a missing wait shows as a wrong number.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <numeric>

#include "core/device_paths/host_staging.h"
#include "sim_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

// The args of one call of `coll` with `count` elements per block; the
// buffers are set by the caller.
CollArgs argsFor(const Algorithm& alg, const SimWorld& w, int r, uint64_t seq, size_t count, DType dtype) {
  const int size = int(w.comms.size());
  CollArgs a{alg.coll, r, size, seq};
  a.dtype = dtype;
  a.op = dtype == DType::F32 ? ReduceOp::Avg : ReduceOp::Sum;
  a.count = count;
  a.root = 1 % size;
  a.segmentBytes = 1024;
  a.shm = w.areas[r].get();
  a.cma = w.cmas[r].get();
  if (alg.coll == Collective::AllToAll) {
    a.evenSplits = true;
    for (int q = 0; q < size; ++q) {
      a.sendBytes.push_back(count * dtypeSize(dtype));
      a.recvBytes.push_back(count * dtypeSize(dtype));
      a.sendOffsets.push_back(size_t(q) * count * dtypeSize(dtype));
      a.recvOffsets.push_back(size_t(q) * count * dtypeSize(dtype));
    }
  }
  return a;
}

// Bytes of the input and of buf for one call (0: the call has none).
std::pair<size_t, size_t> bufferBytes(const CollArgs& a) {
  const size_t block = a.count * dtypeSize(a.dtype);
  const size_t all = block * size_t(a.size);
  const bool root = a.rank == a.root;
  switch (a.coll) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::Reduce: return {0, block};
    case Collective::AllGather:
    case Collective::AllToAll: return {a.coll == Collective::AllToAll ? all : block, all};
    case Collective::ReduceScatter: return {all, block};
    case Collective::Gather: return {block, root ? all : 0};
    case Collective::Scatter: return {root ? all : 0, block};
    case Collective::Barrier: return {0, 0};
  }
  return {0, 0};
}

}  // namespace

TEST_CASE("sim device: a stream waiting for another's event sees that stream's writes, however late they run") {
  SimDevice dev(SimDeviceOptions{0, 500, 3});
  auto a = dev.newStream();
  auto b = dev.newStream();
  auto ev = dev.newEvent();
  REQUIRE(ev->query());  // never recorded
  for (int round = 0; round < 20; ++round) {
    std::vector<int> src(1000, round), mid(1000, -1), out(1000, -2);
    a->copy(mid.data(), src.data(), sizeof(int) * 1000);
    a->record(*ev);
    b->wait(*ev);
    b->copy(out.data(), mid.data(), sizeof(int) * 1000);
    b->synchronize();
    REQUIRE(ev->query());
    REQUIRE(out == src);
  }
}

TEST_CASE("sim device: a stream waits for a host flag, and reduce and scale run on it") {
  SimDevice dev;
  auto s = dev.newStream();
  auto flag = dev.allocPinned(sizeof(uint32_t));
  auto* word = reinterpret_cast<uint32_t*>(flag.get());
  std::atomic_ref<uint32_t>(*word).store(0);
  std::vector<float> x(64, 2.0f), y(64, 3.0f);
  auto done = dev.newEvent();
  s->waitFlag(word, 1);
  s->reduce(x.data(), y.data(), x.size(), DType::F32, ReduceOp::Sum);
  s->scale(x.data(), x.size(), DType::F32, 0.5);
  s->record(*done);
  std::this_thread::sleep_for(5ms);
  REQUIRE_FALSE(done->query());
  std::atomic_ref<uint32_t>(*word).store(1, std::memory_order_release);
  done->synchronize();
  REQUIRE(x == std::vector<float>(64, 2.5f));
}

namespace {

// Runs every algorithm that applies at `size` ranks on device buffers the
// caller's stream is still filling: host-staged, or device-resident on a
// second stream of each rank's device when `resident`. Each result, and the
// input left as it was, must equal the same call's on host buffers. Returns
// how many algorithms ran.
int checkEveryAlgorithm(int size, DType dtype, bool resident) {
  const size_t count = 777;
  SimWorld w(size);
  std::vector<std::unique_ptr<DeviceStream>> compute;
  for (auto& r : w.ranks) compute.push_back(r->device.newStream());
  auto deviceOf = [&](int r) { return resident ? DeviceQueue{&w.ranks[r]->device, compute[r].get()} : DeviceQueue{}; };
  uint64_t seq = 1;
  int tested = 0;
  for (const Algorithm& alg : algorithms()) {
    CAPTURE(alg.name, collectiveName(alg.coll));
    CollArgs probe = argsFor(alg, w, 0, 0, count, dtype);
    probe.device = deviceOf(0);
    if (!alg.applies(probe)) continue;
    if (dtype == DType::F32 && (alg.coll == Collective::AllToAll || alg.coll == Collective::Barrier)) continue;
    ++tested;
    const uint64_t onDevice = seq++, plain = seq++;
    onEachRank(size, [&](int r) {
      SimRank& me = *w.ranks[r];
      CollArgs a = argsFor(alg, w, r, onDevice, count, dtype);
      a.device = deviceOf(r);
      auto [inBytes, bufBytes] = bufferBytes(a);
      const bool inPlace =
          alg.coll == Collective::AllReduce || alg.coll == Collective::Broadcast || alg.coll == Collective::Reduce;
      const auto in = pattern(r, inBytes, dtype);
      const auto buf0 = pattern(inPlace ? r : r + 50, bufBytes, dtype);

      std::vector<std::byte> hostIn = in, hostBuf = buf0;
      CollArgs h = argsFor(alg, w, r, plain, count, dtype);
      h.input = inBytes ? hostIn.data() : nullptr;
      h.buf = bufBytes ? hostBuf.data() : nullptr;

      auto dIn = inBytes ? deviceCopyOf(me, in) : nullptr;
      auto dBuf = bufBytes ? deviceCopyOf(me, buf0) : nullptr;
      a.input = dIn.get();
      a.buf = dBuf.get();
      HostStaging staging(me.order, *me.caller, resident ? std::vector<DeviceRegion>{} : regionsOf(a));
      if (!resident) pointAtHost(a, staging);
      Schedule s = staging.wrap(alg.build(a));
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], std::string(collectiveName(alg.coll)), onDevice, std::move(s)));
      const auto got = bufBytes ? readAfter(me, *staging.done(), dBuf.get(), bufBytes) : std::vector<std::byte>{};
      const auto gotIn = inBytes ? readAfter(me, *staging.done(), dIn.get(), inBytes) : std::vector<std::byte>{};

      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], std::string(collectiveName(alg.coll)), plain, alg.build(h)));
      RANK_REQUIRE_SAYING(std::string(alg.name), got == hostBuf);
      RANK_REQUIRE_SAYING(std::string(alg.name) + " input", gotIn == in);
    });
  }
  return tested;
}

}  // namespace

TEST_CASE("host-staged: every algorithm on the simulated device gives its host-only result") {
  const int size = GENERATE(2, 3, 4);
  const DType dtype = GENERATE(DType::I64, DType::F32);
  CAPTURE(size, dtypeName(dtype));
  REQUIRE(checkEveryAlgorithm(size, dtype, false) >= 20);
}

TEST_CASE("host-staged: the caller's stream may enqueue reads of the result right after issuing") {
  const int size = 3;
  SimWorld w(size, 1000);
  const size_t n = 4096;
  onEachRank(size, [&](int r) {
    SimRank& me = *w.ranks[r];
    const auto in = pattern(r, n * 8, DType::I64);
    auto d = deviceCopyOf(me, in);
    CollArgs a = int64AllReduce(r, size, 1, d.get(), n);
    HostStaging staging(me.order, *me.caller, regionsOf(a));
    pointAtHost(a, staging);
    auto promise = std::make_shared<std::promise<void>>();
    auto op = std::make_unique<Op>("all_reduce", 1, staging.wrap(buildAllReduceRing(a)));
    op->onDone = [promise](const Error*) { promise->set_value(); };
    w.comms[r]->submit(std::move(op));
    // wait(): the caller's stream waits for the op, the host does not.
    me.caller->wait(*staging.done());
    std::vector<int64_t> out(n, -1);
    me.caller->copy(out.data(), d.get(), n * 8);
    auto read = me.device.newEvent();
    me.caller->record(*read);
    read->synchronize();
    for (size_t i = 0; i < n; ++i) {
      int64_t want = 0;
      for (int q = 0; q < size; ++q) want += q * 1000 + int64_t(i % 97) + 1;
      RANK_REQUIRE(out[i] == want);
    }
    promise->get_future().get();
  });
}

TEST_CASE("host-staged: back-to-back collectives issued from two streams, and one reading the last's result") {
  const int size = 2;
  SimWorld w(size, 500);
  const size_t n = 1000;
  onEachRank(size, [&](int r) {
    SimRank& me = *w.ranks[r];
    auto other = me.device.newStream();
    std::vector<int64_t> ones(n, r + 1);
    auto x = me.device.allocDevice(n * 8);
    auto y = me.device.allocDevice(n * 8);
    me.caller->copy(x.get(), ones.data(), n * 8);
    other->copy(y.get(), ones.data(), n * 8);
    std::vector<std::shared_ptr<DeviceEvent>> done;
    std::vector<std::future<std::optional<Error>>> results;
    // x on the caller's stream twice (the second must read the first's
    // result), y on the other stream in between.
    const std::pair<void*, DeviceStream*> calls[] = {{x.get(), me.caller.get()},
                                                     {y.get(), other.get()},
                                                     {x.get(), me.caller.get()}};
    uint64_t seq = 1;
    for (auto [buf, stream] : calls) {
      CollArgs a{Collective::AllReduce, r, size, seq};
      a.dtype = DType::I64;
      a.count = n;
      a.buf = buf;
      HostStaging staging(me.order, *stream, regionsOf(a));
      pointAtHost(a, staging);
      done.push_back(staging.done());
      results.push_back(std::async(std::launch::async, [&, s = staging.wrap(buildAllReduceRecursiveDoubling(a)),
                                                        seq]() mutable {
        return runOp(*w.comms[r], "all_reduce", seq, std::move(s));
      }));
      ++seq;
      std::this_thread::sleep_for(1ms);
    }
    std::vector<int64_t> gx(n), gy(n);
    me.caller->wait(*done[2]);
    me.caller->copy(gx.data(), x.get(), n * 8);
    other->wait(*done[1]);
    other->copy(gy.data(), y.get(), n * 8);
    me.caller->synchronize();
    other->synchronize();
    for (auto& f : results) RANK_REQUIRE_NO_ERROR(f.get());
    RANK_REQUIRE(gy == std::vector<int64_t>(n, 3));
    RANK_REQUIRE(gx == std::vector<int64_t>(n, 6));
  });
}

// On an H200 a rank hung for good: its thread waited in a synchronous copy
// (torch's .cpu()) for the stream to pass the op just issued, holding the
// driver's lock, while the progress thread, releasing the op before it,
// waited for that lock to destroy an event. The simulated device has that
// lock. Each op's staging (host-staged) or step events (device-resident)
// are owned by the op alone, so the engine releases them, and the second op
// of each round is issued before the first has ended. A deadlock cannot
// fail a test: the watchdog ends the process.
TEST_CASE("a thread blocked on the device for the next op does not stop the release of the last") {
  const bool resident = GENERATE(false, true);
  CAPTURE(resident);
  const int size = 2;
  SimWorld w(size, 300);
  std::vector<std::unique_ptr<DeviceStream>> compute;
  for (auto& rank : w.ranks) compute.push_back(rank->device.newStream());
  const size_t n = 16384;  // 128 KiB: too large to run inline in submit()
  auto body = std::async(std::launch::async, [&] {
    onEachRank(size, [&](int r) {
      SimRank& me = *w.ranks[r];
      const auto in = pattern(r, n * 8, DType::I64);
      for (uint64_t round = 0; round < 10; ++round) {
        auto first = deviceCopyOf(me, in);
        auto second = deviceCopyOf(me, in);
        std::shared_ptr<DeviceEvent> done;
        std::vector<std::future<void>> ended;
        for (void* buf : {first.get(), second.get()}) {
          const uint64_t seq = 2 * round + 1 + (buf == second.get());
          CollArgs a{Collective::AllReduce, r, size, seq};
          a.dtype = DType::I64;
          a.count = n;
          a.buf = buf;
          if (resident) a.device = DeviceQueue{&me.device, compute[r].get()};
          HostStaging staging(me.order, *me.caller,
                              resident ? std::vector<DeviceRegion>{} : regionsOf(a));
          if (!resident) pointAtHost(a, staging);
          done = staging.done();
          auto promise = std::make_shared<std::promise<void>>();
          ended.push_back(promise->get_future());
          auto op = std::make_unique<Op>("all_reduce", seq, staging.wrap(buildAllReduceRing(a)));
          op->onDone = [promise](const Error*) { promise->set_value(); };
          w.comms[r]->submit(std::move(op));
        }
        std::vector<int64_t> out(n, -1);
        me.caller->wait(*done);
        me.caller->copy(out.data(), second.get(), n * 8);
        me.caller->synchronize();
        for (size_t i = 0; i < n; ++i) {
          int64_t want = 0;
          for (int q = 0; q < size; ++q) want += q * 1000 + int64_t(i % 97) + 1;
          RANK_REQUIRE(out[i] == want);
        }
        for (auto& f : ended) f.get();
      }
    });
  });
  if (body.wait_for(60s) == std::future_status::timeout) {
    std::fprintf(stderr, "FAILED: the ranks deadlocked: a thread blocked on the device for one op stopped the "
                         "engine from releasing the op before it\n");
    std::_Exit(1);
  }
  body.get();
}

TEST_CASE("host-staged: a schedule that fails still lets the communicator's stream go on") {
  const int size = 2;
  SimWorld w(size, 200, 300ms);
  const size_t n = 64;
  SimRank& me = *w.ranks[0];
  std::vector<int64_t> v(n, 5);
  auto d = me.device.allocDevice(n * 8);
  me.caller->copy(d.get(), v.data(), n * 8);
  CollArgs a{Collective::AllReduce, 0, size, 1};
  a.dtype = DType::I64;
  a.count = n;
  a.buf = d.get();
  HostStaging staging(me.order, *me.caller, regionsOf(a));
  pointAtHost(a, staging);
  auto err = runOp(*w.comms[0], "all_reduce", 1, staging.wrap(buildAllReduceRing(a)));
  REQUIRE(err);
  REQUIRE(err->kind() == ErrorKind::Timeout);
  auto after = me.device.newEvent();
  me.order.out().record(*after);
  after->synchronize();
  REQUIRE(staging.done()->query());
}

TEST_CASE("device-resident: every network algorithm reduces and copies on the device's stream and gives its host-only result") {
  const int size = GENERATE(2, 3, 4);
  const DType dtype = GENERATE(DType::I64, DType::F32);
  CAPTURE(size, dtypeName(dtype));
  // The network algorithms: ring, recursive doubling and Rabenseifner
  // all_reduce, binomial broadcast, reduce, gather and scatter, direct
  // gather and scatter, ring and Bruck all_gather, ring reduce_scatter,
  // pairwise all_to_all and the barrier; and from 3 ranks the chain broadcast.
  const int chain = size >= 3 ? 1 : 0;
  REQUIRE(checkEveryAlgorithm(size, dtype, true) == (dtype == DType::I64 ? 14 : 12) + chain);
}

TEST_CASE("host-staged in pieces: an all_reduce or broadcast cut into pieces gives the whole buffer's result") {
  const int size = GENERATE(2, 3);
  const auto coll = GENERATE(Collective::AllReduce, Collective::Broadcast);
  CAPTURE(size, collectiveName(coll));
  SimWorld w(size);
  const size_t n = 10000;
  // Uneven pieces, one of a single element.
  const std::vector<size_t> cuts{0, 8 * 1000, 8 * 4000, 8 * 4001, 8 * n};
  for (const char* alg : {"ring", "shm"}) {
    CAPTURE(alg);
    onEachRank(size, [&](int r) {
      SimRank& me = *w.ranks[r];
      const auto in = pattern(r, n * 8, DType::I64);
      auto d = deviceCopyOf(me, in);
      HostStaging staging(me.order, *me.caller, {{d.get(), n * 8, true, true}}, cuts);
      std::vector<Schedule> pieces;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        CollArgs a{coll, r, size, 10 + k};
        a.dtype = DType::I64;
        a.count = (cuts[k + 1] - cuts[k]) / 8;
        a.buf = static_cast<std::byte*>(staging.host(0)) + cuts[k];
        a.root = 1;
        a.segmentBytes = 1024;
        a.shm = std::string(alg) == "shm" ? w.areas[r].get() : nullptr;
        const bool shm = a.shm != nullptr;
        pieces.push_back(coll == Collective::AllReduce ? (shm ? buildAllReduceShm(a) : buildAllReduceRing(a))
                                                       : (shm ? buildBroadcastShm(a) : buildBroadcastBinomial(a)));
      }
      RANK_REQUIRE(staging.pieces() == 4);
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[r], "all_reduce", 10, staging.wrap(std::move(pieces))));
      const auto got = readAfter(me, *staging.done(), d.get(), n * 8);
      std::vector<std::byte> want = coll == Collective::Broadcast ? pattern(1, n * 8, DType::I64)
                                                                  : std::vector<std::byte>(n * 8);
      if (coll == Collective::AllReduce) {
        for (size_t i = 0; i < n; ++i) {
          int64_t sum = 0;
          for (int q = 0; q < size; ++q) sum += q * 1000 + int64_t(i % 97) + 1;
          std::memcpy(want.data() + i * 8, &sum, 8);
        }
      }
      RANK_REQUIRE(got == want);
    });
  }
}

TEST_CASE("a failed op is reported only once its device work has stopped writing into its buffers") {
  // The op's device copy runs up to 50 ms late; a step of the same op fails at
  // once. A caller told of the failure may free or reuse the buffers, so the
  // copy must have landed when onDone runs.
  SimWorld w(1, 50000);
  SimRank& me = *w.ranks[0];
  const size_t n = 1 << 16;
  auto src = me.device.allocDevice(n);
  auto dst = me.device.allocDevice(n);
  std::memset(src.get(), 7, n);
  std::memset(dst.get(), 0, n);
  auto compute = streamOn(me.device);
  Schedule s(DType::U8, ReduceOp::Sum, DeviceQueue{&me.device, compute.get()});
  s.setAlgorithm("test");
  for (size_t off = 0; off < n; off += n / 8) s.copy(dst.get() + off, src.get() + off, n / 8);
  s.poll([]() -> bool { throw Error(ErrorKind::InvalidArgument, "injected failure"); }, nullptr);
  auto copiedWhenTold = std::make_shared<std::promise<bool>>();
  auto op = std::make_unique<Op>("all_reduce", 1, std::move(s));
  const std::byte* out = dst.get();
  op->onDone = [copiedWhenTold, out, n](const Error* e) {
    const bool copied = std::all_of(out, out + n, [](std::byte b) { return b == std::byte{7}; });
    copiedWhenTold->set_value(e != nullptr && copied);
  };
  w.comms[0]->submit(std::move(op));
  auto told = copiedWhenTold->get_future();
  REQUIRE(told.wait_for(5s) == std::future_status::ready);
  CHECK(told.get());
}
