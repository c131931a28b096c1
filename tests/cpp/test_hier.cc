// The hierarchical all-reduce over a group laid out on simulated hosts:
// ranks are threads, each "host" a shared-memory area of its own ranks, the
// inter-host part over the in-process transport.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "core/algorithms/hier_steps.h"
#include "core/algorithms/host_layout.h"
#include "core/algorithms/identity.h"
#include "core/patterns/hierarchy.h"
#include "core/select/select.h"
#include "core/transport/loopback/loopback_transport.h"
#include "core/transport/shm/shm_area.h"
#include "sweep.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

// `hostOf[r]` is rank r's host; ranks need not be contiguous per host.
struct HostsWorld {
  explicit HostsWorld(std::vector<int> hostOf, std::chrono::milliseconds timeout = 20s)
      : size(int(hostOf.size())), world(makeLoopbackWorld(size)), areas(size_t(size)), layouts(size_t(size)) {
    topology.hostOf = std::move(hostOf);
    onEachRank(size, [&](int r) {
      HostLayout h = HostLayout::of(topology, r);
      if (!h.hosts) return;
      h.chunkBytes = 4096;
      if (h.localSize() > 1) {
        areas[size_t(r)] = ShmArea::create(store, "host" + std::to_string(h.host), h.localRank, h.localSize(), 4096);
        areas[size_t(r)]->setGroupRanks(h.local);
        h.shm = areas[size_t(r)].get();
      }
      layouts[size_t(r)] = std::move(h);
    });
    CommOptions opts;
    opts.timeout = timeout;
    for (auto& t : world.transports) comms.push_back(std::make_unique<Communicator>(std::move(t), opts));
  }
  // The communicators go first: their progress threads read the areas.
  ~HostsWorld() { comms.clear(); }

  CollArgs args(int r, uint64_t seq) const {
    CollArgs a{Collective::AllReduce, r, size, seq};
    a.crossHost = true;
    a.hosts = layouts[size_t(r)].hosts ? &layouts[size_t(r)] : nullptr;
    a.segmentBytes = 4096;
    return a;
  }

  int size;
  Topology topology;
  LoopbackWorld world;
  MemoryStore store;
  std::vector<std::unique_ptr<ShmArea>> areas;
  std::vector<HostLayout> layouts;
  std::vector<std::unique_ptr<Communicator>> comms;
};

const Algorithm& hier(Collective coll = Collective::AllReduce) {
  for (const auto& alg : algorithms()) {
    if (alg.coll == coll && alg.name == "hier") return alg;
  }
  throw std::logic_error("no hier algorithm registered");
}

float input(int rank, size_t i, int call) { return float((rank + 1) * 3 + int(i % 11) + call); }

}  // namespace

TEST_CASE("hierarchical all_reduce matches the closed form on every host layout, op, count and call") {
  // Even hosts, then uneven ones: 3 + 1, 2 + 1 + 1 (ranks interleaved), 3 + 2.
  auto hostOf = GENERATE(std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1}, std::vector<int>{0, 0, 0, 1, 1, 1},
                         std::vector<int>{2, 0, 1, 0, 1, 2}, std::vector<int>{0, 0, 0, 1}, std::vector<int>{1, 0, 2, 0},
                         std::vector<int>{0, 1, 0, 1, 0});
  auto count = GENERATE(sweep<size_t>({1, 5, 1003, 20011, 70001}, {1, 1003, 70001}));
  auto op = GENERATE(ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg, ReduceOp::PremulSum);
  CAPTURE(hostOf, count, reduceOpName(op));
  HostsWorld w(hostOf);
  onEachRank(w.size, [&](int r) {
    RANK_REQUIRE(w.layouts[size_t(r)].hosts);
    // Calls in a row, with a flat all-reduce between them on the same
    // communicator: chunk numbering and tags carry across ops.
    for (int call = 0; call < 3; ++call) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = input(r, i, call);
      CollArgs a = w.args(r, uint64_t(2 * call + 1));
      a.op = op;
      a.premulFactor = 0.5;
      a.buf = buf.data();
      a.count = count;
      RANK_REQUIRE_NO_ERROR(runOp(*w.comms[size_t(r)], "all_reduce", a.seq, buildChecked(hier(), a)));
      for (size_t i = 0; i < count; ++i) {
        float want = op == ReduceOp::Max ? input(0, i, call) : 0;
        for (int q = 0; q < w.size; ++q) {
          const float v = input(q, i, call);
          want = op == ReduceOp::Max ? std::max(want, v) : want + v;
        }
        if (op == ReduceOp::Avg) want /= float(w.size);
        if (op == ReduceOp::PremulSum) want *= 0.5f;
        if (std::abs(buf[i] - want) > 1e-5f * std::abs(want)) {
          RANK_FAIL("rank " << r << " element " << i << " got " << buf[i] << " want " << want);
        }
      }
      std::vector<float> flat(7, float(r));
      CollArgs b = w.args(r, uint64_t(2 * call + 2));
      b.buf = flat.data();
      b.count = flat.size();
      b.hosts = nullptr;
      RANK_REQUIRE_NO_ERROR(
          runOp(*w.comms[size_t(r)], "all_reduce", b.seq, buildChecked(cheapestAlgorithm(b), b)));
      RANK_REQUIRE(flat[0] == float(w.size * (w.size - 1) / 2));
    }
  });
}

