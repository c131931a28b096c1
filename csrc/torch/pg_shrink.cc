// ProcessGroup shrink (torch's dist.shrink_group): a new ringx group over the
// survivors, built without the group's store, which may have died with an
// excluded rank (an init_method=tcp:// store lives in rank 0's process).
//
// The parent's communicator stops and hands its transport over
// (Communicator::release), and each survivor restarts its chunk counters in
// the parent's shared-memory areas. Over those connections the survivors
// exchange one message each (core/engine/shrink_exchange.h): the ranks each
// excludes, which must agree, the channel each proposes for the child's
// messages, and from the first survivor the port of a store it has just
// started for the child's later subgroups and the addresses it may be
// reached at. The child group is then the parent re-indexed: a subset of its
// transport on the largest channel proposed (so no message the parent's ops
// left in flight can match one of the child's), the survivors' part of its
// shared-memory areas and CMA probes, and its settings, which the ranks
// agreed on when it was built. Nothing waits on a store.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/common/log.h"
#include "core/engine/shrink_exchange.h"
#include "torch/lazy_store.h"
#include "torch/process_group_ringx.hpp"
#include "torch/without_gil.h"

namespace ringx {

namespace {

// torch's SHRINK_DEFAULT and SHRINK_ABORT.
constexpr int kShrinkDefault = 0;
constexpr int kShrinkAbort = 1;

// One survivor's message: the ranks it excludes, the channel it proposes,
// then (from the first survivor only) its store's port and addresses.
struct ShrinkCard {
  std::vector<int64_t> excluded;
  uint32_t channel = 0;
  uint16_t port = 0;
  std::vector<std::string> addresses;

  std::vector<uint8_t> encode() const {
    std::vector<uint8_t> out;
    auto put = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    uint32_t n = uint32_t(excluded.size());
    put(&n, sizeof(n));
    put(excluded.data(), excluded.size() * sizeof(int64_t));
    put(&channel, sizeof(channel));
    put(&port, sizeof(port));
    for (const std::string& a : addresses) {
      uint32_t len = uint32_t(a.size());
      put(&len, sizeof(len));
      put(a.data(), a.size());
    }
    return out;
  }

