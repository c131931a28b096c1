// What this host lets ranks share, for bug reports (python -m ringx): POSIX
// shared memory (the intra-host algorithms' slots) and cross-memory attach
// (process_vm_readv, a single copy out of a peer's memory).
#pragma once

#include <string>

namespace ringx {

struct HostCaps {
  bool shm = false;
  std::string shmDetail;  // where segments live and how much room is left, or why none works
  bool cma = false;
  std::string cmaDetail;  // the ptrace policy that decides whether peers may read each other
};

// Creates, maps and removes a small shared-memory segment, and reads this
// process's own memory through process_vm_readv.
HostCaps hostCaps();

}  // namespace ringx
