// The UCX (UCP tag-matching) transport: one context and worker per
// communicator, worker addresses exchanged through the Store, one endpoint per
// peer with peer-failure handling, and the worker's event fd for sleeping.
// Groups shrunk from it share the worker and endpoints (Transport::subset),
// each on a channel of its own; the worker goes with the last of them.
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
