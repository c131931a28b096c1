// The engine's failure handling and completion callbacks (issue 10): failures
// never re-enter the transport, no exception leaves an engine thread, and
// callbacks run on bounded threads, in order, never after shutdown.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include "core/common/exit_watch.h"
#include "core/transport/loopback/loopback_transport.h"
#include "test_support.h"

using namespace ringx;
using namespace ringx::test;
using namespace std::chrono_literals;

namespace {

// Wraps a transport to check the engine's side of the contract (the engine
// never cancels from inside a transfer callback) and to inject failures.
class CheckingTransport final : public Transport {
 public:
  explicit CheckingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "checking"; }
  TransferId isend(int peer, uint64_t tag, const void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done) override {
    if (throwOnSend) throw std::runtime_error("injected isend failure");
    return inner_->isend(peer, tag, buf, bytes, mem, std::move(done));
  }
  TransferId irecv(int peer, uint64_t tag, void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done) override {
    recvsInFlight++;
    auto counted = [this, done = std::move(done)](const TransferResult& r) {
      recvsInFlight--;
      done(r);
    };
    return inner_->irecv(peer, tag, buf, bytes, mem, std::move(counted));
  }
  void cancel(TransferId id) override {
    if (inProgress_) cancelsInsideCallbacks++;
    cancels++;
    inner_->cancel(id);
  }
  bool progress() override {
    if (throwOnProgress.exchange(false)) throw std::logic_error("injected progress failure");
    inProgress_ = true;
    bool did = inner_->progress();
    inProgress_ = false;
    return did;
  }
  int eventFd() const override { return inner_->eventFd(); }
  bool arm() override { return inner_->arm(); }
  void checkPeers() override {
    peerChecks++;
    inner_->checkPeers();
  }
  std::vector<int> failedPeers() const override { return inner_->failedPeers(); }
  void forgetPending() override { inner_->forgetPending(); }

  std::atomic<int> cancelsInsideCallbacks{0};
  std::atomic<int> cancels{0};
  std::atomic<int> recvsInFlight{0};  // posted, and not yet completed or cancelled
  std::atomic<bool> throwOnSend{false};
  std::atomic<bool> throwOnProgress{false};
  std::atomic<int> peerChecks{0};

 private:
  std::unique_ptr<Transport> inner_;
  bool inProgress_ = false;
};

struct CheckedWorld {
  LoopbackWorld world;
  std::vector<CheckingTransport*> transports;
  std::vector<std::unique_ptr<Communicator>> comms;
};

CheckedWorld makeCheckedWorld(int size, std::chrono::milliseconds timeout) {
  CheckedWorld w;
  w.world = makeLoopbackWorld(size);
  CommOptions opts;
  opts.timeout = timeout;
  for (auto& t : w.world.transports) {
    auto checking = std::make_unique<CheckingTransport>(std::move(t));
    w.transports.push_back(checking.get());
    w.comms.push_back(std::make_unique<Communicator>(std::move(checking), opts));
  }
  return w;
}

Schedule oneStep(DType dtype, const Step& step) {
  Schedule s(dtype, ReduceOp::Sum);
  s.setAlgorithm("test");
  s.add(step);
  return s;
}

bool contains(const std::optional<Error>& e, const std::string& words) {
  return e && std::string(e->what()).find(words) != std::string::npos;
}

// Whether every thread of this process but the caller sleeps in the kernel.
bool otherThreadsAsleep() {
  const std::string self = std::to_string(::gettid());
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    if (task.path().filename() == self) continue;
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'S') return false;
  }
  return true;
}

// Forks once the engine's threads are idle. The child allocates and throws;
// a lock that another thread of the parent held at the moment of fork stays
// held in the child forever. ringx's child path takes none of its own, but
// GCC 12's AddressSanitizer takes none of its allocator's locks around fork
// (LLVM's runtime does since 18), and one CI run of the ASan build saw this
// child hang. A thread inside such a lock is running, not asleep.
pid_t forkWhileOthersSleep() {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  int quietChecks = 0;
  while (quietChecks < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
    quietChecks = otherThreadsAsleep() ? quietChecks + 1 : 0;
  }
  return ::fork();
}

