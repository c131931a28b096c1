// Schedule::append, which makes a coalesced batch of calls one op.
#include <catch2/catch.hpp>

#include <numeric>

#include "core/algorithms/registry.h"
#include "core/transport/loopback/loopback_transport.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;

TEST_CASE("appended all_reduce, broadcast and send/recv schedules run as one op with each result right") {
  auto size = GENERATE(1, 2, 3, 4);
  CAPTURE(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& t : makeLoopbackWorld(size).transports) comms.push_back(std::make_unique<Communicator>(std::move(t), CommOptions{}));
  onEachRank(size, [&](int r) {
    std::vector<float> sum(1003, float(r + 1));
    std::vector<int32_t> bcast(517, r == 0 ? 0 : -1);
    if (r == 0) std::iota(bcast.begin(), bcast.end(), 100);
    std::vector<int64_t> out(9, r), in(9, -1);

    CollArgs ar{Collective::AllReduce, r, size, 1};
    ar.dtype = DType::F32;
    ar.op = ReduceOp::Sum;
    ar.buf = sum.data();
    ar.count = sum.size();
    ar.segmentBytes = 512;
    CollArgs bc{Collective::Broadcast, r, size, 2};
    bc.dtype = DType::I32;
    bc.buf = bcast.data();
    bc.count = bcast.size();
    bc.root = 0;
    bc.segmentBytes = 256;
    Schedule ring(DType::I64, ReduceOp::Sum);
    if (size > 1) {
      ring.send((r + 1) % size, collTag(3, 0), out.data(), out.size() * sizeof(int64_t));
      ring.recv((r + size - 1) % size, collTag(3, 0), in.data(), in.size() * sizeof(int64_t));
    }

    // The non-reducing schedule first: the merged one takes the all_reduce's dtype and op.
    Schedule merged = buildBroadcastBinomial(bc);
    RANK_REQUIRE(!merged.reduces());
    merged.append(std::move(ring));
    merged.append(buildAllReduceRing(ar));
    RANK_REQUIRE(merged.dtype() == DType::F32);
    RANK_REQUIRE_NO_ERROR(runOp(*comms[r], "coalesced", 1, std::move(merged)));

    for (float v : sum) RANK_REQUIRE(v == float(size * (size + 1) / 2));
    for (size_t i = 0; i < bcast.size(); ++i) RANK_REQUIRE(bcast[i] == int32_t(100 + i));
    if (size > 1) {
      for (int64_t v : in) RANK_REQUIRE(v == (r + size - 1) % size);
    }
  });
}
