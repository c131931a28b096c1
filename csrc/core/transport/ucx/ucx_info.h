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

// Whether the loaded UCX delivers memory events (its mmap and munmap hooks,
// which its registration caches rely on): 1 or 0, as UCX read UCX_MEM_EVENTS
// when it loaded; -1 where its libucm does not say.
int ucxMemoryEvents();

}  // namespace ringx