// Submits op 1 with schedule s; the future holds its error, if it fails.
std::future<std::optional<Error>> submitted(Communicator& comm, const char* name, Schedule s) {
  auto promise = std::make_shared<std::promise<std::optional<Error>>>();
  auto op = std::make_unique<Op>(name, 1, std::move(s));
  op->onDone = [promise](const Error* e) { promise->set_value(e ? std::optional<Error>(*e) : std::nullopt); };
  auto outcome = promise->get_future();
  comm.submit(std::move(op));
  return outcome;
}

}  // namespace

TEST_CASE("a dead peer with many receives in flight fails the op without cancelling inside a callback") {
  auto w = makeCheckedWorld(2, 5s);
  // Rank 0 posts 64 receives from rank 1, which dies: every receive fails in
  // the same progress() call, the first failure while the others are pending.
  std::vector<std::byte> buf(64 * 1024);
  Schedule s(DType::U8, ReduceOp::Sum);
  s.setAlgorithm("test");
  for (int i = 0; i < 64; ++i) s.recv(1, uint64_t(i), buf.data() + i * 1024, 1024);
  auto outcome = submitted(*w.comms[0], "all_reduce", std::move(s));
  std::this_thread::sleep_for(50ms);
  w.world.kill(1);
  auto err = outcome.get();
  REQUIRE(err);
  CHECK(err->kind() == ErrorKind::PeerClosed);
  CHECK(contains(err, "connection to rank 1 closed"));
  CHECK(w.transports[0]->cancelsInsideCallbacks == 0);
  // Later ops fail at once with the cause, and the communicator shuts down cleanly.
  auto again = runOp(*w.comms[0], "barrier", 2, oneStep(DType::U8, {StepKind::Recv, 1, 99, buf.data(), nullptr, 1}));
  CHECK(contains(again, "failed earlier"));
  w.comms.clear();
}

TEST_CASE("a closed peer's failure names every peer the op still waited for, itself included") {
  // What a monitored barrier reports as the ranks that did not pass.
  auto w = makeCheckedWorld(3, 5s);
  std::vector<std::byte> buf(2);
  Schedule s(DType::U8, ReduceOp::Sum);
  s.setAlgorithm("test");
  for (int p = 1; p <= 2; ++p) s.recv(p, 7, buf.data() + p - 1, 1);
  auto outcome = submitted(*w.comms[0], "monitored_barrier", std::move(s));
  std::this_thread::sleep_for(50ms);
  w.world.kill(2);
  auto err = outcome.get();
  REQUIRE(err);
  CHECK(err->kind() == ErrorKind::PeerClosed);
  CHECK(err->awaited() == std::vector<int>{1, 2});
  w.comms.clear();
}

namespace {

// Rank 0 of a 4-rank world waits out closed peers for a byte from each of
// ranks 1-3 (into buf); rank 3 then dies.
std::future<std::optional<Error>> arrivalsThenRank3Dies(CheckedWorld& w, std::vector<std::byte>& buf) {
  Schedule s(DType::U8, ReduceOp::Sum);
  s.setAlgorithm("test");
  s.setWaitOutClosedPeers();
  for (int p = 1; p <= 3; ++p) s.recv(p, 7, buf.data() + p - 1, 1);
  auto outcome = submitted(*w.comms[0], "monitored_barrier", std::move(s));
  std::this_thread::sleep_for(50ms);
  w.world.kill(3);
  return outcome;
}

std::optional<Error> arrive(CheckedWorld& w, int rank) {
  static const std::byte one{1};
  return runOp(*w.comms[rank], "monitored_barrier", 1, oneStep(DType::U8, {StepKind::Send, 0, 7, nullptr, &one, 1}));
}

}  // namespace

TEST_CASE(
    "an op that waits out closed peers goes on receiving from the others, then names only the peer "
    "that closed") {
  auto w = makeCheckedWorld(4, 5s);
  std::vector<std::byte> buf(3);
  auto outcome = arrivalsThenRank3Dies(w, buf);
  // Long after the close (and the engine's 1 s grace for dead peers), ranks
  // 1 and 2 arrive: the op has waited for them.
  std::this_thread::sleep_for(1500ms);
  REQUIRE(outcome.wait_for(0s) == std::future_status::timeout);
  REQUIRE_FALSE(arrive(w, 1));
  REQUIRE_FALSE(arrive(w, 2));
  auto err = outcome.get();
  REQUIRE(err);
  CHECK(err->kind() == ErrorKind::PeerClosed);
  CHECK(err->awaited() == std::vector<int>{3});
  CHECK(buf[0] == std::byte{1});
  CHECK(buf[1] == std::byte{1});
  w.comms.clear();
}

