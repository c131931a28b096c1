// core's Store interface over a c10d::Store (already prefixed per group).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "core/common/store.h"

namespace ringx {

class C10dStoreAdapter final : public Store {
 public:
  explicit C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_->set(key, value); }
  std::vector<uint8_t> get(const std::string& key) override { return store_->get(key); }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  // Two round trips for any number of keys (torch's stores wait on many keys
  // at once and read them in one multiGet), instead of one per key.
  std::vector<std::vector<uint8_t>> getAll(const std::vector<std::string>& keys) override {
    store_->wait(keys);
    return store_->multiGet(keys);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace ringx
