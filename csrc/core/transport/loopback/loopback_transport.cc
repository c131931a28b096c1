#include "core/transport/loopback/loopback_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace ringx {

// Named, not anonymous: the header declares the fabric, which holds the rest.
namespace loopback {

struct PostedRecv {
  TransferId id;
  int peer;
  uint64_t tag;  // without source bits
  void* buf;
  size_t bytes;
  TransferCallback done;
};

struct Message {
  int source;
  uint64_t tag;
  std::vector<std::byte> data;
  // A rendezvous send's completion, run once a receive has taken the data.
  TransferCallback senderDone;
};

struct Completion {
  TransferCallback done;
  TransferResult result;
};

// One rank's inbox. Senders write into it under its lock; only the owning
// rank's progress thread runs the completions.
struct Mailbox {
  std::mutex mu;
  std::list<PostedRecv> posted;
  std::deque<Message> unexpected;
  std::deque<Completion> completions;
  int efd = -1;
  std::atomic<bool> dead{false};
};

bool matches(int wantPeer, uint64_t wantTag, int source, uint64_t tag) {
  return (wantPeer == kAnySource || wantPeer == source) && wantTag == tag;
}

TransferResult deliver(const Message& m, const PostedRecv& r) {
  TransferResult res;
  if (m.data.size() > r.bytes) {
    res.ok = false;
    res.errorKind = ErrorKind::InvalidArgument;
    res.error = "rank " + std::to_string(m.source) + " sent " + std::to_string(m.data.size()) +
                " bytes where " + std::to_string(r.bytes) + " were expected";
    return res;
  }
  if (!m.data.empty()) std::memcpy(r.buf, m.data.data(), m.data.size());
  res.bytes = m.data.size();
  res.source = m.source;
  return res;
}

void signal(int efd) {
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(efd, &one, sizeof(one));
}

class Fabric {
 public:
  Fabric(int size, size_t rendezvousBytes) : boxes(size), rendezvousBytes(rendezvousBytes) {
    for (auto& b : boxes) b.efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~Fabric() {
    for (auto& b : boxes) ::close(b.efd);
  }
  std::vector<Mailbox> boxes;
  const size_t rendezvousBytes;
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<Fabric> fabric, int rank, int size)
      : fabric_(std::move(fabric)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "loopback"; }

  TransferId isend(int peer, uint64_t tag, const void* buf, size_t bytes, MemoryKind,
                   TransferCallback done) override {
    TransferId id = nextId_++;
    Mailbox& dst = fabric_->boxes.at(peer);
    Message m{rank_, tag & kTagUserMask, {}, {}};
    m.data.resize(bytes);
    if (bytes) std::memcpy(m.data.data(), buf, bytes);
    bool delivered = false;
    bool waitsForReceive = false;
    {
      std::lock_guard<std::mutex> lock(dst.mu);
      if (!dst.dead) {
        delivered = true;
        auto it = dst.posted.begin();
        while (it != dst.posted.end() && !matches(it->peer, it->tag, m.source, m.tag)) ++it;
        if (it != dst.posted.end()) {
          dst.completions.push_back({std::move(it->done), deliver(m, *it)});
          dst.posted.erase(it);
        } else {
          waitsForReceive = bytes >= fabric_->rendezvousBytes;
          if (waitsForReceive) m.senderDone = std::move(done);
          dst.unexpected.push_back(std::move(m));
        }
      }
    }
    if (delivered) signal(dst.efd);
    if (waitsForReceive) return id;
    Mailbox& self = fabric_->boxes[rank_];
    {
      std::lock_guard<std::mutex> lock(self.mu);
      self.completions.push_back({std::move(done), delivered ? TransferResult{} : closedResult(peer)});
    }
    signal(self.efd);
    return id;
  }

