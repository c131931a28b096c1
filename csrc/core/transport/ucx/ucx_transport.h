// The UCX (UCP tag-matching) transport, as groups get it: a view of the
// process's one UCX worker (ucx_worker.h) on a tag channel of the group's own,
// over endpoints cached per peer process, so that a group among processes
// already connected makes no new ones. Worker addresses and channel proposals
// are exchanged through the Store in one round trip. Groups shrunk from it
// (Transport::subset) take further channels on the same worker.
#pragma once

#include <strings.h>

#include <memory>
#include <string>
#include <string_view>

#include "core/common/store.h"
#include "core/transport/transport.h"

namespace ringx {

struct UcxOptions {
  std::string tls;  // UCX_TLS value; empty keeps UCX's own choice
  std::string keyPrefix = "ringx/ucx";
};

// The UCX transports a group asks for: the user's (`ringxTls`, RINGX_TLS; or
// UCX_TLS, `ucxTls`, which UCX reads itself, so nothing is asked); else, for
// a group whose ranks all share this host's memory and see each other's
// processes (which UCX's shared-memory transports need), every transport but
// TCP.
// There UCX carries the data over its shared-memory ones (sysv + cma on the
// development VM) with or without TCP, which only costs start-up: its
// interfaces and an endpoint per peer took a world-32 group's creation from
// 0.24-0.31 s to 0.30-0.34 s on 2 cores (docs/benchmarks.md, 2026-11-30).
// UCX_UNIFIED_MODE on (`ucxUnified`: y, yes or 1, the values UCX reads as
// true) wants a network transport: with shared memory alone, even the
// endpoint to the process itself is unreachable, so there UCX keeps its own
// list too.
inline std::string ucxTransportsFor(const std::string& ringxTls, const char* ucxTls, bool oneHost,
                                    const char* ucxUnified = nullptr) {
  if (!ringxTls.empty() || ucxTls != nullptr) return ringxTls;
  if (ucxUnified != nullptr && (::strcasecmp(ucxUnified, "y") == 0 ||
                                ::strcasecmp(ucxUnified, "yes") == 0 ||
                                std::string_view(ucxUnified) == "1")) {
    return "";
  }
  return oneHost ? "^tcp" : "";
}

// Collective over the ranks: every rank must call it with the same store.
std::unique_ptr<Transport> makeUcxTransport(Store& store, int rank, int size, const UcxOptions& opts);

}  // namespace ringx
