#include "core/engine/shrink_exchange.h"

#include <poll.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <string>

namespace ringx {

namespace {

using Clock = std::chrono::steady_clock;

// Outlives the exchange: the transport may run a callback after it returned
// (a cancelled receive completes in a later progress()).
struct State {
  std::vector<uint8_t> mine;
  std::map<int, std::vector<uint8_t>> inbox;  // receive buffers, then the messages
  std::map<int, TransferId> recvs;             // still pending
  std::map<int, TransferResult> failed;        // a receive that failed
  int sendsLeft = 0;
  std::string sendError;
  std::vector<int> arrived;  // in order, for check()
};

std::string listOf(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Progresses the transport once; sleeps on its event fd for at most 1 ms
// when nothing moved, so that ranks sharing cores do not starve each other.
void step(Transport& t) {
  if (t.progress()) return;
  if (!t.arm()) return;
  pollfd p{t.eventFd(), POLLIN, 0};
  ::poll(&p, 1, 1);
}

}  // namespace

std::map<int, std::vector<uint8_t>> exchangeAmong(
    Transport& transport, const std::vector<int>& peers, const std::vector<int>& alsoTell, uint64_t tag,
    const std::vector<uint8_t>& mine, size_t maxBytes, Clock::time_point deadline,
    const std::function<void(int peer, const std::vector<uint8_t>& message)>& check) {
  auto st = std::make_shared<State>();
  st->mine = mine;
  for (int p : peers) {
    auto& buf = st->inbox[p];
    buf.resize(maxBytes);
    st->recvs[p] = transport.irecv(p, tag, buf.data(), buf.size(), MemoryKind::Host,
                                   [st, p](const TransferResult& r) {
                                     st->recvs.erase(p);
                                     if (!r.ok) {
                                       st->failed[p] = r;
                                       return;
                                     }
                                     st->inbox[p].resize(r.bytes);
                                     st->arrived.push_back(p);
                                   });
  }
  for (int p : peers) {
    ++st->sendsLeft;
    transport.isend(p, tag, st->mine.data(), st->mine.size(), MemoryKind::Host, [st, p](const TransferResult& r) {
      --st->sendsLeft;
      if (!r.ok && st->sendError.empty()) st->sendError = "sending to rank " + std::to_string(p) + ": " + r.error;
    });
  }
  for (int p : alsoTell) {
    transport.isend(p, tag, st->mine.data(), st->mine.size(), MemoryKind::Host, [st](const TransferResult&) {});
  }
  auto cancelRecvs = [&] {
    std::vector<TransferId> ids;
    for (auto& [p, id] : st->recvs) ids.push_back(id);
    for (TransferId id : ids) transport.cancel(id);
  };
  // What this rank sent must reach the others even when it stops early: a
  // survivor that disagrees tells the others so, instead of leaving them to
  // time out.
  auto flushSends = [&] {
    while (st->sendsLeft > 0 && Clock::now() < deadline) step(transport);
  };
  size_t checked = 0;
  auto nextPeerCheck = Clock::now();
  for (;;) {
    try {
      for (; checked < st->arrived.size(); ++checked) check(st->arrived[checked], st->inbox[st->arrived[checked]]);
    } catch (...) {
      cancelRecvs();
      flushSends();
      throw;
    }
    if (!st->failed.empty()) {
      auto& [p, r] = *st->failed.begin();
      cancelRecvs();
      if (r.errorKind == ErrorKind::PeerClosed) {
        throw Error(ErrorKind::PeerClosed, "rank " + std::to_string(p) + " closed its connection (" + r.error + ")",
                    {p});
      }
      throw Error(r.errorKind, "receiving from rank " + std::to_string(p) + " failed: " + r.error, {p});
    }
    if (!st->sendError.empty()) {
      cancelRecvs();
      throw Error(ErrorKind::PeerClosed, st->sendError);
    }
    if (st->recvs.empty() && st->sendsLeft == 0) break;
    const auto now = Clock::now();
    if (now >= deadline) {
      std::vector<int> missing;
      for (auto& [p, id] : st->recvs) missing.push_back(p);
      cancelRecvs();
      if (missing.empty()) throw Error(ErrorKind::Timeout, "Timed out sending to the other survivors", {});
      throw Error(ErrorKind::Timeout, "Timed out waiting for rank(s) " + listOf(missing), missing);
    }
    // A peer on this host that died gives UCX no signal: the transport asks
    // its pid (as the engine does while ops are pending), and its next
    // progress() fails the receive from it.
    if (now >= nextPeerCheck) {
      transport.checkPeers();
      nextPeerCheck = now + std::chrono::milliseconds(20);
    }
    step(transport);
  }
  std::map<int, std::vector<uint8_t>> out;
  for (int p : peers) out[p] = std::move(st->inbox[p]);
  return out;
}

}  // namespace ringx
