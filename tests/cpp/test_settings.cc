// The RINGX_* settings table, its typed reads, and the check that the ranks
// of a group agree on the settings that shape a schedule.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>

#include "core/common/error.h"
#include "core/common/settings.h"
#include "core/common/spin_policy.h"
#include "test_support.h"

using namespace ringx;
using ringx::test::assertionMutex;
using ringx::test::MemoryStore;
using ringx::test::onEachRank;

namespace {

// Sets (or, with nullptr, unsets) one variable for the scope's lifetime.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// This rank's agreement record with `name` set to `value` (nullptr: unset).
std::string recordWith(const char* name, const char* value) {
  ScopedEnv v(name, value);
  return agreementRecord();
}

// Runs checkSettingsAgree on one thread per rank with record(rank); returns
// each rank's error text ("" when it passed). Every error must be InvalidArgument.
template <typename RecordFn>
std::vector<std::string> checkOnEachRank(MemoryStore& store, int size, RecordFn record) {
  std::vector<std::string> errors(static_cast<size_t>(size));
  onEachRank(size, [&](int rank) {
    try {
      checkSettingsAgree(store, "g/settings", rank, size, record(rank));
    } catch (const Error& e) {
      RANK_REQUIRE(e.kind() == ErrorKind::InvalidArgument);
      errors[size_t(rank)] = e.what();
    }
  });
  return errors;
}

}  // namespace

TEST_CASE("every setting has a RINGX_ name, help, and a default that parses") {
  std::set<std::string> names;
  for (const auto& s : settingsTable()) {
    INFO(s.name);
    REQUIRE(std::string(s.name).rfind("RINGX_", 0) == 0);
    REQUIRE(names.insert(s.name).second);
    REQUIRE(std::string(s.help).size() > 20);
    REQUIRE(std::string(s.defaultText).size() > 0);
    ScopedEnv unset(s.name, nullptr);
    REQUIRE_NOTHROW(settingEffective(s.name));
  }
  for (const char* mustAgree :
       {"RINGX_SHM_BYTES", "RINGX_ALGO", "RINGX_CHUNK_BYTES", "RINGX_SHM"}) {
    REQUIRE(settingSpec(mustAgree).ranksMustAgree);
  }
  REQUIRE_THROWS_AS(settingSpec("RINGX_NO_SUCH_THING"), std::logic_error);
}

TEST_CASE("typed reads take the environment's value, else the default, and name bad values") {
  {
    ScopedEnv v("RINGX_CHUNK_BYTES", nullptr);
    REQUIRE(settingPositive("RINGX_CHUNK_BYTES") == 262144);
    REQUIRE_FALSE(settingValue("RINGX_CHUNK_BYTES").has_value());
  }
  {
    ScopedEnv v("RINGX_CHUNK_BYTES", "4096");
    REQUIRE(settingPositive("RINGX_CHUNK_BYTES") == 4096);
    REQUIRE(settingEffective("RINGX_CHUNK_BYTES") == "4096");
  }
  for (const char* bad : {"0", "-5", "12k", "x"}) {
    ScopedEnv v("RINGX_CHUNK_BYTES", bad);
    REQUIRE_THROWS_WITH(
        settingPositive("RINGX_CHUNK_BYTES"),
        Catch::Contains(std::string("RINGX_CHUNK_BYTES='") + bad + "' is not a positive integer"));
  }
  {
    ScopedEnv v("RINGX_SHM", "0");
    REQUIRE_FALSE(settingFlag("RINGX_SHM"));
  }
  {
    ScopedEnv v("RINGX_SHM", "yes");
    REQUIRE_THROWS_WITH(settingFlag("RINGX_SHM"), Catch::Contains("RINGX_SHM='yes' is not 0 or 1"));
  }
  {
    // The default slot is a quarter of one core's L2, within 64 KiB-4 MiB.
    ScopedEnv v("RINGX_SHM_BYTES", nullptr);
    const size_t slot = settingPositive("RINGX_SHM_BYTES");
    const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 > 0) REQUIRE(slot == std::clamp<size_t>(size_t(l2) / 4, 64u << 10, 4u << 20));
    REQUIRE(slot >= (64u << 10));
    REQUIRE(slot <= (4u << 20));
  }
  {
    ScopedEnv v("RINGX_DEBUG", "info");
    REQUIRE(settingEffective("RINGX_DEBUG") == "INFO");
  }
}

TEST_CASE(
    "ranks that agree on the schedule settings pass, and a flag given as its default agrees with "
    "unset") {
  std::string unset, explicitDefault;
  {
    ScopedEnv v("RINGX_SHM", nullptr);
    unset = agreementRecord();
  }
  {
    ScopedEnv v("RINGX_SHM", "1");
    explicitDefault = agreementRecord();
  }
  MemoryStore store;
  const auto errors =
      checkOnEachRank(store, 3, [&](int rank) { return rank == 1 ? explicitDefault : unset; });
  for (const auto& e : errors) REQUIRE(e == "");
}