TEST_CASE("an op that waits out closed peers times out naming the peers that closed and those that never sent") {
  auto w = makeCheckedWorld(4, 300ms);
  std::vector<std::byte> buf(3);
  auto outcome = arrivalsThenRank3Dies(w, buf);
  REQUIRE_FALSE(arrive(w, 2));
  auto err = outcome.get();
  REQUIRE(err);
  CHECK(err->kind() == ErrorKind::Timeout);
  CHECK(err->awaited() == std::vector<int>{1, 3});
  w.comms.clear();
}

TEST_CASE("a failed op is reported only once none of its receives can still write into its buffers") {
  auto w = makeCheckedWorld(2, 5s);
  // Rank 0's op posts a receive that rank 1 never matches, then a send that
  // fails at once. A caller told of the failure may free the buffer, so the
  // receive must be cancelled and completed before onDone runs.
  std::vector<std::byte> buf(16);
  Schedule s(DType::U8, ReduceOp::Sum);
  s.setAlgorithm("test");
  s.recv(1, 1, buf.data(), 8);
  s.send(1, 2, buf.data() + 8, 8);
  CheckingTransport* t = w.transports[0];
  t->throwOnSend = true;
  auto inFlightWhenTold = std::make_shared<std::promise<int>>();
  auto op = std::make_unique<Op>("all_reduce", 1, std::move(s));
  op->onDone = [inFlightWhenTold, t](const Error* e) { inFlightWhenTold->set_value(e ? t->recvsInFlight.load() : -1); };
  w.comms[0]->submit(std::move(op));
  auto told = inFlightWhenTold->get_future();
  REQUIRE(told.wait_for(5s) == std::future_status::ready);
  CHECK(told.get() == 0);
  CHECK(t->cancels == 1);
  w.comms.clear();
}

TEST_CASE("a failure while another op has transfers in flight cancels them outside callbacks") {
  auto w = makeCheckedWorld(2, 300ms);
  // Op 1 waits on a receive rank 1 never sends; op 2 times out first (shorter
  // timeout) and poisons the communicator, failing op 1 and cancelling its receive.
  std::vector<std::byte> buf(16);
  auto p1 = std::make_shared<std::promise<std::optional<Error>>>();
  auto op1 =
      std::make_unique<Op>("broadcast", 1, oneStep(DType::U8, {StepKind::Recv, 1, 1, buf.data(), nullptr, 8}));
  op1->onDone = [p1](const Error* e) { p1->set_value(e ? std::optional<Error>(*e) : std::nullopt); };
  op1->timeout = 10s;
  w.comms[0]->submit(std::move(op1));
  auto err2 = runOp(*w.comms[0], "all_reduce", 2,
                    oneStep(DType::U8, {StepKind::Recv, 1, 2, buf.data() + 8, nullptr, 8}), 100ms);
  CHECK(contains(err2, "Timed out"));
  auto err1 = p1->get_future().get();
  CHECK(contains(err1, "the communicator failed"));
  // Each error was told once its op's receive had been cancelled.
  CHECK(w.transports[0]->cancels >= 2);
  CHECK(w.transports[0]->cancelsInsideCallbacks == 0);
}