  TransferId irecv(int peer, uint64_t tag, void* buf, size_t bytes, MemoryKind,
                   TransferCallback done) override {
    TransferId id = nextId_++;
    Mailbox& self = fabric_->boxes[rank_];
    PostedRecv r{id, peer, tag & kTagUserMask, buf, bytes, std::move(done)};
    int sender = -1;
    TransferCallback senderDone;
    {
      std::lock_guard<std::mutex> lock(self.mu);
      auto it = self.unexpected.begin();
      while (it != self.unexpected.end() && !matches(peer, r.tag, it->source, it->tag)) ++it;
      if (it == self.unexpected.end()) {
        if (peer != kAnySource && fabric_->boxes.at(peer).dead) {
          self.completions.push_back({std::move(r.done), closedResult(peer)});
        } else {
          self.posted.push_back(std::move(r));
        }
        return id;
      }
      self.completions.push_back({std::move(r.done), deliver(*it, r)});
      sender = it->source;
      senderDone = std::move(it->senderDone);
      self.unexpected.erase(it);
    }
    // Not under this mailbox's lock: two ranks receiving from each other
    // would take the two locks in opposite orders.
    if (senderDone) {
      Mailbox& box = fabric_->boxes[size_t(sender)];
      {
        std::lock_guard<std::mutex> lock(box.mu);
        box.completions.push_back({std::move(senderDone), TransferResult{}});
      }
      signal(box.efd);
    }
    return id;
  }

  void cancel(TransferId id) override {
    Mailbox& self = fabric_->boxes[rank_];
    std::lock_guard<std::mutex> lock(self.mu);
    for (auto it = self.posted.begin(); it != self.posted.end(); ++it) {
      if (it->id == id) {
        TransferResult r;
        r.ok = false;
        r.errorKind = ErrorKind::Aborted;
        r.error = "cancelled";
        self.completions.push_back({std::move(it->done), r});
        self.posted.erase(it);
        return;
      }
    }
  }

  bool progress() override {
    Mailbox& self = fabric_->boxes[rank_];
    std::deque<Completion> ready;
    {
      std::lock_guard<std::mutex> lock(self.mu);
      ready.swap(self.completions);
    }
    for (auto& c : ready) c.done(c.result);
    return !ready.empty();
  }

  int eventFd() const override { return fabric_->boxes[rank_].efd; }

  bool arm() override {
    uint64_t v;
    while (::read(eventFd(), &v, sizeof(v)) > 0) {
    }
    Mailbox& self = fabric_->boxes[rank_];
    std::lock_guard<std::mutex> lock(self.mu);
    return self.completions.empty();
  }

  void forgetPending() override {
    Mailbox& self = fabric_->boxes[rank_];
    std::lock_guard<std::mutex> lock(self.mu);
    self.posted.clear();
    self.completions.clear();
  }

  std::vector<int> failedPeers() const override {
    std::vector<int> peers;
    for (int r = 0; r < size_; ++r) {
      if (fabric_->boxes[r].dead) peers.push_back(r);
    }
    return peers;
  }

 private:
  std::shared_ptr<Fabric> fabric_;
  int rank_;
  int size_;
  TransferId nextId_ = 1;
};

}  // namespace loopback

LoopbackWorld makeLoopbackWorld(int size, size_t rendezvousBytes) {
  using namespace loopback;
  LoopbackWorld world;
  world.fabric = std::make_shared<Fabric>(size, rendezvousBytes);
  for (int r = 0; r < size; ++r) {
    world.transports.push_back(std::make_unique<LoopbackTransport>(world.fabric, r, size));
  }
  return world;
}

void LoopbackWorld::kill(int rank) const {
  using namespace loopback;
  Fabric& f = *fabric;
  f.boxes.at(rank).dead = true;
  for (int r = 0; r < int(f.boxes.size()); ++r) {
    if (r == rank) continue;
    Mailbox& box = f.boxes[r];
    {
      std::lock_guard<std::mutex> lock(box.mu);
      for (auto it = box.posted.begin(); it != box.posted.end();) {
        if (it->peer == rank) {
          box.completions.push_back({std::move(it->done), closedResult(rank)});
          it = box.posted.erase(it);
        } else {
          ++it;
        }
      }
    }
    signal(box.efd);
  }
}

}  // namespace ringx
