// What the UCX library in use is and offers, for bug reports (python -m ringx).
#pragma once

#include <string>
#include <vector>

namespace ringx {

struct UcxInfo {
  std::string version;                  // ucp_get_version_string()
  std::string library;                  // path of the libucp this process loaded
  std::vector<std::string> transports;  // "tl/device" of every UCT resource, e.g. "tcp/eth0"
  std::string error;                    // what failed while listing them, if anything
};

// Opens every UCT memory domain and lists its transports, as ucx_info -d does.
UcxInfo ucxInfo();

}  // namespace ringx
