#include "torch/lazy_store.h"

namespace ringx {

LazyStore::LazyStore(Connect connect, std::chrono::milliseconds timeout)
    : connect_(std::move(connect)) {
  timeout_ = timeout;
}

c10d::Store& LazyStore::inner() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!inner_) {
    inner_ = connect_();
    inner_->setTimeout(timeout_);
  }
  return *inner_;
}

// A clone shares the connection once there is one; until then it connects
// on its own first use, as torch's clones of a TCPStore do.
c10::intrusive_ptr<c10d::Store> LazyStore::clone() {
  std::lock_guard<std::mutex> lock(mu_);
  if (inner_) return inner_->clone();
  return c10::make_intrusive<LazyStore>(connect_, timeout_);
}

void LazyStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  inner().set(key, value);
}

std::vector<uint8_t> LazyStore::compareSet(const std::string& key,
                                           const std::vector<uint8_t>& currentValue,
                                           const std::vector<uint8_t>& newValue) {
  return inner().compareSet(key, currentValue, newValue);
}

std::vector<uint8_t> LazyStore::get(const std::string& key) { return inner().get(key); }

int64_t LazyStore::add(const std::string& key, int64_t value) { return inner().add(key, value); }

bool LazyStore::deleteKey(const std::string& key) { return inner().deleteKey(key); }

bool LazyStore::check(const std::vector<std::string>& keys) { return inner().check(keys); }

int64_t LazyStore::getNumKeys() { return inner().getNumKeys(); }

void LazyStore::wait(const std::vector<std::string>& keys) { inner().wait(keys); }

void LazyStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  inner().wait(keys, timeout);
}

void LazyStore::setTimeout(const std::chrono::milliseconds& timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_ = timeout;
  if (inner_) inner_->setTimeout(timeout);
}

void LazyStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  inner().append(key, value);
}

std::vector<std::vector<uint8_t>> LazyStore::multiGet(const std::vector<std::string>& keys) {
  return inner().multiGet(keys);
}

void LazyStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::vector<uint8_t>>& values) {
  inner().multiSet(keys, values);
}

void LazyStore::queuePush(const std::string& key, const std::vector<uint8_t>& value) {
  inner().queuePush(key, value);
}

std::vector<uint8_t> LazyStore::queuePop(const std::string& key, bool block) {
  return inner().queuePop(key, block);
}

int64_t LazyStore::queueLen(const std::string& key) { return inner().queueLen(key); }

std::vector<std::string> LazyStore::listKeys() { return inner().listKeys(); }

void LazyStore::barrier(const std::string& key, int64_t worldSize,
                        const std::chrono::milliseconds& timeout) {
  inner().barrier(key, worldSize, timeout);
}

}  // namespace ringx