  static ShrinkCard decode(const std::vector<uint8_t>& in) {
    ShrinkCard c;
    size_t at = 0;
    auto take = [&](void* p, size_t n) {
      if (at + n > in.size()) throw Error(ErrorKind::Internal, "a malformed message in the survivors' exchange");
      std::memcpy(p, in.data() + at, n);
      at += n;
    };
    uint32_t n = 0;
    take(&n, sizeof(n));
    c.excluded.resize(n);
    take(c.excluded.data(), n * sizeof(int64_t));
    take(&c.channel, sizeof(c.channel));
    take(&c.port, sizeof(c.port));
    while (at < in.size()) {
      uint32_t len = 0;
      take(&len, sizeof(len));
      std::string a(len, '\0');
      take(a.data(), len);
      c.addresses.push_back(std::move(a));
    }
    return c;
  }
};

std::string listOf(const std::vector<int64_t>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// This host's IPv4 addresses other than loopback, where a survivor on
// another host may reach the store.
std::vector<std::string> hostAddresses() {
  std::vector<std::string> out;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) && std::string(text) != "127.0.0.1") {
      out.push_back(text);
    }
  }
  ::freeifaddrs(all);
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> ProcessGroupRingx::shrink(const std::vector<int64_t>& ranksToExclude, int flags,
                                                            const c10::intrusive_ptr<Options>& opts) {
  const std::string where = "ringx: shrink_group (rank " + std::to_string(rank_) + "): ";
  // Where a recovery's time goes, at INFO.
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto ms = [](Clock::time_point from) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - from).count();
  };
  auto valueError = [&](const std::string& what) {
    throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, where + what);
  };
  auto backendError = [&](const std::string& what) {
    throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, where + what);
  };
  if (flags != kShrinkDefault && flags != kShrinkAbort) {
    valueError("shrink_flags " + std::to_string(flags) + " is neither SHRINK_DEFAULT (0) nor SHRINK_ABORT (1)");
  }
  std::vector<int64_t> excluded = ranksToExclude;
  std::sort(excluded.begin(), excluded.end());
  if (excluded.empty()) valueError("ranks_to_exclude is empty");
  if (std::adjacent_find(excluded.begin(), excluded.end()) != excluded.end()) {
    valueError("ranks_to_exclude " + listOf(ranksToExclude) + " lists a rank twice");
  }
  if (excluded.front() < 0 || excluded.back() >= size_) {
    valueError("ranks_to_exclude " + listOf(ranksToExclude) + " has a rank outside the group of size " +
               std::to_string(size_));
  }
  if (std::binary_search(excluded.begin(), excluded.end(), int64_t(rank_))) {
    valueError("this rank is in ranks_to_exclude " + listOf(ranksToExclude) +
               "; only the ranks that stay call shrink_group");
  }
  std::vector<int> survivors;
  for (int r = 0; r < size_; ++r) {
    if (!std::binary_search(excluded.begin(), excluded.end(), int64_t(r))) survivors.push_back(r);
  }
  const int newRank = int(std::find(survivors.begin(), survivors.end(), rank_) - survivors.begin());
  const int newSize = int(survivors.size());
  const auto timeout = opts ? opts->timeout : timeout_.load();

  std::lock_guard<std::mutex> lock(shrinkMu_);
  if (shrunk_) {
    backendError("this group was shrunk already, and its connections serve the group that shrink_group returned "
                 "then; shrink that group instead");
  }
  if (!shrinkTransport_) {
    // A failed group's ops are failing already; a healthy one's would be cut.
    const int inFlight = comm_->opsInFlight();
    if (flags == kShrinkDefault && inFlight > 0 && !comm_->error()) {
      backendError(std::to_string(inFlight) +
                   " operation(s) still in flight on the group; wait for them, or pass "
                   "shrink_flags=SHRINK_ABORT to fail them and shrink at once");
    }
    withoutGil([&] {
      shrinkTransport_ = comm_->release(flags == kShrinkAbort ? "shrunk by shrink_group (SHRINK_ABORT)"
                                                              : "shrunk by shrink_group");
    });
    if (!shrinkTransport_) {
      backendError("the group was aborted or shut down before, which closed its connections; shrink a group "
                   "before aborting or destroying it");
    }
    for (ShmArea* area : {shm_.get(), hostShm_.get()}) {
      if (area) area->restart();
    }
  }
  const uint64_t tag = kShrinkTagBase + shrinkAttempts_++;

  c10::intrusive_ptr<c10d::Store> store;
  ShrinkCard mine{excluded, shrinkTransport_->nextChannel(), 0, {}};
  if (newSize == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else if (newRank == 0) {
    c10d::TCPStoreOptions so;
    so.port = 0;
    so.isServer = true;
    so.waitWorkers = false;
    so.timeout = timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    } catch (const std::exception& e) {
      backendError(std::string("starting the survivors' store failed: ") + e.what());
    }
    mine.port = static_cast<c10d::TCPStore&>(*store).getPort();
    mine.addresses = hostAddresses();
  }
  std::vector<int> peers;
  for (int r : survivors) {
    if (r != rank_) peers.push_back(r);
  }
  const std::vector<int> others(excluded.begin(), excluded.end());
  std::map<int, std::vector<uint8_t>> cards;
  const size_t maxBytes = 1024 + sizeof(int64_t) * size_ + 64 * 1024;
  try {
    withoutGil([&] {
      cards = exchangeAmong(*shrinkTransport_, peers, others, tag, mine.encode(), maxBytes,
                            std::chrono::steady_clock::now() + timeout,
                            [&](int peer, const std::vector<uint8_t>& m) {
                              ShrinkCard theirs = ShrinkCard::decode(m);
                              if (theirs.excluded != excluded) {
                                throw Error(ErrorKind::InvalidArgument,
                                            "the survivors disagree on ranks_to_exclude: this rank passed " +
                                                listOf(excluded) + ", rank " + std::to_string(peer) +
                                                " passed " + listOf(theirs.excluded) +
                                                "; every rank that stays must pass the same list");
                              }
                            });
    });
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::InvalidArgument) valueError(e.what());
    backendError(std::string("exchanging with the other survivors failed: ") + e.what());
  }
  const auto agreedMs = ms(start);
  const auto exchanged = Clock::now();
  // Every survivor sees every card, so all take the same channel, or all
  // find one that has none left.
  uint32_t channel = mine.channel;
  bool noChannel = mine.channel == 0;
  for (auto& [peer, card] : cards) {
    const uint32_t theirs = ShrinkCard::decode(card).channel;
    channel = std::max(channel, theirs);
    noChannel = noChannel || theirs == 0;
  }
  std::unique_ptr<Transport> transport = noChannel ? nullptr : shrinkTransport_->subset(survivors, channel);
  if (!transport) {
    backendError("the group's connections cannot serve another shrunk group (a " + shrinkTransport_->name() +
                 " transport of " + std::to_string(size_) + " ranks has no message channel left); create the "
                 "group anew on a store instead");
  }
  if (newRank != 0 && newSize > 1) {
    const int first = survivors[0];
    ShrinkCard theirs = ShrinkCard::decode(cards.at(first));
    std::vector<std::string> candidates;
    if (topology_.hostOf.at(size_t(first)) == topology_.hostOf.at(size_t(rank_))) candidates.push_back("127.0.0.1");
    candidates.insert(candidates.end(), theirs.addresses.begin(), theirs.addresses.end());
    const uint16_t port = theirs.port;
    // A connection that opens and closes unused (a bare TCP probe) made
    // torch's store server stop serving new clients now and then (seen at
    // world 8): each address is tried as a store client instead, briefly
    // unless it is the last.
    auto connect = [candidates, port, first, timeout, where]() -> c10::intrusive_ptr<c10d::Store> {
      std::string failures;
      for (size_t i = 0; i < candidates.size(); ++i) {
        c10d::TCPStoreOptions so;
        so.port = port;
        so.waitWorkers = false;
        so.timeout = i + 1 < candidates.size() ? std::min(timeout, std::chrono::milliseconds(2000)) : timeout;
        try {
          return c10::make_intrusive<c10d::TCPStore>(candidates[i], so);
        } catch (const c10::Error& e) {
          failures += "; " + candidates[i] + ": " + e.what_without_backtrace();
        }
      }
      throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)},
                                  where + "connecting to rank " + std::to_string(first) +
                                      "'s store for the shrunk group's subgroups (port " + std::to_string(port) +
                                      ") failed at every address it has" + failures);
    };
    store = c10::make_intrusive<LazyStore>(std::move(connect), timeout);
  }
  auto child = c10::make_intrusive<ProcessGroupRingx>(*this, std::move(transport), survivors, timeout);
  child->bootstrapStore_ = store;
  shrinkTransport_.reset();
  shrunk_ = true;
  RINGX_LOG(Info, where << "excluding " << listOf(excluded) << ", this rank is rank " << newRank << " of "
                        << newSize << " (message channel " << channel << "); the parent stopped and the survivors "
                        << "agreed in " << agreedMs << " ms, the group was created in " << ms(exchanged)
                        << " ms more");
  return child;
}

