#include "core/common/topology.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>

namespace ringx {

namespace {

std::string firstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
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

std::string hostIdentity() {
  char pidns[64] = {0};
  ssize_t n = ::readlink("/proc/self/ns/pid", pidns, sizeof(pidns) - 1);
  return firstLine("/proc/sys/kernel/random/boot_id") + "/" + (n > 0 ? std::string(pidns, size_t(n)) : "");
}

int Topology::hosts() const { return hostOf.empty() ? 0 : *std::max_element(hostOf.begin(), hostOf.end()) + 1; }

std::vector<int> Topology::ranksOn(int host) const {
  std::vector<int> ranks;
  for (int r = 0; r < int(hostOf.size()); ++r) {
    if (hostOf[size_t(r)] == host) ranks.push_back(r);
  }
  return ranks;
}

std::string Topology::describe() const {
  const int h = hosts();
  std::string out = std::to_string(h) + (h == 1 ? " host: " : " hosts: ");
  for (int i = 0; i < h; ++i) {
    out += i ? "; host " : "host ";
    out += std::to_string(i);
    out += " = ranks ";
    out += rankRuns(ranksOn(i));
  }
  return out;
}

Topology Topology::exchange(Store& store, const std::string& keyPrefix, int rank, int size) {
  const std::string mine = hostIdentity();
  store.set(keyPrefix + "/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  Topology t;
  std::map<std::string, int> index;
  const auto all = getFromEveryRank(store, keyPrefix, size);
  for (int r = 0; r < size; ++r) {
    const std::string id = r == rank ? mine : stringOf(all[size_t(r)]);
    t.hostOf.push_back(index.emplace(id, int(index.size())).first->second);
  }
  return t;
}

Topology Topology::subset(const std::vector<int>& ranks) const {
  Topology t;
  std::map<int, int> index;
  for (int r : ranks) t.hostOf.push_back(index.emplace(hostOf[size_t(r)], int(index.size())).first->second);
  return t;
}

}  // namespace ringx