TEST_CASE("the pipelined hierarchical collectives send every message under its own tag") {
  // Pipeline blocks run their inter-host phases side by side; two messages
  // to one peer under one tag could land in each other's receives.
  const Collective coll =
      GENERATE(Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter);
  CAPTURE(collectiveName(coll));
  HostsWorld w({0, 0, 1, 1});
  const size_t count = 70001;
  std::vector<float> in(4 * count), out(4 * count);
  CollArgs a = w.args(0, 1);
  a.coll = coll;
  a.input = coll == Collective::AllReduce ? nullptr : in.data();
  a.buf = out.data();
  a.count = count;
  // Whole messages: each inter-host phase sends one per peer and step.
  a.segmentBytes = size_t(1) << 20;
  const Schedule s = hier(coll).build(a);
  std::set<std::pair<int, uint64_t>> sent, received;
  size_t sends = 0, recvs = 0;
  for (const Step& st : s.steps()) {
    if (st.kind == StepKind::Send) sends++, sent.insert({st.peer, st.tag});
    if (st.kind == StepKind::Recv) recvs++, received.insert({st.peer, st.tag});
  }
  // 70001 elements in 4 KiB chunks: 16 pipeline blocks, each crossing apart.
  REQUIRE(sends >= PipelineBlocks::kMaxBlocks);
  REQUIRE(sent.size() == sends);
  REQUIRE(received.size() == recvs);
}

TEST_CASE("hierarchical all_gather puts every rank's block in place, in and out of place, on every layout and size") {
  auto hostOf = GENERATE(std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1}, std::vector<int>{2, 0, 1, 0, 1, 2});
  // Up to many shared-memory chunks (4 KiB each here): several pipeline pieces.
  auto count = GENERATE(size_t{1}, size_t{5}, size_t{3001}, size_t{70001});
  auto inPlace = GENERATE(false, true);
  CAPTURE(hostOf, count, inPlace);
  HostsWorld w(hostOf);
  const int n = w.size;
  onEachRank(n, [&](int r) {
    for (int call = 0; call < 2; ++call) {
      std::vector<float> in(count), out(size_t(n) * count, -1.0f);
      for (size_t i = 0; i < count; ++i) in[i] = input(r, i, call);
      if (inPlace) std::copy(in.begin(), in.end(), out.begin() + long(size_t(r) * count));
      CollArgs a = w.args(r, uint64_t(call + 1));
      a.coll = Collective::AllGather;
      a.input = inPlace ? nullptr : in.data();
      a.buf = out.data();
      a.count = count;
      RANK_REQUIRE_NO_ERROR(
          runOp(*w.comms[size_t(r)], "all_gather", a.seq, buildChecked(hier(Collective::AllGather), a)));
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < count; ++i) {
          if (out[size_t(q) * count + i] != input(q, i, call)) {
            RANK_FAIL("rank " << r << " block " << q << " element " << i << " got " << out[size_t(q) * count + i]);
          }
        }
      }
    }
  });
}

