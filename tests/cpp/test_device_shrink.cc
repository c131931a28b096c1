// A shrink with host-staged ops on device buffers in flight on the parent
// (dist.shrink_group on CUDA tensors, issue 43), on the simulated device: the
// parent's pending op fails without writing the caller's tensor or leaving
// the device's streams waiting on its flag, the survivors agree over the
// transport the parent hands over, and the child group's first op on the
// same buffers and device gives the survivors' sum.
#include <catch2/catch.hpp>

#include <future>

#include "core/engine/shrink_exchange.h"
#include "sim_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

std::vector<int64_t> survivorsSum(size_t n) {
  std::vector<int64_t> want(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (int q = 0; q < 2; ++q) want[i] += q * 1000 + int64_t(i % 97) + 1;
  }
  return want;
}

// Issues a host-staged int64 all_reduce of `n` at `buf` on `comm`; returns
// its device end, and its error or none once it ends.
std::pair<std::shared_ptr<DeviceEvent>, std::future<std::optional<Error>>> stagedAllReduce(
    SimRank& me, DeviceOrder& order, Communicator& comm, int rank, int size, uint64_t seq, void* buf, size_t n) {
  CollArgs a = int64AllReduce(rank, size, seq, buf, n);
  HostStaging staging(order, *me.caller, regionsOf(a));
  pointAtHost(a, staging);
  return {staging.done(), submitOp(comm, "all_reduce", seq, staging.wrap(buildAllReduceRing(a)))};
}

}  // namespace

// Rank 2 of 3 either dies while ranks 0 and 1 wait for it in an all_reduce
// (their op fails on its own: SHRINK_DEFAULT), or lives on without joining
// (SHRINK_ABORT fails the op). Either way the survivors' tensors keep their
// inputs, and the child group reduces them.
TEST_CASE("device shrink: survivors of a pending host-staged op shrink and reduce their untouched tensors") {
  const bool died = GENERATE(true, false);
  CAPTURE(died);
  const size_t n = 8192;
  SimWorld parent(3, 100);
  if (died) parent.world.kill(2);
  LoopbackWorld childWorld = makeLoopbackWorld(2);
  onEachRank(2, [&](int r) {
    SimRank& me = *parent.ranks[size_t(r)];
    const auto in = pattern(r, n * 8, DType::I64);
    auto buf = deviceCopyOf(me, in);
    auto [parentDone, parentEnded] = stagedAllReduce(me, me.order, *parent.comms[size_t(r)], r, 3, 1, buf.get(), n);
    std::unique_ptr<Transport> handedOver;
    if (died) {
      const std::optional<Error> e = parentEnded.get();
      RANK_REQUIRE(e.has_value());
      RANK_REQUIRE_SAYING(e->what(), std::string(e->what()).find("rank 2") != std::string::npos);
      handedOver = parent.comms[size_t(r)]->release("shrunk by shrink_group");
    } else {
      RANK_REQUIRE(parentEnded.wait_for(100ms) == std::future_status::timeout);
      handedOver = parent.comms[size_t(r)]->release("shrunk by shrink_group (SHRINK_ABORT)");
      const std::optional<Error> e = parentEnded.get();
      RANK_REQUIRE(e.has_value());
      RANK_REQUIRE_SAYING(e->what(), std::string(e->what()).find("SHRINK_ABORT") != std::string::npos);
    }
    RANK_REQUIRE(handedOver);
    RANK_REQUIRE(parentDone->waitUntil(std::chrono::steady_clock::now() + 10s));
    const auto kept = readAfter(me, *parentDone, buf.get(), n * 8);
    RANK_REQUIRE(kept == in);

    const std::vector<uint8_t> excluded{2};
    exchangeAmong(*handedOver, {1 - r}, {2}, kShrinkTagBase, excluded, 8, std::chrono::steady_clock::now() + 10s,
                  [&](int, const std::vector<uint8_t>& theirs) { RANK_REQUIRE(theirs == excluded); });

    CommOptions o;
    o.timeout = 20s;
    Communicator child(std::move(childWorld.transports[size_t(r)]), o);
    DeviceOrder childOrder(me.device);
    auto [childDone, childEnded] = stagedAllReduce(me, childOrder, child, r, 2, 1, buf.get(), n);
    RANK_REQUIRE_NO_ERROR(childEnded.get());
    const auto got = readAfter(me, *childDone, buf.get(), n * 8);
    const auto want = survivorsSum(n);
    RANK_REQUIRE(std::memcmp(got.data(), want.data(), n * 8) == 0);
    OnDevice on(&me.device);
    buf.reset();
  });
}
