#include "core/common/settings.h"

#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "core/common/error.h"

namespace ringx {

namespace {

// A chunk stays in L2 from copy-in through the reduce to copy-out only if
// what a rank touches for it fits there: its input's chunk, its own slot and
// the peers' portions, about three slots. Slots of a quarter of L2 do (on a
// VM with 2 MiB of L2, 512 KiB slots made the world-2 all_reduce 14-23%
// faster than 2 MiB ones from 4 MiB up, and both 1 MiB and 256 KiB slower
// than 512 KiB; docs/algorithms.md, "The slot size").
size_t l2SlotBytes() {
  const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2 > 0 ? std::clamp<size_t>(size_t(l2) / 4, 64 << 10, 4 << 20) : 512 << 10;
}

const std::vector<Setting> kSettings = {
    {"RINGX_DEBUG", SettingType::Choice, "`WARN`, `INFO`, `TRACE`", "WARN", "`WARN`", nullptr,
     false,
     "How much ringx logs to stderr; `INFO` names the algorithm chosen for each call, `TRACE` "
     "every op's start."},
    {"RINGX_ALGO", SettingType::Text,
     "`ring`, `recursive_doubling`, `rabenseifner`, `shm`, `hier`, ... or "
     "`all_reduce:ring,broadcast:binomial`",
     "", "unset (cost model)", nullptr, true,
     "Force an algorithm (per collective, or any collective that has that name); unknown names "
     "make "
     "`init_process_group` raise a `ValueError` listing the choices. See `docs/algorithms.md`."},
    {"RINGX_CHUNK_BYTES", SettingType::PositiveInt, "bytes", "262144", "`262144`", nullptr, true,
     "Pipeline segment size of the ring and tree algorithms: messages are cut into segments of "
     "this size, "
     "several in flight."},
    {"RINGX_SPIN_US", SettingType::Text, "`auto`, or microseconds (`0`: never spin)", "50", "`50`",
     nullptr, false,
     "How long a thread that progresses ringx (the caller waiting on its op, or the progress thread) "
     "polls after its last piece of work before it sleeps: on its doorbell in shared memory, which the "
     "peers it waits for ring, when it waits only for peers on this host; on the UCX worker's event fd "
     "when it waits only for the network; on the doorbell for at most 200 us at a time, looking at the "
     "network between, when it waits for both. Also how long an op nobody waits on may sit before the "
     "progress thread takes it. `auto` spins only where a spin costs no other rank its core: when "
     "this host's ranks (`LOCAL_WORLD_SIZE`, or the group's ranks on the host if more) are no more "
     "than the CPUs the process may use, and then on the network alone only while such waits "
     "have mostly ended within the 50 us (a slow link, or hosts that share cores, makes it sleep "
     "at once); `RINGX_DEBUG=INFO` logs the choice. Not the default: on the loaded 2-core VM "
     "`auto` (no spin with 4-32 ranks) was slower than 50 us (docs/benchmarks.md, \"Waiting "
     "with more ranks than cores\"), and on the namespace test bed it won with 8 hosts and lost "
     "a 4 KiB broadcast on 2 (docs/many-hosts.md)."},
    {"RINGX_PIN_THREADS", SettingType::Flag, "`0`, `1`", "0", "`0`", nullptr, false,
     "`1`: when this host's ranks fill its CPUs (`LOCAL_WORLD_SIZE` >= the CPUs the process may use), "
     "pin rank r's progress and completion threads to CPU r (mod the CPUs). Off by default: since "
     "callers drive their own collectives it lost in the compute-gap and interleaved patterns "
     "(docs/benchmarks.md). With cores to spare, or a process already confined to one CPU, nothing "
     "is pinned."},
    {"RINGX_CUDA_PATH", SettingType::Choice, "`staged`, `resident`, `ipc`", "staged", "`staged`", nullptr, true,
     "How collectives on CUDA tensors (a CUDA build of ringx) move data. `staged`: through page-locked host "
     "buffers and the CPU algorithms (shared memory on one host), for any UCX. `resident`: device buffers go "
     "to UCX (cuda_copy, cuda_ipc) and reductions run as ringx's CUDA kernels; only the network algorithms. "
     "`ipc`: device to device through CUDA IPC and ringx's kernels when every rank is on one host; ops it does "
     "not take (send/recv, coalesced calls, uneven all_to_all, barrier, sparse) and groups across hosts run "
     "`staged`. The path taken, and why, is logged at INFO. Only `staged` with a blocking wait has passed on a "
     "GPU so far; `ipc` has run only on the simulated device (README, CUDA)."},
    {"RINGX_CUDA_IPC_BYTES", SettingType::PositiveInt, "bytes", "8388608", "`8388608`", nullptr, true,
     "`RINGX_CUDA_PATH=ipc`: the device buffer each rank allocates at the group's first collective on CUDA "
     "tensors and its peers map; a collective moves through it in rounds of at most this size."},
    {"RINGX_IPC_ALGO", SettingType::Choice, "`auto`, `one_shot`, `two_shot`, `ring`", "auto", "`auto`", nullptr,
     true,
     "`RINGX_CUDA_PATH=ipc`: the all_reduce algorithm. `auto`: the ipc path's cost model picks one-shot "
     "(small), two-shot (medium) or the chunked ring (large, from 3 ranks) by size, ranks and "
     "`RINGX_CUDA_IPC_BYTES`; its constants are guesses until a GPU run measures them, and forcing each in "
     "turn is how that run compares them. A forced algorithm that cannot run (the ring at one rank, or "
     "through a buffer of fewer than two elements) gives way to `auto`'s choice; INFO logs the one run."},
    {"RINGX_CUDA_STAGE_BYTES", SettingType::PositiveInt, "bytes", "4194304", "`4194304`", nullptr, true,
     "Host-staged all_reduce, broadcast and reduce of CUDA tensors larger than this run as up to 8 pieces of "
     "about this size, each its own collective, so the copies between device and host of one piece overlap "
     "the schedule of another."},
    {"RINGX_BLOCKING_WAIT", SettingType::Flag, "`0`, `1`", "0", "`0`", nullptr, false,
     "`1`: `Work.wait()` on a collective of CUDA tensors blocks the host until the data is in place and "
     "raises its error, like `TORCH_NCCL_BLOCKING_WAIT`. `0`: it makes the caller's current stream wait "
     "for the collective and returns at once, as NCCL does."},
    {"RINGX_ASYNC_ERROR_HANDLING", SettingType::Choice, "`raise`, `teardown`", "raise", "`raise`", nullptr, false,
     "What happens when a collective on CUDA tensors fails after its non-blocking `Work.wait()` returned, "
     "like `TORCH_NCCL_ASYNC_ERROR_HANDLING`. `raise`: the error is raised by the group's next call on CUDA "
     "tensors (the group is unusable from then on) and by `Work.exception()`. `teardown`: the process logs it "
     "and aborts. Either way a failed collective leaves the caller's tensors as they were (host-staged path)."},
    {"RINGX_SHM", SettingType::Flag, "`0`, `1`", "1", "`1`", nullptr, true,
     "Set up shared memory between ranks on one host for the intra-host algorithms; `0` sends "
     "everything "
     "through UCX."},
    {"RINGX_SHM_BYTES", SettingType::PositiveInt, "bytes", "",
     "a quarter of one core's L2 (`getconf LEVEL2_CACHE_SIZE`, clamped to 64 KiB-4 MiB)", &l2SlotBytes, true,
     "Size of each of a rank's two shared-memory slots (the intra-host chunk), rounded down to 64 "
     "bytes, "
     "at least 4096: a chunk whose copies stay in L2 from copy-in to copy-out."},
    {"RINGX_CMA", SettingType::Choice, "`auto`, `0`, `1`", "auto", "`auto`", nullptr, true,
     "Single-copy intra-host transfers (Linux CMA, `process_vm_readv`): `auto` probes at group "
     "creation whether every rank can read every other's memory and uses them where the cost model "
     "says they pay, `0` keeps to the shared-memory slots, `1` makes group creation fail when the "
     "probe does. `RINGX_DEBUG=INFO` logs the probe's outcome and why it failed."},
    {"RINGX_TLS", SettingType::Text, "UCX transport list", "",
     "unset: `^tcp` (all but TCP) for a group whose ranks share one host's memory and pid "
     "namespace (unless `UCX_UNIFIED_MODE` is on: it needs a network transport), else UCX "
     "chooses",
     nullptr, false,
     "UCX transports to use, as UCX's `UCX_TLS` (which also works; either one set is used as "
     "is). On one host UCX carries the data over shared memory either way; leaving TCP out "
     "only makes group creation cheaper."},
    {"RINGX_UCX_LIBRARY_PATH", SettingType::Text, "a folder holding `libucp.so.0`", "",
     "unset (the UCX ringx was built against)", nullptr, false,
     "Run on the site's UCX (HPC-X, MOFED, a distro's: its InfiniBand/RoCE transports) instead of "
     "the libucx wheel's; read when ringx is imported. That UCX must be at least as new as the one "
     "ringx was built against (`python -m ringx` shows both); otherwise rebuild against it "
     "(README, \"Many hosts\")."},
};

[[noreturn]] void badValue(const Setting& s, const std::string& v, const char* want) {
  throw Error(ErrorKind::InvalidArgument, std::string("ringx: ") + s.name + "='" + v + "' is not " +
                                              want + " (" + s.values + ")");
}

size_t parsePositive(const Setting& s, const std::string& v) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.front() == '-' || end == v.c_str() || *end || n == 0) badValue(s, v, "a positive integer");
  return size_t(n);
}

