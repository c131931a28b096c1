// The UCX transport between threads of one process: ranks of one group get
// workers of their own, groups over the same threads share them.
#include <catch2/catch.hpp>

#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "core/transport/ucx/ucx_transport.h"
#include "core/transport/ucx/ucx_worker.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

// Pumps progress until `flag` is set or the bound passes.
bool pumpUntil(Transport& t, const bool& flag, std::chrono::seconds bound = 20s) {
  auto end = std::chrono::steady_clock::now() + bound;
  while (!flag && std::chrono::steady_clock::now() < end) t.progress();
  return flag;
}

// One rank's view of a shared store: reading one key takes `delay` longer (a
// rank descheduled on a loaded host), and another key may read as a
// different one.
class SkewedStore : public Store {
 public:
  SkewedStore(Store& inner, std::string slowKey, std::chrono::milliseconds delay)
      : inner_(inner), slowKey_(std::move(slowKey)), delay_(delay) {}
  void redirect(std::string from, std::string to) { redirects_[std::move(from)] = std::move(to); }
  void set(const std::string& key, const std::vector<uint8_t>& value) override { inner_.set(key, value); }
  std::vector<uint8_t> get(const std::string& key) override {
    if (key == slowKey_) std::this_thread::sleep_for(delay_);
    auto to = redirects_.find(key);
    return inner_.get(to == redirects_.end() ? key : to->second);
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_.add(key, delta); }

 private:
  Store& inner_;
  std::string slowKey_;
  std::chrono::milliseconds delay_;
  std::map<std::string, std::string> redirects_;
};

}  // namespace

TEST_CASE("ucx transport: a rank that destroys its transport at once does not break a slower peer's connect") {
  MemoryStore store;
  SkewedStore slowRank0(store, "ringx/ucx/addr/1", 300ms);
  onEachRank(2, [&](int r) {
    std::string error;
    try {
      auto t = makeUcxTransport(r == 0 ? slowRank0 : static_cast<Store&>(store), r, 2, {});
    } catch (const Error& e) {
      error = e.what();
    }
    RANK_REQUIRE_SAYING(error, error.empty());
  });
}

