#include <catch2/catch.hpp>

#include <set>

#include "core/patterns/hierarchy.h"
#include "core/patterns/ring.h"
#include "core/patterns/tree.h"

using namespace ringx;

TEST_CASE("ring chunks tile the buffer exactly with lengths differing by at most one") {
  for (size_t count : {0, 1, 2, 7, 8, 1000, 1003}) {
    for (int parts = 1; parts <= 9; ++parts) {
      size_t covered = 0, minLen = ~size_t{0}, maxLen = 0;
      for (int c = 0; c < parts; ++c) {
        REQUIRE(ring::chunkStart(count, parts, c) == covered);
        size_t len = ring::chunkLen(count, parts, c);
        covered += len;
        minLen = std::min(minLen, len);
        maxLen = std::max(maxLen, len);
      }
      REQUIRE(covered == count);
      REQUIRE(maxLen - minLen <= 1);
    }
  }
}

TEST_CASE("ring segments cover a chunk and only the last is short") {
  for (size_t len : {0, 1, 5, 64, 65, 1000}) {
    for (size_t seg : {1, 3, 64}) {
      size_t n = ring::numSegments(len, seg), total = 0;
      for (size_t g = 0; g < n; ++g) {
        size_t l = ring::segmentLen(len, seg, g);
        REQUIRE(l >= 1);
        if (g + 1 < n) REQUIRE(l == seg);
        total += l;
      }
      REQUIRE(total == len);
    }
  }
}

TEST_CASE("ring neighbours are inverse of each other") {
  for (int n = 1; n <= 8; ++n) {
    for (int r = 0; r < n; ++r) {
      REQUIRE(ring::left(ring::right(r, n), n) == r);
    }
  }
}

TEST_CASE("binomial tree reaches every rank exactly once from any root within ceil(log2 n) levels") {
  for (int n = 1; n <= 17; ++n) {
    int levels = 0;
    while ((1 << levels) < n) ++levels;
    for (int root = 0; root < n; ++root) {
      REQUIRE(tree::binomialParent(root, root, n) == -1);
      std::multiset<int> reached;
      for (int r = 0; r < n; ++r) {
        for (int c : tree::binomialChildren(r, root, n)) {
          reached.insert(c);
          REQUIRE(tree::binomialParent(c, root, n) == r);
        }
        int depth = 0;
        for (int v = r; v != root; v = tree::binomialParent(v, root, n)) ++depth;
        REQUIRE(depth <= levels);
      }
      REQUIRE(reached.size() == size_t(n - 1));
      REQUIRE(std::set<int>(reached.begin(), reached.end()).size() == size_t(n - 1));
      REQUIRE(reached.count(root) == 0);
    }
  }
}

TEST_CASE("the busiest link of a binomial broadcast counts the tree edges crossing it in one direction") {
  // Hosts of two consecutive ranks: from root 0 one edge leaves host 0
  // (0 -> 2); from root 1 two do (1 -> 3, 1 -> 2) and one comes back (3 -> 0).
  REQUIRE(hierarchy::busiestLinkEdges({0, 0, 1, 1}, 0) == 1);
  REQUIRE(hierarchy::busiestLinkEdges({0, 0, 1, 1}, 1) == 2);
  REQUIRE(hierarchy::busiestLinkEdges({0, 1, 0, 1}, 0) == 2);
  REQUIRE(hierarchy::busiestLinkEdges({0, 0, 0, 0}, 2) == 0);
  // Among one rank per host the root's host sends ceil(log2 H) times.
  REQUIRE(hierarchy::busiestLinkEdgesAcrossHosts(2, 1) == 1);
  REQUIRE(hierarchy::busiestLinkEdgesAcrossHosts(5, 0) == 3);
  REQUIRE(hierarchy::busiestLinkEdgesAcrossHosts(8, 3) == 3);
}

TEST_CASE("the busiest link of a chain broadcast is crossed once each way on hosts of consecutive ranks") {
  // From root 1 on 2 x 2: 1 -> 2 leaves host 0, 3 -> 0 comes back into it.
  REQUIRE(hierarchy::chainBusiestLinkEdges({0, 0, 1, 1}, 0) == 1);
  REQUIRE(hierarchy::chainBusiestLinkEdges({0, 0, 1, 1}, 1) == 1);
  REQUIRE(hierarchy::chainBusiestLinkEdges({0, 1, 2, 3, 4, 5, 6, 7}, 5) == 1);
  // Interleaved, every edge crosses: host 0 sends 0 -> 1 and 2 -> 3.
  REQUIRE(hierarchy::chainBusiestLinkEdges({0, 1, 0, 1}, 0) == 2);
  REQUIRE(hierarchy::chainBusiestLinkEdges({0, 0, 0}, 1) == 0);
}
