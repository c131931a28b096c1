#include "core/device_paths/ipc_peers.h"

#include <cstring>
#include <utility>
#include <vector>

#include "core/common/error.h"

namespace ringx {

namespace {

constexpr size_t kLine = 64;

// Control segment lines: the mailboxes (kPhases x size), then per identity
// slot its published seq, its record and this rank's checked seq.
size_t controlLines(int size) { return size_t(IpcPeers::kPhases) * size_t(size) + 3 * IpcPeers::kIdentitySlots; }

std::string handleBytes(const IpcHandle& h) { return std::string(h.bytes.data(), h.bytes.size()); }

// A rank's record under a set-up key is its first byte, then what it
// carries: kDone and what the stage publishes, or kFailed and why the stage
// failed there. A failure is published in place of the record, so the
// peers that wait for it raise at once rather than wait out the store's
// timeout.
constexpr char kDone = 'D', kFailed = 'F';

// Runs `stage` and publishes what it returns under key + rank, or, when it
// throws, why, before throwing on.
template <class Stage>
void publishing(Store& store, const std::string& key, int rank, Stage stage) {
  std::string record;
  try {
    record = kDone + stage();
  } catch (const std::exception& e) {
    store.set(key + std::to_string(rank), bytesOf(kFailed + std::string(e.what())));
    throw;
  }
  store.set(key + std::to_string(rank), bytesOf(record));
}

// Rank q's record under key + q, without its first byte; throws
// Error(Aborted) naming q and its reason when q failed there.
std::string readRecord(Store& store, const std::string& key, int q, const std::string& who) {
  const std::string got = stringOf(store.get(key + std::to_string(q)));
  if (!got.empty() && got.front() == kDone) return got.substr(1);
  throw Error(ErrorKind::Aborted, "ringx: " + who + ": rank " + std::to_string(q) +
                                      " failed to set up its ipc path: " +
                                      (got.empty() ? std::string("(no reason given)") : got.substr(1)));
}

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
  const std::string recordKey = keyPrefix + "/ipc/", mappedKey = keyPrefix + "/ipc-mapped/";
  IpcHandle mine;
  std::shared_ptr<std::byte> buffer;
  std::unique_ptr<ShmSegment> control;
  publishing(store, recordKey, rank, [&] {
    buffer = device.allocShared(bufferBytes, mine);
    control = ShmSegment::create(controlBytes, who + " control segment");
    std::memset(control->data(), 0, controlBytes);
    return handleBytes(mine) + control->name();
  });

  publishing(store, mappedKey, rank, [&] {
    // Every record before any mapping: a rank that failed is named as the
    // cause, not the segment of a peer that gave up on it and went.
    std::vector<std::string> records(static_cast<size_t>(size));
    for (int q = 0; q < size; ++q) {
      if (q != rank) records[size_t(q)] = readRecord(store, recordKey, q, who);
    }
    for (int q = 0; q < size; ++q) {
      if (q == rank) {
        peers->buffers_.push_back(buffer);
        peers->control_.push_back(std::move(control));
      } else {
        const std::string& got = records[size_t(q)];
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
    return std::string();
  });
  // Every rank has mapped every segment: the names may go.
  for (int q = 0; q < size; ++q) readRecord(store, mappedKey, q, who);
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