bool parseFlag(const Setting& s, const std::string& v) {
  if (v == "0") return false;
  if (v == "1") return true;
  badValue(s, v, "0 or 1");
}

std::string upper(std::string v) {
  for (char& c : v) c = char(std::toupper(static_cast<unsigned char>(c)));
  return v;
}

// How a rank's value is compared with the others': normalised when valid, so
// "1" and unset agree on a flag whose default is 1; as given when not, so the
// rank with the bad value still takes part and raises its own error after.
std::string comparable(const Setting& s) {
  const auto v = settingValue(s.name);
  if (!v) return *s.defaultValue ? settingEffective(s.name) : "unset";
  try {
    return settingEffective(s.name);
  } catch (const Error&) {
    return *v;
  }
}

}  // namespace

// name \0 value \0 ... for the ranksMustAgree settings, in table order.
std::string agreementRecord() {
  std::string out;
  for (const auto& s : kSettings) {
    if (!s.ranksMustAgree) continue;
    out += s.name;
    out += '\0';
    out += comparable(s);
    out += '\0';
  }
  return out;
}

namespace {

std::map<std::string, std::string> decode(const std::vector<uint8_t>& raw) {
  std::map<std::string, std::string> out;
  std::string s(raw.begin(), raw.end());
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t a = s.find('\0', pos);
    if (a == std::string::npos) break;
    const size_t b = s.find('\0', a + 1);
    if (b == std::string::npos) break;
    out[s.substr(pos, a - pos)] = s.substr(a + 1, b - a - 1);
    pos = b + 1;
  }
  return out;
}

