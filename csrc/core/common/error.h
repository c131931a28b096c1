// The one exception type core throws; the torch layer maps kinds to Python types.
#pragma once

#include <stdexcept>
#include <string>

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
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace ringx
