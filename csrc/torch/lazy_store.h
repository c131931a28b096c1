// A c10d store that connects on first use. A shrunk group is built without a
// store, but its later subgroups need one; connecting a client to the first
// survivor's store at shrink time cost each survivor tens of milliseconds on
// a loaded host, on the way to its first collective. Thread-safe; a failed
// connection is retried by the next call.
#pragma once

#include <functional>
#include <mutex>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ringx {

class LazyStore : public c10d::Store {
 public:
  using Connect = std::function<c10::intrusive_ptr<c10d::Store>()>;
  LazyStore(Connect connect, std::chrono::milliseconds timeout);

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& currentValue,
                                  const std::vector<uint8_t>& newValue) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override;
  bool hasExtendedApi() const override { return true; }
  void queuePush(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> queuePop(const std::string& key, bool block) override;
  int64_t queueLen(const std::string& key) override;
  std::vector<std::string> listKeys() override;
  void barrier(const std::string& key, int64_t worldSize,
               const std::chrono::milliseconds& timeout) override;

 private:
  c10d::Store& inner();

  Connect connect_;
  std::mutex mu_;
  c10::intrusive_ptr<c10d::Store> inner_;
};

}  // namespace ringx
