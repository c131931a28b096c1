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

// Errors are copied across threads (the progress thread keeps the first one;
// every waiter gets a copy). std::runtime_error shares its message between
// copies through a reference count that ThreadSanitizer cannot see inside
// libstdc++, so the message lives in a string of our own, copied deeply.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what, std::vector<int> awaited = {})
      : std::runtime_error(""), what_(what), kind_(kind), awaited_(std::move(awaited)) {}
  const char* what() const noexcept override { return what_.c_str(); }
  ErrorKind kind() const { return kind_; }
  // Timeouts: the ranks the operation was still waiting on.
  const std::vector<int>& awaited() const { return awaited_; }

 private:
  std::string what_;
  ErrorKind kind_;
  std::vector<int> awaited_;
};

// What a rank hears when a peer's connection closed (it died, or left the
// group): ringx's words, then gloo's, which scripts and torchft's tests match.
inline std::string closedConnection(int peer) {
  return "connection to rank " + std::to_string(peer) + " closed (Connection closed by peer)";
}

}  // namespace ringx
