// The survivors' exchange of a shrink: each survivor sends one message to
// every other survivor and receives one from each, straight over the
// transport the shrunk group's parent handed over (Communicator::release),
// with no engine and no store. The parent may be poisoned by the death that
// caused the shrink; the exchange ignores that and fails only for what
// concerns the survivors: one of them closed its connection, the deadline
// passed, or `check` rejected a message.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/transport/transport.h"

namespace ringx {

// The tag space of the exchange: point-to-point's top bit plus a bit that no
// point-to-point tag sets (those carry 32 bits of user tag). The low bits
// number the attempts on one parent, so that a retried shrink never takes a
// message of a failed one.
inline constexpr uint64_t kShrinkTagBase = (uint64_t{1} << 63) | (uint64_t{1} << 47);

// Returns each peer's message, by peer. `mine` also goes to each rank of
// `alsoTell`, without waiting for it to arrive (those may be dead): ranks
// that disagree on who the survivors are still hear from each other, and
// each can name the lists. `check(peer, message)` runs on each
// message as it arrives and may throw to end the exchange early (a rank that
// disagrees need not wait for the others). Throws Error: PeerClosed naming
// the peer, or Timeout naming those not heard from. Messages longer than
// `maxBytes` fail.
std::map<int, std::vector<uint8_t>> exchangeAmong(
    Transport& transport, const std::vector<int>& peers, const std::vector<int>& alsoTell, uint64_t tag,
    const std::vector<uint8_t>& mine, size_t maxBytes, std::chrono::steady_clock::time_point deadline,
    const std::function<void(int peer, const std::vector<uint8_t>& message)>& check);

}  // namespace ringx
