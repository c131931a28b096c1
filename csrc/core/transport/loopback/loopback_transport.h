// An in-process transport: every rank is a thread of one process and messages
// are copied between their memories. It lets Catch2 run whole collectives
// without UCX or Python, and can simulate a dead peer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/transport/transport.h"

namespace ringx {

namespace loopback {
class Fabric;
}

struct LoopbackWorld {
  std::vector<std::unique_ptr<Transport>> transports;  // one per rank
  std::shared_ptr<loopback::Fabric> fabric;

  // Makes every rank see `rank` as dead: pending and later transfers with it
  // fail with ErrorKind::PeerClosed, as when a process is killed.
  void kill(int rank) const;
};

// A send of `rendezvousBytes` or more that finds no receive posted completes
// only once one takes it, as UCX's rendezvous protocol does for large
// messages; smaller ones complete at once (eager).
LoopbackWorld makeLoopbackWorld(int size, size_t rendezvousBytes = SIZE_MAX);

}  // namespace ringx