std::string rankList(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i)
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) out += " and " + std::to_string(ranks.size() - kShown) + " more";
  return out;
}

// Rank 0's verdict over every rank's encoded settings: "" when they agree.
std::string verdict(const std::vector<std::map<std::string, std::string>>& all) {
  for (const auto& s : kSettings) {
    if (!s.ranksMustAgree) continue;
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int r = 0; r < int(all.size()); ++r) {
      const auto it = all[size_t(r)].find(s.name);
      const std::string v = it == all[size_t(r)].end() ? "(not known to this ringx)" : it->second;
      auto g =
          std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == v; });
      if (g == groups.end()) {
        groups.push_back({v, {r}});
      } else {
        g->second.push_back(r);
      }
    }
    if (groups.size() < 2) continue;
    std::string msg = std::string("the ranks disagree on ") + s.name + ": ";
    for (size_t i = 0; i < groups.size(); ++i) {
      msg += (i ? ", " : "") + ("'" + groups[i].first + "' on " + rankList(groups[i].second));
    }
    std::string names;
    for (const auto& t : kSettings) {
      if (t.ranksMustAgree) names += (names.empty() ? "" : ", ") + std::string(t.name);
    }
    return msg + ". Settings that shape a schedule (" + names +
           ") must be the same on every rank of a group: set them alike on every rank, or unset "
           "them everywhere.";
  }
  return "";
}

}  // namespace

const std::vector<Setting>& settingsTable() { return kSettings; }

const Setting& settingSpec(std::string_view name) {
  for (const auto& s : kSettings) {
    if (name == s.name) return s;
  }
  throw std::logic_error("ringx: no setting named " + std::string(name) + " in the settings table");
}

std::optional<std::string> settingValue(std::string_view name) {
  const char* v = std::getenv(settingSpec(name).name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::string settingText(std::string_view name) {
  const auto v = settingValue(name);
  return v ? *v : settingSpec(name).defaultValue;
}

size_t settingPositive(std::string_view name) {
  const Setting& s = settingSpec(name);
  if (const auto v = settingValue(name)) return parsePositive(s, *v);
  return s.computeDefault ? s.computeDefault() : parsePositive(s, s.defaultValue);
}

bool settingFlag(std::string_view name) {
  const Setting& s = settingSpec(name);
  return parseFlag(s, settingValue(name).value_or(s.defaultValue));
}

std::string settingEffective(std::string_view name) {
  const Setting& s = settingSpec(name);
  switch (s.type) {
    case SettingType::PositiveInt:
      return std::to_string(settingPositive(name));
    case SettingType::Flag:
      return settingFlag(name) ? "1" : "0";
    case SettingType::Choice:
      return upper(settingText(name));
    case SettingType::Text:
      break;
  }
  return settingText(name);
}

void checkSettingsAgree(Store& store, const std::string& keyPrefix, int rank, int size,
                        const std::string& record) {
  store.set(keyPrefix + "/" + std::to_string(rank), bytesOf(record));
  const std::string verdictKey = keyPrefix + "/verdict";
  std::string message;
  if (rank == 0) {
    std::vector<std::map<std::string, std::string>> all;
    for (const auto& raw : getFromEveryRank(store, keyPrefix, size)) all.push_back(decode(raw));
    message = verdict(all);
    store.set(verdictKey, bytesOf(message));
  } else {
    const auto raw = store.get(verdictKey);
    message.assign(raw.begin(), raw.end());
  }
  if (!message.empty()) {
    leaveStoreTogether(store, keyPrefix + "/left", rank, size);
    throw Error(ErrorKind::InvalidArgument, "ringx: creating the process group (rank " +
                                                std::to_string(rank) + "): " + message);
  }
}

}  // namespace ringx