TEST_CASE("hierarchical reduce_scatter gives rank r block r of the reduction, for every layout and op") {
  auto hostOf = GENERATE(std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1}, std::vector<int>{2, 0, 1, 0, 1, 2});
  auto count = GENERATE(size_t{1}, size_t{7}, size_t{3001}, size_t{70001});
  auto op = GENERATE(ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg, ReduceOp::PremulSum);
  CAPTURE(hostOf, count, reduceOpName(op));
  HostsWorld w(hostOf);
  const int n = w.size;
  // Rank q's input element i of block b.
  auto value = [](int q, int b, size_t i, int call) { return float(q * 7 + b * 3 + int(i % 5) + call); };
  onEachRank(n, [&](int r) {
    for (int call = 0; call < 2; ++call) {
      std::vector<float> in(size_t(n) * count), out(count, -1.0f);
      for (int b = 0; b < n; ++b) {
        for (size_t i = 0; i < count; ++i) in[size_t(b) * count + i] = value(r, b, i, call);
      }
      CollArgs a = w.args(r, uint64_t(call + 1));
      a.coll = Collective::ReduceScatter;
      a.op = op;
      a.premulFactor = 0.5;
      a.input = in.data();
      a.buf = out.data();
      a.count = count;
      RANK_REQUIRE_NO_ERROR(
          runOp(*w.comms[size_t(r)], "reduce_scatter", a.seq, buildChecked(hier(Collective::ReduceScatter), a)));
      for (size_t i = 0; i < count; ++i) {
        float want = op == ReduceOp::Max ? value(0, r, i, call) : 0;
        for (int q = 0; q < n; ++q) {
          want = op == ReduceOp::Max ? std::max(want, value(q, r, i, call)) : want + value(q, r, i, call);
        }
        if (op == ReduceOp::Avg) want /= float(n);
        if (op == ReduceOp::PremulSum) want *= 0.5f;
        if (std::abs(out[i] - want) > 1e-5f * std::abs(want)) {
          RANK_FAIL("rank " << r << " element " << i << " got " << out[i] << " want " << want);
        }
      }
    }
  });
}

TEST_CASE("hierarchical all_reduce fails on every rank when one host's ranks passed a different count") {
  HostsWorld w({0, 0, 1, 1}, 2s);
  onEachRank(w.size, [&](int r) {
    std::vector<float> buf(r >= 2 ? 3000 : 2000, 1.0f);
    CollArgs a = w.args(r, 1);
    a.buf = buf.data();
    a.count = buf.size();
    auto err = runOp(*w.comms[size_t(r)], "all_reduce", 1, buildChecked(hier(), a));
    RANK_REQUIRE(err);
    RANK_REQUIRE_SAYING(err->what(), err->kind() == ErrorKind::InvalidArgument);
  });
}

TEST_CASE("hierarchical all_reduce names the group rank a local peer stalls on when it times out") {
  HostsWorld w({0, 1, 0, 1}, 300ms);
  onEachRank(w.size, [&](int r) {
    if (r == 2) return;  // rank 2, local rank 1 of host 0, never calls
    std::vector<float> buf(100, 1.0f);
    CollArgs a = w.args(r, 1);
    a.buf = buf.data();
    a.count = buf.size();
    auto err = runOp(*w.comms[size_t(r)], "all_reduce", 1, buildChecked(hier(), a));
    RANK_REQUIRE(err);
    if (r == 0) {
      RANK_REQUIRE_SAYING(err->what(), err->kind() == ErrorKind::Timeout);
      RANK_REQUIRE_SAYING(err->what(), err->awaited() == std::vector<int>{2});
    }
  });
}

TEST_CASE("the hierarchical layout applies to several hosts, some with at least 2 ranks") {
  auto layoutOf = [](std::vector<int> hostOf, int rank) {
    Topology t;
    t.hostOf = std::move(hostOf);
    return HostLayout::of(t, rank);
  };
  REQUIRE(layoutOf({0, 1, 2, 3}, 0).hosts == 0);
  const HostLayout uneven = layoutOf({0, 0, 0, 1}, 3);
  REQUIRE(uneven.hosts == 2);
  REQUIRE(!uneven.even);
  REQUIRE(uneven.portions() == 3);
  REQUIRE(uneven.ownersOf(2) == std::vector<int>{2, 3});
  REQUIRE(layoutOf({0, 0, 0, 0}, 0).hosts == 0);
  const HostLayout h = layoutOf({0, 1, 0, 1, 2, 2}, 3);
  REQUIRE(h.hosts == 3);
  REQUIRE(h.host == 1);
  REQUIRE(h.localRank == 1);
  REQUIRE(h.local == std::vector<int>{1, 3});
  REQUIRE(h.across == std::vector<int>{2, 3, 5});
  REQUIRE(h.even);
}

