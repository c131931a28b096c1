// The UCX (UCP tag-matching) transport, as groups get it: a view of the
// process's one UCX worker (ucx_worker.h) on a tag channel of the group's own,
// over endpoints cached per peer process, so that a group among processes
// already connected makes no new ones. Worker addresses and channel proposals
// are exchanged through the Store in one round trip. Groups shrunk from it
// (Transport::subset) take further channels on the same worker.
#pragma once

#include <memory>
#include <string>

#include "core/common/store.h"
#include "core/transport/transport.h"

namespace ringx {

struct UcxOptions {
  std::string tls;  // UCX_TLS value; empty keeps UCX's own choice
  std::string keyPrefix = "ringx/ucx";
};

// Collective over the ranks: every rank must call it with the same store.
std::unique_ptr<Transport> makeUcxTransport(Store& store, int rank, int size, const UcxOptions& opts);

}  // namespace ringx
