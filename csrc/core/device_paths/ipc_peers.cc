#include "core/device_paths/ipc_peers.h"

#include <cstring>
#include <utility>

#include "core/common/error.h"

namespace ringx {

namespace {

constexpr size_t kLine = 64;

// Control segment lines: the mailboxes (kPhases x size), then per identity
// slot its published seq, its record and this rank's checked seq.
size_t controlLines(int size) { return size_t(IpcPeers::kPhases) * size_t(size) + 3 * IpcPeers::kIdentitySlots; }

std::string handleBytes(const IpcHandle& h) { return std::string(h.bytes.data(), h.bytes.size()); }

}  // namespace

std::unique_ptr<IpcPeers> IpcPeers::create(Device& device, Store& store, const std::string& keyPrefix, int rank,
                                           int size, size_t bufferBytes) {
  const std::string who = "ipc path (rank " + std::to_string(rank) + ")";
  if (size < 1 || size > flags::kMaxFlags + 1) {
    throw Error(ErrorKind::InvalidArgument, "ringx: " + who + ": a group of " + std::to_string(size) +
                                                " ranks; the ipc path takes at most " +
                                                std::to_string(flags::kMaxFlags + 1) + " ranks on one host");
  }
  std::unique_ptr<IpcPeers> peers(new IpcPeers(device, rank, size, bufferBytes));
  OnDevice on(&device);
  const size_t controlBytes = controlLines(size) * kLine;
  IpcHandle mine;
  auto buffer = device.allocShared(bufferBytes, mine);
  auto control = ShmSegment::create(controlBytes, who + " control segment");
  std::memset(control->data(), 0, controlBytes);
  store.set(keyPrefix + "/ipc/" + std::to_string(rank), bytesOf(handleBytes(mine) + control->name()));

  for (int q = 0; q < size; ++q) {
    if (q == rank) {
      peers->buffers_.push_back(buffer);
      peers->control_.push_back(std::move(control));
    } else {
      const std::string got = stringOf(store.get(keyPrefix + "/ipc/" + std::to_string(q)));
      IpcHandle theirs;
      if (got.size() <= theirs.bytes.size()) {
        throw Error(ErrorKind::Internal, "ringx: " + who + ": rank " + std::to_string(q) +
                                             " published a malformed ipc record; are all ranks running the same "
                                             "ringx build?");
      }
      std::memcpy(theirs.bytes.data(), got.data(), theirs.bytes.size());
      peers->buffers_.push_back(device.openShared(theirs, bufferBytes));
      peers->control_.push_back(
          ShmSegment::open(got.substr(theirs.bytes.size()), controlBytes, who + " rank " + std::to_string(q)));
    }
    peers->registered_.push_back(device.mapHost(peers->control_.back()->data(), controlBytes));
  }
  // Every rank has mapped every segment: the names may go.
  store.set(keyPrefix + "/ipc-mapped/" + std::to_string(rank), bytesOf("1"));
  for (int q = 0; q < size; ++q) store.get(keyPrefix + "/ipc-mapped/" + std::to_string(q));
  peers->control_[size_t(rank)]->unlinkName();
  return peers;
}

IpcPeers::~IpcPeers() {
  OnDevice on(&device_);
  registered_.clear();
  buffers_.clear();
}

std::byte* IpcPeers::line(int q, size_t index) const { return control_[size_t(q)]->data() + index * kLine; }

uint32_t* IpcPeers::mailbox(int owner, Phase phase, int writer) const {
  return reinterpret_cast<uint32_t*>(line(owner, size_t(phase) * size_t(size_) + size_t(writer)));
}

std::vector<const uint32_t*> IpcPeers::inbox(Phase phase) const {
  std::vector<const uint32_t*> words;
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) words.push_back(mailbox(rank_, phase, q));
  }
  return words;
}

std::vector<uint32_t*> IpcPeers::outbox(Phase phase) const {
  std::vector<uint32_t*> words;
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) words.push_back(mailbox(q, phase, rank_));
  }
  return words;
}

std::atomic<uint64_t>& IpcPeers::published(int q, int slot) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(line(q, size_t(kPhases) * size_t(size_) + 3 * size_t(slot)));
}

CollIdentity& IpcPeers::identity(int q, int slot) const {
  return *reinterpret_cast<CollIdentity*>(line(q, size_t(kPhases) * size_t(size_) + 3 * size_t(slot) + 1));
}

std::atomic<uint64_t>& IpcPeers::checked(int q, int slot) const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(line(q, size_t(kPhases) * size_t(size_) + 3 * size_t(slot) + 2));
}

uint32_t IpcPeers::reserveRounds(uint32_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n > flags::kMaxRound - lastRound_) {
    throw Error(ErrorKind::Internal, "ringx: ipc path (rank " + std::to_string(rank_) +
                                         "): this group has used up its 2^31 flag rounds; create a new group");
  }
  const uint32_t first = lastRound_ + 1;
  lastRound_ += n;
  return first;
}

uint64_t IpcPeers::claimSlot(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(lastInSlot_[seq % kIdentitySlots], seq);
}

void IpcPeers::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_) failure_ = why;
}

std::optional<std::string> IpcPeers::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

}  // namespace ringx
