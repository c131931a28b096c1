// The one exception type core throws; the torch layer maps kinds to Python types.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ringx {

enum class ErrorKind {
  InvalidArgument,  // misuse: becomes ValueError
  Unsupported,      // op/dtype pair not offered: becomes TypeError
  Timeout,          // "Timed out ..."
  PeerClosed,       // a peer's connection "closed"
  Aborted,          // the communicator was aborted or shut down
  Internal,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what, std::vector<int> awaited = {})
      : std::runtime_error(what), kind_(kind), awaited_(std::move(awaited)) {}
  ErrorKind kind() const { return kind_; }
  // Timeouts: the ranks the operation was still waiting on.
  const std::vector<int>& awaited() const { return awaited_; }

 private:
  ErrorKind kind_;
  std::vector<int> awaited_;
};

}  // namespace ringx
