// Shared helpers of the core tests: an in-memory store, a per-rank thread
// runner and a blocking "run this op" wrapper around the engine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/common/store.h"
#include "core/engine/communicator.h"
#include "core/transport/loopback/loopback_transport.h"

namespace ringx::test {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
    cv_.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30), [&] { return kv_.count(key) > 0; })) {
      throw Error(ErrorKind::Timeout, "MemoryStore: timed out waiting for " + key);
    }
    return kv_[key];
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& v = kv_[key];
    int64_t cur = 0;
    if (v.size() == sizeof(cur)) std::memcpy(&cur, v.data(), sizeof(cur));
    cur += delta;
    v.resize(sizeof(cur));
    std::memcpy(v.data(), &cur, sizeof(cur));
    cv_.notify_all();
    return cur;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> kv_;
};

// Catch2 v2's assertion macros are not thread-safe: code on rank threads
// asserts through these, which take turns.
inline std::mutex& assertionMutex() {
  static std::mutex m;
  return m;
}
#define RANK_REQUIRE(...)                                             \
  do {                                                                \
    std::lock_guard<std::mutex> rankAssertionLock(assertionMutex()); \
    REQUIRE(__VA_ARGS__);                                             \
  } while (false)
#define RANK_REQUIRE_FALSE(...)                                       \
  do {                                                                \
    std::lock_guard<std::mutex> rankAssertionLock(assertionMutex()); \
    REQUIRE_FALSE(__VA_ARGS__);                                       \
  } while (false)
#define RANK_FAIL(...)                                                \
  do {                                                                \
    std::lock_guard<std::mutex> rankAssertionLock(assertionMutex()); \
    FAIL(__VA_ARGS__);                                                \
  } while (false)
// Checks that a call returned no error; the call itself runs outside the
// lock, since it may wait for the other ranks.
#define RANK_REQUIRE_NO_ERROR(...)                                            \
  do {                                                                        \
    auto rankError = (__VA_ARGS__);                                           \
    RANK_REQUIRE_SAYING((rankError ? rankError->what() : "no error"), !rankError); \
  } while (false)
// A check whose failure report shows `what`.
#define RANK_REQUIRE_SAYING(what, ...)                                \
  do {                                                                \
    std::lock_guard<std::mutex> rankAssertionLock(assertionMutex()); \
    INFO(what);                                                       \
    REQUIRE(__VA_ARGS__);                                             \
  } while (false)

// Checks `cond` for every index `i` below `n` with one assertion, made at the
// first index where it fails (so the report shows that element) or not at
// all: an assertion per element takes the ranks' mutex millions of times,
// which under the sanitizers made single tests take half a minute.
#define RANK_REQUIRE_EACH(i, n, ...)                                             \
  do {                                                                         \
    const size_t rankEachEnd = (n);                                            \
    size_t i = 0;                                                              \
    while (i < rankEachEnd && (__VA_ARGS__)) ++i;                              \
    if (i < rankEachEnd) RANK_REQUIRE_SAYING("element " + std::to_string(i), __VA_ARGS__); \
  } while (false)

// Runs fn(rank) on one thread per rank and rethrows the first failure.
template <typename Fn>
void onEachRank(int size, Fn fn) {
  std::vector<std::future<void>> done;
  for (int r = 0; r < size; ++r) done.push_back(std::async(std::launch::async, fn, r));
  for (auto& f : done) f.get();
}

// Submits a schedule; the future holds its error, if any, once it ended.
inline std::future<std::optional<Error>> submitOp(Communicator& comm, const std::string& name, uint64_t seq,
                                                  Schedule s,
                                                  std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
  auto promise = std::make_shared<std::promise<std::optional<Error>>>();
  auto future = promise->get_future();
  auto op = std::make_unique<Op>(name, seq, std::move(s));
  op->timeout = timeout;
  op->onDone = [promise](const Error* e) {
    promise->set_value(e ? std::optional<Error>(*e) : std::nullopt);
  };
  comm.submit(std::move(op));
  return future;
}

// Submits a schedule and blocks until it ends; returns the error, if any.
inline std::optional<Error> runOp(Communicator& comm, const std::string& name, uint64_t seq, Schedule s,
                                  std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
  return submitOp(comm, name, seq, std::move(s), timeout).get();
}

// One communicator per rank over `world`'s transports (the world stays the
// caller's, for kill()).
inline std::vector<std::unique_ptr<Communicator>> communicatorsOver(LoopbackWorld& world,
                                                                    std::chrono::milliseconds timeout) {
  std::vector<std::unique_ptr<Communicator>> comms;
  CommOptions opts;
  opts.timeout = timeout;
  for (auto& t : world.transports) comms.push_back(std::make_unique<Communicator>(std::move(t), opts));
  return comms;
}

inline std::vector<std::unique_ptr<Communicator>> makeWorld(int size,
                                                            std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto world = makeLoopbackWorld(size);
  return communicatorsOver(world, timeout);
}

}  // namespace ringx::test