TEST_CASE("ucx transport: when one rank cannot connect, every rank fails at once and names it") {
  MemoryStore store;
  // A worker destroyed before anyone connected: its address is stale.
  { auto gone = makeUcxTransport(store, 0, 1, {"", "stale"}); }
  SkewedStore rank0(store, "", 0ms);
  rank0.redirect("ringx/ucx/addr/2", "stale/addr/0");
  std::vector<std::string> errors(3);
  auto start = std::chrono::steady_clock::now();
  onEachRank(3, [&](int r) {
    try {
      auto t = makeUcxTransport(r == 0 ? rank0 : static_cast<Store&>(store), r, 3, {});
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  const auto took = std::chrono::steady_clock::now() - start;
  INFO("rank 0: " << errors[0] << "\nrank 1: " << errors[1] << "\nrank 2: " << errors[2]);
  REQUIRE(errors[0].find("ringx: UCX ep_create to rank 2 failed: ") == 0);
  for (size_t r : {1, 2}) {
    REQUIRE(errors[r].find("ringx: rank 0 could not connect: UCX ep_create to rank 2 failed") == 0);
  }
  REQUIRE(took < 10s);  // the store's own timeout is 30 s
}

TEST_CASE("ucx transport delivers tagged messages of every size between two workers") {
  MemoryStore store;
  onEachRank(2, [&](int r) {
    auto t = makeUcxTransport(store, r, 2, {});
    RANK_REQUIRE(t->name() == "ucx");
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{8192}, size_t{4} << 20}) {
      std::vector<uint8_t> out(bytes), in(bytes, 0);
      std::iota(out.begin(), out.end(), uint8_t(r * 7));
      bool sent = false, recvd = false;
      TransferResult got;
      t->irecv(1 - r, 42, in.data(), bytes, MemoryKind::Host, [&](const TransferResult& res) {
        got = res;
        recvd = true;
      });
      t->isend(1 - r, 42, out.data(), bytes, MemoryKind::Host, [&](const TransferResult& res) {
        RANK_REQUIRE(res.ok);
        sent = true;
      });
      bool pumpedSend = pumpUntil(*t, sent);
      RANK_REQUIRE(pumpedSend);
      bool pumpedRecv = pumpUntil(*t, recvd);
      RANK_REQUIRE(pumpedRecv);
      RANK_REQUIRE(got.ok);
      RANK_REQUIRE(got.bytes == bytes);
      RANK_REQUIRE(got.source == 1 - r);
      RANK_REQUIRE_EACH(i, bytes, in[i] == uint8_t((1 - r) * 7 + i));
    }
  });
}

TEST_CASE("ucx transport matches receives from any source and reports the sender") {
  MemoryStore store;
  onEachRank(3, [&](int r) {
    auto t = makeUcxTransport(store, r, 3, {});
    if (r == 0) {
      std::set<int> sources;
      for (int k = 0; k < 2; ++k) {
        int v = 0;
        bool done = false;
        TransferResult got;
        t->irecv(kAnySource, 5, &v, sizeof(v), MemoryKind::Host, [&](const TransferResult& res) {
          got = res;
          done = true;
        });
        bool pumped = pumpUntil(*t, done);
        RANK_REQUIRE(pumped);
        RANK_REQUIRE(got.ok);
        RANK_REQUIRE(v == got.source * 100);
        sources.insert(got.source);
      }
      RANK_REQUIRE(sources == std::set<int>{1, 2});
    } else {
      int v = r * 100;
      bool sent = false;
      t->isend(0, 5, &v, sizeof(v), MemoryKind::Host, [&](const TransferResult&) { sent = true; });
      bool pumped = pumpUntil(*t, sent);
      RANK_REQUIRE(pumped);
    }
    // Keep every worker alive until all traffic has landed.
    store.add("done", 1);
    bool never = false;
    while (store.add("done", 0) < 3) pumpUntil(*t, never, 0s);
  });
}

TEST_CASE("ucx transport fails a receive whose message is longer than its buffer") {
  MemoryStore store;
  onEachRank(2, [&](int r) {
    auto t = makeUcxTransport(store, r, 2, {});
    if (r == 0) {
      std::vector<uint8_t> big(64, 1);
      bool sent = false;
      t->isend(1, 9, big.data(), big.size(), MemoryKind::Host, [&](const TransferResult&) { sent = true; });
      bool pumped = pumpUntil(*t, sent);
      RANK_REQUIRE(pumped);
    } else {
      std::vector<uint8_t> small(16);
      bool done = false;
      TransferResult got;
      t->irecv(0, 9, small.data(), small.size(), MemoryKind::Host, [&](const TransferResult& res) {
        got = res;
        done = true;
      });
      bool pumped = pumpUntil(*t, done);
      RANK_REQUIRE(pumped);
      RANK_REQUIRE_FALSE(got.ok);
      RANK_REQUIRE(got.errorKind == ErrorKind::InvalidArgument);
    }
    store.add("done", 1);
    bool never = false;
    while (store.add("done", 0) < 2) pumpUntil(*t, never, 0s);
  });
}

TEST_CASE("ucx transport cancels a pending receive and still runs its callback") {
  MemoryStore store;
  auto t = makeUcxTransport(store, 0, 1, {});
  int v = 0;
  bool done = false;
  TransferResult got;
  TransferId id = t->irecv(0, 77, &v, sizeof(v), MemoryKind::Host, [&](const TransferResult& res) {
    got = res;
    done = true;
  });
  t->cancel(id);
  bool pumped = pumpUntil(*t, done);
  RANK_REQUIRE(pumped);
  RANK_REQUIRE_FALSE(got.ok);
}

TEST_CASE("ucx transport: a peer on this host that destroys its transport while its process lives is seen closed") {
  MemoryStore store;
  onEachRank(2, [&](int r) {
    auto t = makeUcxTransport(store, r, 2, {});
    if (r == 1) {
      t.reset();
      store.add("left", 1);
      return;
    }
    int v = 0;
    bool done = false;
    TransferResult got;
    t->irecv(1, 5, &v, sizeof(v), MemoryKind::Host, [&](const TransferResult& res) {
      got = res;
      done = true;
    });
    while (store.add("left", 0) == 0) t->progress();
    t->checkPeers();
    const bool pumped = pumpUntil(*t, done, 5s);
    RANK_REQUIRE(pumped);
    RANK_REQUIRE_FALSE(got.ok);
    RANK_REQUIRE(got.errorKind == ErrorKind::PeerClosed);
    RANK_REQUIRE_SAYING(got.error, got.error.find("connection to rank 1 closed") != std::string::npos);
    RANK_REQUIRE(t->failedPeers() == std::vector<int>{1});
  });
}

// What a shrunk group's transport must guarantee: messages the parent left
// unreceived (a failed collective's) never match the child's receives, by
// source or from any source; sources are the child's ranks; and the child
// keeps working once the parent's transport is gone.
TEST_CASE("ucx transport: a subset's receives never take what the parent left unreceived, and outlive the parent") {
  MemoryStore store;
  onEachRank(3, [&](int r) {
    auto parent = makeUcxTransport(store, r, 3, {});
    auto sendNow = [](Transport& t, int peer, uint64_t tag, const int& v) {
      bool sent = false;
      t.isend(peer, tag, &v, sizeof(v), MemoryKind::Host, [&](const TransferResult&) { sent = true; });
      return pumpUntil(t, sent);
    };
    auto receive = [](Transport& t, int peer, uint64_t tag, TransferResult& got) {
      int v = -1;
      bool done = false;
      t.irecv(peer, tag, &v, sizeof(v), MemoryKind::Host, [&](const TransferResult& res) {
        got = res;
        done = true;
      });
      return pumpUntil(t, done) ? v : -2;
    };
    // Ranks 0 and 2 leave a message each for rank 1 on the parent's channel,
    // then a marker behind it: once rank 1 has the markers, the stale
    // messages wait in its unexpected queue.
    const int stale = 100 + r, marker = 1;
    if (r != 1) {
      bool staleSent = sendNow(*parent, 1, r == 0 ? 8 : 7, stale);
      RANK_REQUIRE(staleSent);
      bool markerSent = sendNow(*parent, 1, 99, marker);
      RANK_REQUIRE(markerSent);
    } else {
      TransferResult got;
      const int fromZero = receive(*parent, 0, 99, got);
      const int fromTwo = receive(*parent, 2, 99, got);
      RANK_REQUIRE(fromZero == marker);
      RANK_REQUIRE(fromTwo == marker);
    }
    store.add("stale-left", 1);
    while (store.add("stale-left", 0) < 3) parent->progress();
    if (r == 0) {
      // Excluded, alive: it destroys its transport at once.
      parent.reset();
      return;
    }
    const uint32_t channel = parent->nextChannel();
    RANK_REQUIRE(channel != 0);
    parent->forgetPending();
    auto child = parent->subset({1, 2}, channel);
    RANK_REQUIRE(child != nullptr);
    const int childRank = child->rank(), childSize = child->size();
    const uint32_t nextChannel = parent->nextChannel();
    RANK_REQUIRE(childRank == r - 1);
    RANK_REQUIRE(childSize == 2);
    RANK_REQUIRE(nextChannel > channel);
    parent.reset();
    for (int round = 0; round < 2; ++round) {
      if (r == 2) {
        bool bySource = sendNow(*child, 0, 7, 200 + round);
        RANK_REQUIRE(bySource);
        bool anySource = sendNow(*child, 0, 8, 300 + round);
        RANK_REQUIRE(anySource);
      } else {
        TransferResult bySource, anySource;
        const int first = receive(*child, 1, 7, bySource);
        const int second = receive(*child, kAnySource, 8, anySource);
        RANK_REQUIRE(first == 200 + round);
        RANK_REQUIRE(bySource.source == 1);
        RANK_REQUIRE(second == 300 + round);
        RANK_REQUIRE(anySource.source == 1);
      }
    }
    store.add("child-done", 1);
    bool never = false;
    while (store.add("child-done", 0) < 2) pumpUntil(*child, never, 0s);
  });
}

// Groups of different sizes live at once over the same threads, on workers
// they share: a message with the same tag and sender rank in each group is
// taken only by its own group's receive, from one source or from any, in
// whichever order the receives are posted; one group's destruction leaves
// the other working.
TEST_CASE("ucx transport: groups over the same ranks at once never take each other's messages") {
  MemoryStore store;
  onEachRank(3, [&](int r) {
    auto trio = makeUcxTransport(store, r, 3, {"", "trio"});
    std::unique_ptr<Transport> pair;
    if (r < 2) pair = makeUcxTransport(store, r, 2, {"", "pair"});
    int fromTrio = -1, fromPair = -1;
    bool trioDone = false, pairDone = false, trioSent = false, pairSent = false;
    TransferResult trioRes, pairRes;
    if (r == 1) {
      const int a = 300, b = 200;
      trio->isend(0, 7, &a, sizeof(a), MemoryKind::Host, [&](const TransferResult&) { trioSent = true; });
      pair->isend(0, 7, &b, sizeof(b), MemoryKind::Host, [&](const TransferResult&) { pairSent = true; });
      bool sentBoth = pumpUntil(*trio, trioSent) && pumpUntil(*pair, pairSent);
      RANK_REQUIRE(sentBoth);
    }
    store.add("sent", 1);
    while (store.add("sent", 0) < 3) trio->progress();
    if (r == 0) {
      pair->irecv(kAnySource, 7, &fromPair, sizeof(fromPair), MemoryKind::Host, [&](const TransferResult& x) {
        pairRes = x;
        pairDone = true;
      });
      trio->irecv(1, 7, &fromTrio, sizeof(fromTrio), MemoryKind::Host, [&](const TransferResult& x) {
        trioRes = x;
        trioDone = true;
      });
      bool both = pumpUntil(*pair, pairDone) && pumpUntil(*trio, trioDone);
      RANK_REQUIRE(both);
      RANK_REQUIRE(fromPair == 200);
      RANK_REQUIRE(pairRes.source == 1);
      RANK_REQUIRE(fromTrio == 300);
    }
    store.add("received", 1);
    while (store.add("received", 0) < 3) trio->progress();
    pair.reset();
    if (r == 2) {
      const int c = 400;
      bool sent = false;
      trio->isend(0, 8, &c, sizeof(c), MemoryKind::Host, [&](const TransferResult&) { sent = true; });
      bool pumped = pumpUntil(*trio, sent);
      RANK_REQUIRE(pumped);
    } else if (r == 0) {
      int got = -1;
      bool done = false;
      trio->irecv(kAnySource, 8, &got, sizeof(got), MemoryKind::Host, [&](const TransferResult&) { done = true; });
      bool pumped = pumpUntil(*trio, done);
      RANK_REQUIRE(pumped);
      RANK_REQUIRE(got == 400);
    }
    store.add("trio-done", 1);
    while (store.add("trio-done", 0) < 3) trio->progress();
  });
}

// A worker is shared while it has a tag channel left for the group; once
// its channels are used up, the next group gets a fresh worker and the
// groups on the old one keep theirs.
TEST_CASE("ucx worker: a group gets a fresh worker once the shared one has no tag channel left for it") {
  std::shared_ptr<UcxWorker> shared;
  {
    UcxWorker::Claim claim("", 1);
    shared = claim.worker();
  }
  {
    UcxWorker::Claim claim("", 1);
    REQUIRE(claim.worker() == shared);
  }
  while (shared->proposeChannel(1) != UcxWorker::kNoChannel) {
  }
  UcxWorker::Claim claim("", 1);
  REQUIRE(claim.worker() != shared);
  REQUIRE(claim.worker()->proposeChannel(1) == 0);
}

TEST_CASE("a group on one host asks UCX for every transport but TCP, unless the user chose them") {
  REQUIRE(ucxTransportsFor("", nullptr, true) == "^tcp");
  REQUIRE(ucxTransportsFor("", nullptr, false).empty());
  // UCX reads UCX_TLS itself: nothing asked over it.
  REQUIRE(ucxTransportsFor("", "tcp,self", true).empty());
  REQUIRE(ucxTransportsFor("tcp,sm,self", nullptr, true) == "tcp,sm,self");
  REQUIRE(ucxTransportsFor("rc,sm,self", "tcp", false) == "rc,sm,self");
  // UCX's unified mode cannot reach even the process itself without a network transport.
  REQUIRE(ucxTransportsFor("", nullptr, true, "y").empty());
  REQUIRE(ucxTransportsFor("", nullptr, true, "YES").empty());
  REQUIRE(ucxTransportsFor("", nullptr, true, "n") == "^tcp");
}