TEST_CASE("a step that throws fails its op with the message and poisons the group, and the process survives") {
  auto w = makeCheckedWorld(1, 5s);
  Communicator& comm = *w.comms[0];
  std::vector<int32_t> ints(4, 1);
  SECTION("a scale step on a dtype it does not support") {
    auto err = runOp(comm, "all_reduce", 1, oneStep(DType::I32, {StepKind::Scale, -1, 0, ints.data(), nullptr, 16}));
    REQUIRE(err);
    CHECK(contains(err, "ringx: all_reduce (rank 0, seq 1): scale step 0 failed: "));
  }
  SECTION("a poll predicate that throws something other than ringx::Error") {
    Schedule s(DType::U8, ReduceOp::Sum);
    s.poll([]() -> bool { throw std::out_of_range("injected poll failure"); }, nullptr);
    auto err = runOp(comm, "all_gather", 1, std::move(s));
    CHECK(contains(err, "ringx: all_gather (rank 0, seq 1): poll step 0 failed: injected poll failure"));
  }
  SECTION("posting a transfer throws") {
    w.transports[0]->throwOnSend = true;
    auto err = runOp(comm, "send", 1, oneStep(DType::U8, {StepKind::Send, 0, 1, nullptr, ints.data(), 4}));
    CHECK(contains(err, "ringx: send (rank 0, seq 1): send step 0 failed: injected isend failure"));
  }
  SECTION("the transport's progress throws") {
    auto p = std::make_shared<std::promise<std::optional<Error>>>();
    auto op = std::make_unique<Op>("recv", 1, oneStep(DType::U8, {StepKind::Recv, 0, 1, ints.data(), nullptr, 4}));
    op->onDone = [p](const Error* e) { p->set_value(e ? std::optional<Error>(*e) : std::nullopt); };
    w.transports[0]->throwOnProgress = true;
    comm.submit(std::move(op));
    auto err = p->get_future().get();
    CHECK(contains(err, "injected progress failure"));
  }
  auto again = runOp(comm, "barrier", 2, Schedule(DType::U8, ReduceOp::Sum));
  CHECK(contains(again, "failed earlier"));
  REQUIRE(comm.error());
}

TEST_CASE("callbacks start in completion order on a bounded number of threads while one blocks") {
  auto w = makeCheckedWorld(1, 5s);
  Communicator& comm = *w.comms[0];
  const int n = 24;
  std::mutex mu;
  std::vector<int> started;
  std::set<std::thread::id> threads;
  std::promise<void> lastRan;
  auto lastRanFuture = lastRan.get_future().share();
  std::promise<void> allDone;
  std::atomic<int> done{0};
  for (int i = 0; i < n; ++i) {
    auto op = std::make_unique<Op>("all_reduce", uint64_t(i + 1), Schedule(DType::U8, ReduceOp::Sum));
    op->onCallbacks = [&, i](const Error*) {
      {
        std::lock_guard<std::mutex> lock(mu);
        started.push_back(i);
        threads.insert(std::this_thread::get_id());
      }
      // The first callback waits for the last (a PowerSGD-style hook waiting on a later future).
      if (i == 0) lastRanFuture.wait();
      if (i == n - 1) lastRan.set_value();
      if (++done == n) allDone.set_value();
    };
    comm.submit(std::move(op));
  }
  REQUIRE(allDone.get_future().wait_for(10s) == std::future_status::ready);
  std::lock_guard<std::mutex> lock(mu);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  CHECK(started == order);
  CHECK(threads.size() >= 2);
  CHECK(threads.size() <= 4);
}

TEST_CASE("no callback runs after shutdown returns") {
  auto w = makeCheckedWorld(1, 5s);
  std::atomic<bool> shutDown{false};
  std::atomic<int> late{0}, ran{0};
  std::promise<void> firstStarted;
  auto submit = [&](uint64_t seq, std::chrono::milliseconds busy, std::promise<void>* started) {
    auto op = std::make_unique<Op>("all_reduce", seq, Schedule(DType::U8, ReduceOp::Sum));
    op->onCallbacks = [&, busy, started](const Error*) {
      if (started) started->set_value();
      std::this_thread::sleep_for(busy);
      if (shutDown) ++late;
      ++ran;
    };
    w.comms[0]->submit(std::move(op));
  };
  // The later completions arrive while a callback is busy: they must still be
  // done, or dropped, by the time shutdown returns.
  submit(1, 20ms, &firstStarted);
  firstStarted.get_future().wait();
  for (uint64_t i = 2; i <= 16; ++i) submit(i, 100ms, nullptr);
  w.comms[0]->shutdown();
  shutDown = true;
  std::this_thread::sleep_for(200ms);
  CHECK(late == 0);
  CHECK(ran == 16);
}