TEST_CASE("the cost model prefers the hierarchical algorithms across hosts, small and large") {
  HostsWorld w({0, 0, 1, 1});
  auto coll = GENERATE(Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter);
  for (size_t count : {size_t{1}, size_t{1024}, size_t{16} << 20}) {
    CollArgs a = w.args(0, 1);
    a.coll = coll;
    a.count = count;
    CAPTURE(collectiveName(coll), count);
    REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "hier");
    REQUIRE(selectAlgorithm(a, AlgoOverride("ring")).name == "ring");
  }
}

TEST_CASE("on uneven hosts every rank's cost model takes the hierarchical all_reduce for large buffers, all_gather and reduce_scatter stay flat") {
  // 3 + 1 at every size; 2 + 1 + 1 from 256 KiB (below, three hosts'
  // inter-host phase costs more messages than the flat power-of-two ones).
  const std::vector<std::pair<std::vector<int>, size_t>> layouts{{{0, 0, 0, 1}, 1},
                                                                 {{0, 1, 0, 2}, 256 << 10}};
  for (const auto& [hostOf, hierFrom] : layouts) {
    HostsWorld w(hostOf);
    for (size_t count : {size_t{1}, size_t{1024}, size_t{256} << 10, size_t{16} << 20}) {
      std::set<std::string_view> picks;
      for (int r = 0; r < w.size; ++r) {
        CollArgs a = w.args(r, 1);
        a.count = count;
        CAPTURE(hostOf, count, r);
        picks.insert(selectAlgorithm(a, AlgoOverride("")).name);
        REQUIRE(selectAlgorithm(a, AlgoOverride("ring")).name == "ring");
        for (Collective coll : {Collective::AllGather, Collective::ReduceScatter}) {
          a.coll = coll;
          REQUIRE(selectAlgorithm(a, AlgoOverride("")).name != "hier");
        }
      }
      CAPTURE(hostOf, count);
      REQUIRE(picks.size() == 1);
      if (count >= hierFrom) REQUIRE(*picks.begin() == "hier");
    }
  }
}

TEST_CASE("across hosts of one rank each the cost model takes the chain broadcast from 1 MiB, the tree below and on one host") {
  // 8 hosts of one rank: the tree's root sends the buffer 3 times over its
  // link, the chain once; the chain's 6 extra hops cost more than that only
  // for small buffers.
  CollArgs a{Collective::Broadcast, 0, 8, 1};
  a.crossHost = true;
  a.root = 3;
  for (size_t count : {size_t{1}, size_t{1024}}) {
    a.count = count;
    CAPTURE(count);
    REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "binomial");
  }
  for (size_t count : {size_t{256} << 10, size_t{16} << 20}) {
    a.count = count;
    CAPTURE(count);
    REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "chain");
    REQUIRE(selectAlgorithm(a, AlgoOverride("broadcast:binomial")).name == "binomial");
    // On one host, over UCX, the tree stays: the chain is there when forced.
    CollArgs one = a;
    one.crossHost = false;
    REQUIRE(selectAlgorithm(one, AlgoOverride("")).name == "binomial");
    REQUIRE(selectAlgorithm(one, AlgoOverride("broadcast:chain")).name == "chain");
  }
  // Its segments shrink with the buffer, so a short one still fills the
  // chain, and never pass the group's segment size.
  a.count = size_t{256} << 10;
  const size_t shortSegment = chainSegmentBytes(a);
  REQUIRE(shortSegment < 64 * 1024);
  a.count = size_t{256} << 20;
  REQUIRE(chainSegmentBytes(a) == a.segmentBytes);
  a.count = 1;
  REQUIRE(chainSegmentBytes(a) == 16 * 1024);
}

