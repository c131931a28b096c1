// Which ranks share a host: the exchange through the store and the map
// RINGX_DEBUG=INFO prints.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <memory>
#include <utility>

#include "core/common/shm_segment.h"
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
    REQUIRE(t.sameNamespacesPerHost);
    REQUIRE(t.subset({2, 0}).sameNamespacesPerHost);
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

namespace {

std::string bootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string line;
  std::getline(f, line);
  return line;
}

// What a rank in another pid namespace of this boot would publish: a probe
// segment's name and the token it says is in it.
std::vector<uint8_t> candidate(const std::string& boot, const std::string& probe, const std::string& token) {
  return bytesOf(boot + "\npid:[1]\n0:0\n0\n" + probe + "\n" + token);
}

const std::string kToken(32, '7');

std::unique_ptr<ShmSegment> probeHolding(const std::string& token) {
  auto probe = ShmSegment::create(32, "test probe");
  std::memcpy(probe->data(), token.data(), 32);
  return probe;
}

// Rank 0 of two, rank 1 having published `peer` and the row `peerRow`: the
// topology rank 0 finds, and the row it publishes.
std::pair<Topology, std::string> exchangeWith(const std::vector<uint8_t>& peer, const std::string& peerRow) {
  MemoryStore store;
  store.set("topo/1", peer);
  store.set("topo/shares/1", bytesOf(peerRow));
  const Topology t = Topology::exchange(store, "topo", 0, 2);
  return {t, stringOf(store.get("topo/shares/0"))};
}

}  // namespace

TEST_CASE("a rank of this boot in another pid namespace whose probe segment this rank can read shares its host") {
  const auto probe = probeHolding(kToken);
  const auto [t, row] = exchangeWith(candidate(bootId(), probe->name(), kToken), "11");
  REQUIRE(row == "11");
  REQUIRE(t.hostOf == std::vector<int>{0, 0});
  // Shared memory, but not each other's processes: UCX's own shared-memory
  // transports cannot reach the peer.
  REQUIRE_FALSE(t.sameNamespacesPerHost);
}

TEST_CASE("a rank whose probe segment holds another token (another /dev/shm with that name) is another host") {
  const auto probe = probeHolding(std::string(32, '8'));
  const auto [t, row] = exchangeWith(candidate(bootId(), probe->name(), kToken), "01");
  REQUIRE(row == "10");
  REQUIRE(t.hostOf == std::vector<int>{0, 1});
}

TEST_CASE("a rank whose probe segment cannot be opened is another host") {
  const auto [t, row] = exchangeWith(candidate(bootId(), "/ringx-test-no-such-probe", kToken), "01");
  REQUIRE(row == "10");
  REQUIRE(t.hostOf == std::vector<int>{0, 1});
}

TEST_CASE("a rank of another boot is another host even where a segment of its probe's name holds its token") {
  MemoryStore store;
  const auto probe = probeHolding(kToken);
  store.set("topo/1", candidate("another-boot", probe->name(), kToken));
  REQUIRE(Topology::exchange(store, "topo", 0, 2).hostOf == std::vector<int>{0, 1});
}

TEST_CASE("ranks that share /dev/shm with a third but not with each other are three hosts") {
  // Rows 110, 111, 011: no two ranks have the same row, so no two share a host
  // (an area over ranks 0-2 would need 0 and 2 to open each other's segments).
  MemoryStore store;
  const auto probe = probeHolding(kToken);
  store.set("topo/1", candidate(bootId(), probe->name(), kToken));
  store.set("topo/2", candidate(bootId(), "/ringx-test-no-such-probe", kToken));
  store.set("topo/shares/1", bytesOf("111"));
  store.set("topo/shares/2", bytesOf("011"));
  REQUIRE(Topology::exchange(store, "topo", 0, 3).hostOf == std::vector<int>{0, 1, 2});
}

TEST_CASE("the host map says for each host how its ranks reach each other") {
  Topology t;
  t.hostOf = {0, 0, 1, 1, 2};
  REQUIRE(t.describe(hostPaths(t, false, false, true)) ==
          "3 hosts: host 0 = ranks 0-1 (shared memory, two-copy); host 1 = ranks 2-3 (shared memory, two-copy); "
          "host 2 = ranks 4 (network)");
  REQUIRE(t.describe(hostPaths(t, false, false, false)) ==
          "3 hosts: host 0 = ranks 0-1 (network); host 1 = ranks 2-3 (network); host 2 = ranks 4 (network)");
  Topology one;
  one.hostOf = {0, 0};
  REQUIRE(one.describe(hostPaths(one, true, true, false)) == "1 host: host 0 = ranks 0-1 (shared memory, single copy)");
  REQUIRE(one.describe(hostPaths(one, true, false, false)) == "1 host: host 0 = ranks 0-1 (shared memory, two-copy)");
}