TEST_CASE("dropping the last reference to a communicator inside its own callback is safe") {
  auto w = makeCheckedWorld(1, 5s);
  auto comm = std::shared_ptr<Communicator>(std::move(w.comms[0]));
  std::promise<void> destroyed;
  auto op = std::make_unique<Op>("all_reduce", 1, Schedule(DType::U8, ReduceOp::Sum));
  auto holder = std::make_shared<std::shared_ptr<Communicator>>(comm);
  op->onCallbacks = [holder, &destroyed](const Error*) {
    holder->reset();  // the last reference: the destructor runs on this callback thread
    destroyed.set_value();
  };
  comm->submit(std::move(op));
  comm.reset();
  REQUIRE(destroyed.get_future().wait_for(5s) == std::future_status::ready);
  std::this_thread::sleep_for(50ms);  // the callback thread exits after the communicator is gone
}

TEST_CASE("a forked child that submits to its parent's communicator gets an error, not a hang") {
  auto w = makeCheckedWorld(1, 5s);
  REQUIRE_FALSE(runOp(*w.comms[0], "barrier", 1, Schedule(DType::U8, ReduceOp::Sum)));
  pid_t pid = forkWhileOthersSleep();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 1;
    try {
      w.comms[0]->submit(std::make_unique<Op>("barrier", 2, Schedule(DType::U8, ReduceOp::Sum)));
    } catch (const Error& e) {
      code = std::string(e.what()).find("forked child") != std::string::npos ? 0 : 2;
    }
    w.comms.clear();  // the child's copy is abandoned, not joined
    ::_exit(code);
  }
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (::waitpid(pid, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL("the forked child hung");
  }
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // The parent's communicator is unaffected.
  CHECK_FALSE(runOp(*w.comms[0], "barrier", 2, Schedule(DType::U8, ReduceOp::Sum)));
}

TEST_CASE(
    "a watched peer's exit wakes a rank asleep on its doorbell and checks its peers at once") {
  const bool callerDrives = GENERATE(true, false);
  CAPTURE(callerDrives);
  BellWord word;
  FutexBell bell({&word}, 0);
  auto world = makeLoopbackWorld(1);
  auto checking = std::make_unique<CheckingTransport>(std::move(world.transports[0]));
  CheckingTransport& t = *checking;
  CommOptions opts;
  opts.spin = 0us;
  opts.bell = &bell;
  Communicator comm(std::move(checking), opts);
  const pid_t peer = ::fork();
  REQUIRE(peer >= 0);
  if (peer == 0) {
    ::pause();
    ::_exit(0);
  }
  auto watch = watchExit(peer);
  if (!watch) {
    ::kill(peer, SIGKILL);
    ::waitpid(peer, nullptr, 0);
    WARN("pidfd_open is unavailable here: the peer checks run every 100 ms, nothing to test");
    return;
  }
  // A poll that waits on nobody in particular and never completes: its
  // rank sleeps on the doorbell until a pass finds something to do.
  Schedule s(DType::U8, ReduceOp::Sum);
  s.setAlgorithm("test");
  s.poll([] { return false; }, [] { return std::vector<int>{}; });
  std::atomic<bool> done{false};
  auto op = std::make_unique<Op>("wait_forever", 1, std::move(s));
  op->callerWaits = callerDrives;
  op->onDone = [&done](const Error*) { done = true; };
  comm.submit(std::move(op));
  std::thread driver;
  if (callerDrives) driver = std::thread([&] { comm.drive([&] { return done.load(); }); });
  // Killed right after a periodic check, the peer would otherwise be looked
  // at only at the next, 100 ms later.
  auto checkedSince = [&](int n) {
    for (const auto until = std::chrono::steady_clock::now() + 5s; t.peerChecks.load() <= n;
         std::this_thread::sleep_for(50us)) {
      if (std::chrono::steady_clock::now() >= until) return false;
    }
    return true;
  };
  REQUIRE(checkedSince(t.peerChecks.load()));
  const int checks = t.peerChecks.load();
  const uint32_t rung = word.seq.load();
  const auto killed = std::chrono::steady_clock::now();
  ::kill(peer, SIGKILL);
  REQUIRE(checkedSince(checks));
  const auto took = std::chrono::steady_clock::now() - killed;
  CAPTURE(std::chrono::duration_cast<std::chrono::microseconds>(took).count());
  CHECK(took < 50ms);
  CHECK(word.seq.load() != rung);
  comm.abort("test over");
  if (driver.joinable()) driver.join();
  ::waitpid(peer, nullptr, 0);
}