TEST_CASE("across hosts the cost model sends gather's and scatter's blocks directly, "
          "small ones at many hosts by the tree") {
  for (Collective coll : {Collective::Gather, Collective::Scatter}) {
    CAPTURE(collectiveName(coll));
    CollArgs a{coll, 0, 8, 1};
    a.crossHost = true;
    a.root = 3;
    for (size_t count : {size_t{1}, size_t{1024}, size_t{1} << 20}) {
      a.count = count;
      CAPTURE(count);
      REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "direct");
      // On one host, over UCX, the root would take every message itself: the tree.
      CollArgs one = a;
      one.crossHost = false;
      REQUIRE(selectAlgorithm(one, AlgoOverride("")).name == "binomial");
    }
    // 64 hosts: 63 messages at the root cost more than the tree's 6 rounds for
    // small blocks; large ones wait in the tree's largest subtree.
    a.size = 64;
    a.count = 1;
    REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "binomial");
    a.count = size_t{1} << 18;
    REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == "direct");
  }
}

TEST_CASE("the binomial gather tree's runs cross links more often than the direct gather's") {
  // 4 hosts of 2, root 1: the tree's subtree of virtual ranks 4-7 (ranks 5, 6, 7, 0)
  // sends rank 0's block out of host 0 and back in with the others'.
  const std::vector<int> hostOf{0, 0, 1, 1, 2, 2, 3, 3};
  REQUIRE(hierarchy::directGatherBusiestLinkBlocks(hostOf, 1) == 6);
  REQUIRE(hierarchy::binomialGatherBusiestLinkBlocks(hostOf, 1) == 7);
  // Root 0: the tree's runs happen to follow the hosts.
  REQUIRE(hierarchy::binomialGatherBusiestLinkBlocks(hostOf, 0) == 6);
  // One rank per host: every block enters the root's host once either way.
  const std::vector<int> own{0, 1, 2, 3, 4, 5, 6, 7};
  REQUIRE(hierarchy::directGatherBusiestLinkBlocks(own, 5) == 7);
  REQUIRE(hierarchy::binomialGatherBusiestLinkBlocks(own, 5) == 7);
}

TEST_CASE("hierarchical broadcast gives every rank the root's buffer, from every root, on every layout") {
  auto hostOf = GENERATE(std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1}, std::vector<int>{2, 0, 1, 0, 1, 2},
                         std::vector<int>{0, 0, 0, 1}, std::vector<int>{1, 0, 2, 0});
  // Up to many shared-memory chunks (4 KiB each here): several pipeline blocks.
  auto count = GENERATE(size_t{1}, size_t{5}, size_t{3001}, size_t{70001});
  CAPTURE(hostOf, count);
  HostsWorld w(hostOf);
  const int n = w.size;
  onEachRank(n, [&](int r) {
    for (int root = 0; root < n; ++root) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = input(r, i, root);
      CollArgs a = w.args(r, uint64_t(root + 1));
      a.coll = Collective::Broadcast;
      a.root = root;
      a.buf = buf.data();
      a.count = count;
      RANK_REQUIRE_NO_ERROR(
          runOp(*w.comms[size_t(r)], "broadcast", a.seq, buildChecked(hier(Collective::Broadcast), a)));
      for (size_t i = 0; i < count; ++i) {
        if (buf[i] != input(root, i, root)) {
          RANK_FAIL("rank " << r << " root " << root << " element " << i << " got " << buf[i]);
        }
      }
    }
  });
}

TEST_CASE("the cost model takes the hierarchical broadcast only where the flat tree crosses a link more often") {
  // On 2 x 2 hosts the flat binomial tree from root 0 or 2 crosses each link
  // once, as the hierarchical one does; from 1 or 3 the root's host sends
  // twice. Ranks interleaved over the hosts, every root's tree crosses twice.
  HostsWorld w({0, 0, 1, 1});
  HostsWorld interleaved({0, 1, 0, 1});
  for (size_t count : {size_t{1}, size_t{16} << 20}) {
    for (int root = 0; root < 4; ++root) {
      CAPTURE(count, root);
      CollArgs a = w.args(0, 1);
      a.coll = Collective::Broadcast;
      a.root = root;
      a.count = count;
      REQUIRE(selectAlgorithm(a, AlgoOverride("")).name == (root % 2 ? "hier" : "binomial"));
      REQUIRE(selectAlgorithm(a, AlgoOverride("broadcast:binomial")).name == "binomial");
      CollArgs b = interleaved.args(0, 1);
      b.coll = Collective::Broadcast;
      b.root = root;
      b.count = count;
      REQUIRE(selectAlgorithm(b, AlgoOverride("")).name == "hier");
    }
  }
}