ProcessGroupRingx::ProcessGroupRingx(const ProcessGroupRingx& parent, std::unique_ptr<Transport> transport,
                                     const std::vector<int>& ranks, std::chrono::milliseconds timeout)
    : c10d::Backend(transport->rank(), transport->size()),
      topology_(parent.topology_.subset(ranks)),
      timeout_(timeout),
      segmentBytes_(parent.segmentBytes_),
      algo_(parent.algo_) {
  const auto start = std::chrono::steady_clock::now();
#ifdef RINGX_WITH_CUDA
  cudaPath_ = parent.cudaPath_;
  cudaIpcBytes_ = parent.cudaIpcBytes_;
  cudaStageBytes_ = parent.cudaStageBytes_;
  blockingWait_ = parent.blockingWait_;
  asyncTeardown_ = parent.asyncTeardown_;
  ipcGroupRefusal_ = parent.ipcGroupRefusal_;
  if (cudaPath_ == CudaPath::Ipc && ipcGroupRefusal_.empty()) {
    ipcGroupRefusal_ = "a group made by shrink_group has no store to exchange ipc handles through";
  }
#endif
  CommOptions copts = parent.comm_->options();
  copts.timeout = timeout;
  copts.bell = nullptr;
  // A parent's host area holds the ranks of this host by their local rank.
  auto local = [&](const std::vector<int>& childRanks) {
    std::vector<int> out;
    for (int c : childRanks) {
      const auto& on = parent.hostLayout_.local;
      out.push_back(int(std::find(on.begin(), on.end(), ranks[size_t(c)]) - on.begin()));
    }
    return out;
  };
  HostLayout layout = HostLayout::of(topology_, rank_);
  if (parent.shm_) {
    shm_ = parent.shm_->subset(ranks);
    if (shm_ && parent.cma_) cma_ = parent.cma_->subset(ranks);
  } else if (parent.hostShm_ && topology_.singleHost()) {
    std::vector<int> everyone(ranks.size());
    for (size_t c = 0; c < ranks.size(); ++c) everyone[c] = int(c);
    shm_ = parent.hostShm_->subset(local(everyone));
  } else if (parent.hostLayout_.hosts && layout.hosts) {
    // The parent's ranks all agreed to take the hierarchical algorithms, so
    // the survivors all do too: on the parent's chunk size, which fits every
    // survivor's slot, and with no area on a host a death left one rank on.
    if (layout.localSize() > 1) {
      hostShm_ = parent.hostShm_->subset(local(layout.local));
      hostShm_->setGroupRanks(layout.local);
      layout.shm = hostShm_.get();
    }
    layout.chunkBytes = parent.hostLayout_.chunkBytes;
    hostLayout_ = std::move(layout);
  }
  if (shm_) copts.bell = shm_->bell();
  if (hostShm_) copts.bell = hostShm_->bell();
  comm_ = std::make_shared<Communicator>(std::move(transport), copts);
  std::ostringstream took;
  took << "from the parent's connections and shared memory " << std::fixed << std::setprecision(1)
       << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() << " ms";
  logUp(took.str());
}

}  // namespace ringx
