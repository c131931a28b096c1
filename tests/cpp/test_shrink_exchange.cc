// The survivors' exchange of a shrink (core/engine/shrink_exchange.h) over the
// loopback transport, and a communicator handing its transport over.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include "core/engine/shrink_exchange.h"
#include "test_support.h"

using namespace ringx;
using namespace std::chrono_literals;

namespace {

// Runs the exchange on each rank of `ranks` in a thread of its own; returns
// each rank's messages or its error text.
struct ExchangeOutcome {
  std::map<int, std::vector<uint8_t>> got;
  std::string error;
  ErrorKind kind = ErrorKind::Internal;
};

std::map<int, ExchangeOutcome> exchangeOn(LoopbackWorld& world, const std::vector<int>& ranks,
                                  std::chrono::milliseconds timeout,
                                  std::function<std::string(int)> messageOf = nullptr) {
  std::map<int, std::future<ExchangeOutcome>> running;
  for (int r : ranks) {
    running[r] = std::async(std::launch::async, [&, r] {
      std::vector<int> peers;
      for (int p : ranks) {
        if (p != r) peers.push_back(p);
      }
      const std::string mine = messageOf ? messageOf(r) : "same";
      ExchangeOutcome out;
      try {
        out.got = exchangeAmong(*world.transports[r], peers, {}, kShrinkTagBase, bytesOf(mine), 64,
                                std::chrono::steady_clock::now() + timeout,
                                [&](int peer, const std::vector<uint8_t>& m) {
                                  if (m != bytesOf(mine)) {
                                    throw Error(ErrorKind::InvalidArgument,
                                                "rank " + std::to_string(peer) + " sent " +
                                                    std::string(m.begin(), m.end()));
                                  }
                                });
      } catch (const Error& e) {
        out.error = e.what();
        out.kind = e.kind();
      }
      return out;
    });
  }
  std::map<int, ExchangeOutcome> outcomes;
  for (auto& [r, f] : running) outcomes[r] = f.get();
  return outcomes;
}

}  // namespace

TEST_CASE("survivors exchange their messages without the excluded rank") {
  LoopbackWorld world = makeLoopbackWorld(4);
  world.kill(2);
  auto out = exchangeOn(world, {0, 1, 3}, 5s);
  for (int r : {0, 1, 3}) {
    CHECK(out[r].error.empty());
    CHECK(out[r].got.size() == 2);
    for (auto& [p, m] : out[r].got) CHECK(m == bytesOf("same"));
  }
}

TEST_CASE("a survivor whose message differs fails every survivor, none waiting out the timeout") {
  LoopbackWorld world = makeLoopbackWorld(3);
  const auto start = std::chrono::steady_clock::now();
  auto out = exchangeOn(world, {0, 1, 2}, 20s, [](int r) { return std::string(r == 1 ? "other" : "same"); });
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  for (int r : {0, 1, 2}) {
    CHECK(out[r].kind == ErrorKind::InvalidArgument);
    CHECK_THAT(out[r].error, Catch::Contains("sent"));
  }
  CHECK_THAT(out[0].error, Catch::Contains("rank 1 sent other"));
}

TEST_CASE("a survivor that died fails the exchange naming it; one that never comes times it out") {
  SECTION("died") {
    LoopbackWorld world = makeLoopbackWorld(3);
    world.kill(2);
    auto out = exchangeOn(world, {0, 1}, 5s);
    // Ranks 0 and 1 exchange with each other only: both succeed. Rank 0
    // counting 2 as a survivor fails.
    CHECK(out[0].error.empty());
    std::vector<uint8_t> none;
    CHECK_THROWS_WITH(exchangeAmong(*world.transports[0], {2}, {}, kShrinkTagBase + 1, none, 8,
                                    std::chrono::steady_clock::now() + 5s, [](int, const std::vector<uint8_t>&) {}),
                      Catch::Contains("rank 2 closed"));
  }
  SECTION("never comes") {
    LoopbackWorld world = makeLoopbackWorld(3);
    auto out = exchangeOn(world, {0, 1}, 5s);
    CHECK(out[0].error.empty());
    std::vector<uint8_t> none;
    try {
      exchangeAmong(*world.transports[0], {2}, {}, kShrinkTagBase + 1, none, 8, std::chrono::steady_clock::now() + 200ms,
                    [](int, const std::vector<uint8_t>&) {});
      FAIL("no timeout");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::Timeout);
      CHECK_THAT(e.what(), Catch::Contains("Timed out waiting for rank(s) 2"));
    }
  }
}

TEST_CASE("a released communicator fails its pending ops with the reason and hands its transport over") {
  LoopbackWorld world = makeLoopbackWorld(2);
  Communicator comm(std::move(world.transports[0]), CommOptions{});
  std::vector<float> buf(4);
  Schedule s(DType::F32, ReduceOp::Sum);
  s.recv(1, 7, buf.data(), buf.size() * sizeof(float));
  auto op = std::make_unique<Op>("recv", 1, std::move(s));
  std::promise<std::string> failed;
  op->onDone = [&](const Error* e) { failed.set_value(e ? e->what() : "ok"); };
  comm.submit(std::move(op));
  CHECK(comm.opsInFlight() == 1);
  std::unique_ptr<Transport> t = comm.release("shrunk");
  REQUIRE(t);
  CHECK_THAT(failed.get_future().get(), Catch::Contains("the process group was shrunk while this operation was pending"));
  CHECK(comm.opsInFlight() == 0);
  // The forgotten receive takes nothing: a message of the same tag reaches a
  // receive posted by the new owner.
  const float sent[4] = {1, 2, 3, 4};
  bool sendDone = false;
  world.transports[1]->isend(0, 7, sent, sizeof(sent), MemoryKind::Host, [&](const TransferResult&) { sendDone = true; });
  std::vector<float> got(4);
  bool recvDone = false;
  t->irecv(1, 7, got.data(), got.size() * sizeof(float), MemoryKind::Host,
           [&](const TransferResult& r) { recvDone = r.ok; });
  for (int i = 0; i < 1000 && !recvDone; ++i) {
    t->progress();
    world.transports[1]->progress();
    std::this_thread::sleep_for(1ms);
  }
  CHECK(recvDone);
  CHECK(got == std::vector<float>{1, 2, 3, 4});
  CHECK_FALSE(comm.release("again"));
}

TEST_CASE("survivors that disagree on who stays still hear each other: a rank also tells those it excludes") {
  LoopbackWorld world = makeLoopbackWorld(3);
  // Ranks 0 and 1 keep everyone; rank 2 excludes rank 1, and so waits for rank 0 only.
  auto run = [&](int r, std::vector<int> peers, std::vector<int> alsoTell, std::string mine) {
    return std::async(std::launch::async, [&world, r, peers, alsoTell, mine] {
      try {
        exchangeAmong(*world.transports[r], peers, alsoTell, kShrinkTagBase, bytesOf(mine), 64,
                      std::chrono::steady_clock::now() + 20s, [&](int peer, const std::vector<uint8_t>& m) {
                        if (m != bytesOf(mine)) throw Error(ErrorKind::InvalidArgument, "rank " + std::to_string(peer));
                      });
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    });
  };
  const auto start = std::chrono::steady_clock::now();
  auto r0 = run(0, {1, 2}, {}, "all");
  auto r1 = run(1, {0, 2}, {}, "all");
  auto r2 = run(2, {0}, {1}, "not 1");
  CHECK(r0.get() == "rank 2");
  CHECK(r1.get() == "rank 2");
  CHECK(r2.get() == "rank 0");
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}
