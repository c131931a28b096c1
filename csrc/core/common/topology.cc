#include "core/common/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>

#include "core/common/error.h"
#include "core/common/shm_segment.h"

namespace ringx {

namespace {

constexpr size_t kTokenBytes = 32;

std::string firstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string pidNamespace() {
  char pidns[64] = {0};
  ssize_t n = ::readlink("/proc/self/ns/pid", pidns, sizeof(pidns) - 1);
  return n > 0 ? std::string(pidns, size_t(n)) : "";
}

// The directory shm_open names live in, as device and inode: the same for
// every process whose /dev/shm is the same mount (containers given the
// host's), different for each tmpfs mounted there.
std::string shmDirectory() {
  struct stat st {};
  if (::stat("/dev/shm", &st) != 0) return "none";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

// What a rank publishes about where it runs. Ranks with the same key share a
// host without asking; ranks of one boot with different keys ask by
// capability: can one open the other's probe segment and read its token?
struct Candidate {
  std::string boot, pidns, shmDir, uid, probe, token;

  std::string key() const { return boot + "/" + pidns + "/" + shmDir + "/" + uid; }
  std::string encode() const { return boot + "\n" + pidns + "\n" + shmDir + "\n" + uid + "\n" + probe + "\n" + token; }
  static Candidate decode(const std::string& text) {
    Candidate c;
    std::istringstream in(text);
    for (std::string* field : {&c.boot, &c.pidns, &c.shmDir, &c.uid, &c.probe, &c.token}) std::getline(in, *field);
    return c;
  }
};

// A small segment in /dev/shm holding a random token: a peer that can open
// it by name and reads the same token shares /dev/shm with this process.
// Null when /dev/shm refuses it; the rank then shares only by key.
std::unique_ptr<ShmSegment> makeProbe(std::string& token) {
  std::random_device rd;
  static const char kHex[] = "0123456789abcdef";
  token.clear();
  for (size_t i = 0; i < kTokenBytes; ++i) token += kHex[rd() % 16];
  try {
    auto probe = ShmSegment::create(kTokenBytes, "host probe");
    std::memcpy(probe->data(), token.data(), kTokenBytes);
    return probe;
  } catch (const Error&) {
    return nullptr;
  }
}

bool readsProbe(const Candidate& peer) {
  if (peer.probe.empty() || peer.token.size() != kTokenBytes) return false;
  try {
    auto seen = ShmSegment::open(peer.probe, kTokenBytes, "host probe");
    return std::memcmp(seen->data(), peer.token.data(), kTokenBytes) == 0;
  } catch (const Error&) {
    return false;
  }
}

// Hosts numbered by their lowest rank: rank r's host is the index of its
// label among the distinct labels, in rank order.
std::vector<int> numberByLabel(const std::vector<std::string>& labels) {
  std::map<std::string, int> index;
  std::vector<int> hostOf;
  for (const std::string& label : labels) hostOf.push_back(index.emplace(label, int(index.size())).first->second);
  return hostOf;
}

const char* pathName(HostPath path) {
  switch (path) {
    case HostPath::SingleCopy:
      return "shared memory, single copy";
    case HostPath::TwoCopy:
      return "shared memory, two-copy";
    case HostPath::Network:
      break;
  }
  return "network";
}

// Ranks as runs: "0-1, 4, 6-7".
std::string rankRuns(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string hostIdentity() { return firstLine("/proc/sys/kernel/random/boot_id") + "/" + pidNamespace(); }

std::string shmDomain() {
  return firstLine("/proc/sys/kernel/random/boot_id") + "/" + shmDirectory() + "/" + std::to_string(::geteuid());
}

int Topology::hosts() const { return hostOf.empty() ? 0 : *std::max_element(hostOf.begin(), hostOf.end()) + 1; }

std::vector<int> Topology::ranksOn(int host) const {
  std::vector<int> ranks;
  for (int r = 0; r < int(hostOf.size()); ++r) {
    if (hostOf[size_t(r)] == host) ranks.push_back(r);
  }
  return ranks;
}

std::string Topology::describe(const std::vector<HostPath>& paths) const {
  const int h = hosts();
  std::string out = std::to_string(h) + (h == 1 ? " host: " : " hosts: ");
  for (int i = 0; i < h; ++i) {
    out += i ? "; host " : "host ";
    out += std::to_string(i);
    out += " = ranks ";
    out += rankRuns(ranksOn(i));
    if (size_t(i) < paths.size()) out += std::string(" (") + pathName(paths[size_t(i)]) + ")";
  }
  return out;
}

Topology Topology::exchange(Store& store, const std::string& keyPrefix, int rank, int size) {
  Candidate mine{firstLine("/proc/sys/kernel/random/boot_id"), pidNamespace(), shmDirectory(),
                 std::to_string(::geteuid()), "", ""};
  const std::unique_ptr<ShmSegment> probe = makeProbe(mine.token);
  if (probe) mine.probe = probe->name();
  store.set(keyPrefix + "/" + std::to_string(rank), bytesOf(mine.encode()));
  const auto published = getFromEveryRank(store, keyPrefix, size);
  std::vector<Candidate> all;
  std::vector<std::string> keys;
  std::map<std::string, std::string> keyOfBoot;
  bool ask = false;
  for (int r = 0; r < size; ++r) {
    all.push_back(r == rank ? mine : Candidate::decode(stringOf(published[size_t(r)])));
    keys.push_back(all.back().key());
    const auto [seen, fresh] = keyOfBoot.emplace(all.back().boot, keys.back());
    ask = ask || (!fresh && seen->second != keys.back());
  }
  Topology t;
  // Every rank sees the same keys, so all ask, or none does.
  if (!ask) {
    t.hostOf = numberByLabel(keys);
    t.sameNamespacesPerHost = true;
    return t;
  }
  // Each rank's row says whom it shares /dev/shm with; ranks with the same
  // row are one host, so every two of them can open each other's segments.
  std::string row(size_t(size), '0');
  for (int p = 0; p < size; ++p) {
    const Candidate& c = all[size_t(p)];
    if (keys[size_t(p)] == keys[size_t(rank)] || (c.boot == mine.boot && readsProbe(c))) row[size_t(p)] = '1';
  }
  store.set(keyPrefix + "/shares/" + std::to_string(rank), bytesOf(row));
  const auto rows = getFromEveryRank(store, keyPrefix + "/shares", size);
  std::vector<std::string> labels;
  for (int p = 0; p < size; ++p) labels.push_back(p == rank ? row : stringOf(rows[size_t(p)]));
  t.hostOf = numberByLabel(labels);
  return t;
}

Topology Topology::subset(const std::vector<int>& ranks) const {
  Topology t;
  t.sameNamespacesPerHost = sameNamespacesPerHost;
  std::map<int, int> index;
  for (int r : ranks) t.hostOf.push_back(index.emplace(hostOf[size_t(r)], int(index.size())).first->second);
  return t;
}

std::vector<HostPath> hostPaths(const Topology& t, bool groupShm, bool cma, bool hostShm) {
  std::vector<HostPath> paths;
  for (int h = 0; h < t.hosts(); ++h) {
    const bool shares = t.ranksOn(h).size() > 1 && (groupShm || hostShm);
    paths.push_back(!shares ? HostPath::Network : groupShm && cma ? HostPath::SingleCopy : HostPath::TwoCopy);
  }
  return paths;
}

}  // namespace ringx