TEST_CASE(
    "ranks that disagree on a schedule setting all raise, naming it, each value and the ranks") {
  for (const char* name : {"RINGX_SHM_BYTES", "RINGX_ALGO", "RINGX_CHUNK_BYTES", "RINGX_SHM"}) {
    const std::string value = std::string(name) == "RINGX_ALGO"  ? "ring"
                              : std::string(name) == "RINGX_SHM" ? "0"
                                                                 : "65536";
    const std::string mine = recordWith(name, nullptr), other = recordWith(name, value.c_str());
    MemoryStore store;
    const auto errors =
        checkOnEachRank(store, 3, [&](int rank) { return rank == 1 ? other : mine; });
    for (int rank = 0; rank < 3; ++rank) {
      INFO(name << " rank " << rank << ": " << errors[size_t(rank)]);
      const std::string& e = errors[size_t(rank)];
      REQUIRE(e.rfind("ringx: creating the process group (rank " + std::to_string(rank) + "): ",
                      0) == 0);
      REQUIRE(e.find(std::string("the ranks disagree on ") + name + ":") != std::string::npos);
      REQUIRE(e.find("'" + value + "' on rank 1") != std::string::npos);
      REQUIRE(e.find("on ranks 0, 2") != std::string::npos);
    }
  }
}

TEST_CASE("a rank with an unparsable value still takes part in the check") {
  const std::string good = recordWith("RINGX_CHUNK_BYTES", nullptr),
                    bad = recordWith("RINGX_CHUNK_BYTES", "lots");
  MemoryStore store;
  const auto errors = checkOnEachRank(store, 2, [&](int rank) { return rank == 0 ? bad : good; });
  for (const auto& e : errors) REQUIRE_THAT(e, Catch::Contains("'lots' on rank 0"));
}

namespace {

// A store hosted by rank 0, as torch's env:// rendezvous hosts it: once rank 0
// has raised (its process may end), every call fails as a closed connection
// would. Reads of `slowKey` take 200 ms, as a loaded rank's might.
class StoreOnRankZero : public Store {
 public:
  explicit StoreOnRankZero(std::string slowKey) : slowKey_(std::move(slowKey)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    checkOpen();
    inner_.set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    if (key == slowKey_) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    checkOpen();
    return inner_.get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    checkOpen();
    return inner_.add(key, delta);
  }
  void close() { closed_ = true; }

 private:
  void checkOpen() const {
    if (closed_) throw Error(ErrorKind::PeerClosed, "the store's connection was closed");
  }
  MemoryStore inner_;
  std::string slowKey_;
  std::atomic<bool> closed_{false};
};

}  // namespace

TEST_CASE("every rank gets the disagreement, even when rank 0, which hosts the store, leaves with it at once") {
  const std::string mine = recordWith("RINGX_SHM_BYTES", nullptr),
                    other = recordWith("RINGX_SHM_BYTES", "65536");
  const int size = 3;
  StoreOnRankZero store("g/settings/verdict");
  std::vector<std::string> errors(size);
  onEachRank(size, [&](int rank) {
    try {
      checkSettingsAgree(store, "g/settings", rank, size, rank == 2 ? other : mine);
    } catch (const Error& e) {
      errors[size_t(rank)] = e.what();
      if (rank == 0) store.close();
    }
  });
  for (int r = 0; r < size; ++r) {
    INFO("rank " << r);
    CHECK(errors[size_t(r)].find("the ranks disagree on RINGX_SHM_BYTES") != std::string::npos);
  }
}

TEST_CASE("RINGX_SPIN_US takes auto, 0 and microseconds (50 when unset), and names a bad value") {
  {
    ScopedEnv unset("RINGX_SPIN_US", nullptr);
    REQUIRE(spinSetting() == std::chrono::microseconds(50));
  }
  {
    ScopedEnv v("RINGX_SPIN_US", "AUTO");
    REQUIRE_FALSE(spinSetting());
  }
  {
    ScopedEnv v("RINGX_SPIN_US", "0");
    REQUIRE(spinSetting() == std::chrono::microseconds(0));
  }
  {
    ScopedEnv v("RINGX_SPIN_US", "75");
    REQUIRE(spinSetting() == std::chrono::microseconds(75));
  }
  for (const char* bad : {"-1", "fast", "10us"}) {
    ScopedEnv v("RINGX_SPIN_US", bad);
    REQUIRE_THROWS_WITH(spinSetting(), Catch::Contains("RINGX_SPIN_US") && Catch::Contains(bad));
  }
}
