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
};

// ringx keeps strings in the store.
inline std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string stringOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

}  // namespace ringx
