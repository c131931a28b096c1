// Which ranks share a host: the exchange through the store and the map
// RINGX_DEBUG=INFO prints.
#include <catch2/catch.hpp>

#include "core/common/topology.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;

TEST_CASE("ranks in one process find themselves on one host") {
  MemoryStore store;
  std::vector<Topology> seen(3);
  onEachRank(3, [&](int r) { seen[r] = Topology::exchange(store, "topo", r, 3); });
  for (const auto& t : seen) {
    REQUIRE(t.hostOf == std::vector<int>{0, 0, 0});
    REQUIRE(t.singleHost());
    REQUIRE(t.describe() == "1 host: host 0 = ranks 0-2");
  }
}

TEST_CASE("hosts are numbered by their lowest rank and listed as runs of ranks") {
  Topology t;
  t.hostOf = {0, 1, 0, 1, 1, 2};
  REQUIRE(t.hosts() == 3);
  REQUIRE(t.ranksOn(1) == std::vector<int>{1, 3, 4});
  REQUIRE_FALSE(t.singleHost());
  REQUIRE(t.describe() == "3 hosts: host 0 = ranks 0, 2; host 1 = ranks 1, 3-4; host 2 = ranks 5");
}
