// The shared-memory all-reduce between threads of one process, each rank
// mapping the others' segments as separate processes would.
#include <catch2/catch.hpp>

#include "core/transport/loopback/loopback_transport.h"
#include "core/transport/shm/shm_area.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

TEST_CASE("shm all_reduce matches the closed form across chunks, ops and repeated calls") {
  auto size = GENERATE(2, 3, 4);
  auto count = GENERATE(size_t{1}, size_t{7}, size_t{1000}, size_t{20011});
  auto op = GENERATE(ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg);
  CAPTURE(size, count, reduceOpName(op));
  MemoryStore store;
  auto world = makeLoopbackWorld(size);
  std::vector<std::unique_ptr<ShmArea>> areas(size);
  onEachRank(size, [&](int r) { areas[r] = ShmArea::create(store, "t", r, size, 4096); });
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& t : world.transports) comms.push_back(std::make_unique<Communicator>(std::move(t), CommOptions{}));
  onEachRank(size, [&](int r) {
    RANK_REQUIRE(areas[r]);
    // Several calls in a row: chunk numbering and slot reuse carry across ops.
    for (int call = 0; call < 3; ++call) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = float(r * 10 + int(i % 7) + call);
      CollArgs a{Collective::AllReduce, r, size, uint64_t(call)};
      a.op = op;
      a.buf = buf.data();
      a.count = count;
      a.shm = areas[r].get();
      RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "all_reduce", call, buildAllReduceShm(a)));
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < size; ++q) {
          float v = float(q * 10 + int(i % 7) + call);
          want = op == ReduceOp::Max ? std::max(want, v) : want + v;
        }
        if (op == ReduceOp::Avg) want /= size;
        if (std::abs(buf[i] - want) > 1e-4f * std::abs(want)) RANK_FAIL("rank " << r << " element " << i << " got " << buf[i] << " want " << want);
      }
    }
  });
  comms.clear();
}

TEST_CASE("shm area refuses a world whose ranks are not all on this host") {
  MemoryStore store;
  store.set("t/host/1", {'e', 'l', 's', 'e'});
  RANK_REQUIRE(ShmArea::create(store, "t", 0, 2, 4096) == nullptr);
}
