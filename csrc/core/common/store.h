// The key-value store core bootstraps through. The torch layer adapts c10d::Store
// (already prefixed per process group); tests use an in-memory one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringx {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Blocks until the key exists (bounded by the store's own timeout).
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // get() of each key, once all exist. A store that can fetch many keys in
  // one round trip says so here: group creation reads one key of every rank
  // per phase, and on a shared store server those round trips, not the
  // work, set how long creating a group of many ranks takes.
  virtual std::vector<std::vector<uint8_t>> getAll(const std::vector<std::string>& keys) {
    std::vector<std::vector<uint8_t>> out;
    for (const std::string& k : keys) out.push_back(get(k));
    return out;
  }
};

// Every rank's value of a key published as `keyPrefix`/rank, by rank.
inline std::vector<std::vector<uint8_t>> getFromEveryRank(Store& store, const std::string& keyPrefix, int size) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(keyPrefix + "/" + std::to_string(r));
  return store.getAll(keys);
}

// ringx keeps strings in the store.
inline std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string stringOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// Called by every rank of a group before each raises the same error at its
// creation, once it has read what it needs from the store. Rank 0 usually
// hosts the store (torch's env:// rendezvous), and its process may end with
// the error: it waits until every other rank has made its last store call,
// which would otherwise fail with a closed connection instead of the error.
inline void leaveStoreTogether(Store& store, const std::string& key, int rank, int size) {
  if (rank != 0) {
    store.set(key + "/" + std::to_string(rank), bytesOf("1"));
    return;
  }
  for (int r = 1; r < size; ++r) store.get(key + "/" + std::to_string(r));
}

}  // namespace ringx
