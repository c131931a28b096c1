#include "core/transport/shm/shm_area.h"

#include <sched.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <vector>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/topology.h"
#include "core/common/types.h"

namespace ringx {

namespace {

// Control block: the counter in the first cache line, the two slot headers
// in the second, the released chunk in the third, the rank's doorbell in the
// fourth; then the two data slots, then the eager slots (their headers in
// the control block).
constexpr size_t kControlBytes = 4096;
constexpr size_t kHeadersOffset = 64;
constexpr size_t kReleasedOffset = 128;
constexpr size_t kBellOffset = 192;
static_assert(kHeadersOffset + 2 * sizeof(ShmArea::SlotHeader) <= kReleasedOffset);
static_assert(kBellOffset + sizeof(BellWord) <= 256);
// The op records, clear of the lines above.
constexpr size_t kOpRecordsOffset = 1024;
static_assert(kOpRecordsOffset + 2 * ShmArea::kOpRecordBytes <= 2048);
constexpr size_t kEagerHeadersOffset = 2048;
static_assert(kEagerHeadersOffset + ShmArea::kEagerSlots * sizeof(ShmArea::SlotHeader) <= kControlBytes);
constexpr size_t kMostEagerBytes = 4096;

size_t eagerBytesFor(size_t slotBytes) { return std::min(kMostEagerBytes, slotBytes); }

size_t segmentBytes(size_t slotBytes) {
  return kControlBytes + 2 * slotBytes + ShmArea::kEagerSlots * eagerBytesFor(slotBytes);
}

// The CPUs this process may run on, as a comma-separated list.
std::string allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return "";
  std::string list;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    if (!list.empty()) list += ',';
    list += std::to_string(c);
  }
  return list;
}

}  // namespace

std::unique_ptr<ShmArea> ShmArea::create(Store& store, const std::string& keyPrefix, int rank, int size,
                                         size_t slotBytes) {
  const std::string host = shmDomain();
  store.set(keyPrefix + "/host/" + std::to_string(rank), bytesOf(host));
  // The slot size, then the CPUs this rank may use.
  const std::string slotAndCpus = std::to_string(slotBytes) + " " + allowedCpus();
  store.set(keyPrefix + "/slot/" + std::to_string(rank), bytesOf(slotAndCpus));
  const auto hosts = getFromEveryRank(store, keyPrefix + "/host", size);
  bool local = true;
  for (int p = 0; p < size; ++p) {
    if (p != rank && stringOf(hosts[size_t(p)]) != host) local = false;
  }
  // Every rank reaches the same verdict from the same keys.
  if (!local || size < 2) return nullptr;
  // Every rank maps every peer's segment at its own slot size, and a peer's
  // segment shorter than the mapping ends in SIGBUS. An explicit
  // RINGX_SHM_BYTES is compared at group creation, but its default, one
  // core's L2, may differ between ranks (a hybrid CPU's two kinds of core, a
  // rank under valgrind, which reports its own cache sizes): all take the
  // smallest.
  size_t agreed = slotBytes;
  std::set<int> cpus;
  const auto slots = getFromEveryRank(store, keyPrefix + "/slot", size);
  for (int p = 0; p < size; ++p) {
    std::istringstream in(stringOf(slots[size_t(p)]));
    size_t theirs = 0;
    in >> theirs;
    agreed = std::min(agreed, theirs);
    for (std::string cpu; std::getline(in >> std::ws, cpu, ',');) cpus.insert(std::stoi(cpu));
  }
  if (agreed != slotBytes) {
    RINGX_LOG(Info, "ringx: shared memory (rank " << rank << "): the ranks asked for different slot sizes "
                        "(RINGX_SHM_BYTES defaults to a quarter of one core's L2, which differs between them); all use "
                        "the smallest, "
                        << agreed << " bytes, instead of this rank's " << slotBytes);
  }
  slotBytes = agreed;

  std::unique_ptr<ShmArea> area(new ShmArea(rank, size, slotBytes));
  area->cores_ = std::max<int>(1, int(cpus.size()));
  const size_t mapBytes = segmentBytes(slotBytes);
  const std::string self = "shared memory (rank " + std::to_string(rank) + ")";
  // A rank publishes its segment's name, or "!" and why it has none, so that
  // a rank that cannot claim its pages (a full /dev/shm: a container's
  // 64 MiB) makes all go without shared memory alike.
  std::unique_ptr<ShmSegment> own;
  std::string mine;
  try {
    own = ShmSegment::create(mapBytes, self);
    mine = own->name();
  } catch (const Error& e) {
    mine = "!" + std::string(e.what());
  }
  store.set(keyPrefix + "/shm/" + std::to_string(rank), bytesOf(mine));
  auto names = std::vector<std::string>(size_t(size));
  const auto published = getFromEveryRank(store, keyPrefix + "/shm", size);
  std::string why;
  for (int p = 0; p < size; ++p) {
    names[size_t(p)] = p == rank ? mine : stringOf(published[size_t(p)]);
    if (why.empty() && names[size_t(p)].starts_with("!")) {
      why = "rank " + std::to_string(p) + " could not reserve " + std::to_string(mapBytes) +
            " bytes in /dev/shm (" + names[size_t(p)].substr(1) + ")";
    }
  }
  if (!why.empty()) {
    RINGX_LOG(Warn, "ringx: shared memory (rank "
                        << rank << "): " << why
                        << ", so this group's ranks on this host go without shared memory: slower collectives "
                           "over UCX, and no single copy. Give /dev/shm more room (docker run --shm-size, a "
                           "memory-backed emptyDir on Kubernetes), or set RINGX_SHM=0 to choose this without "
                           "the warning.");
    return nullptr;
  }

  // Until every rank has mapped every segment, this rank's name stays in
  // /dev/shm; if creation fails first, its segment removes it as it goes.
  area->segments_ = std::make_shared<Segments>(size_t(size));
  auto& segments = *area->segments_;
  std::vector<std::byte*> maps(segments.size());
  for (int p = 0; p < size; ++p) {
    segments[size_t(p)] =
        p == rank ? std::move(own)
                  : ShmSegment::open(names[size_t(p)], mapBytes, self + ", rank " + std::to_string(p) + "'s segment");
    maps[size_t(p)] = segments[size_t(p)]->data();
  }
  area->place(maps);
  // The last to map says so; the others wait for that key (bounded by the
  // store's timeout) instead of polling the count. Then the name can go:
  // nothing is left in /dev/shm even if a process dies later.
  if (store.add(keyPrefix + "/shm-mapped", 1) == size) store.set(keyPrefix + "/shm-all-mapped", {1});
  store.get(keyPrefix + "/shm-all-mapped");
  segments[size_t(rank)]->unlinkName();
  return area;
}

size_t ShmArea::eagerBytes() const { return eagerBytesFor(slotBytes_); }

void ShmArea::place(std::vector<std::byte*> maps) {
  maps_ = std::move(maps);
  std::vector<BellWord*> bells;
  for (std::byte* base : maps_) {
    counters_.push_back(reinterpret_cast<std::atomic<uint64_t>*>(base));
    headers_.push_back(reinterpret_cast<SlotHeader*>(base + kHeadersOffset));
    released_.push_back(reinterpret_cast<std::atomic<uint64_t>*>(base + kReleasedOffset));
    data_.push_back(base + kControlBytes);
    eagerHeaders_.push_back(reinterpret_cast<SlotHeader*>(base + kEagerHeadersOffset));
    eager_.push_back(base + kControlBytes + 2 * slotBytes_);
    bells.push_back(reinterpret_cast<BellWord*>(base + kBellOffset));
  }
  bell_ = std::make_unique<FutexBell>(std::move(bells), rank_);
}

std::unique_ptr<ShmArea> ShmArea::subset(const std::vector<int>& ranks) const {
  if (ranks.size() < 2) return nullptr;
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  std::unique_ptr<ShmArea> area(new ShmArea(int(me - ranks.begin()), int(ranks.size()), slotBytes_));
  area->segments_ = segments_;
  // A shrink exchanges no affinity masks: the parent's union of them stands
  // for the survivors'.
  area->cores_ = cores_;
  std::vector<std::byte*> maps;
  for (int r : ranks) maps.push_back(maps_[size_t(r)]);
  area->place(std::move(maps));
  return area;
}

void ShmArea::restart() const {
  counter(rank_).store(0, std::memory_order_release);
  released(rank_).store(0, std::memory_order_release);
}

ShmArea::~ShmArea() = default;

std::byte* ShmArea::opRecord(int rank, int which) const {
  return maps_[rank] + kOpRecordsOffset + size_t(which) * kOpRecordBytes;
}

bool ShmArea::allReached(uint64_t value) const {
  for (int p = 0; p < size_; ++p) {
    if (counters_[p]->load(std::memory_order_acquire) < value) return false;
  }
  return true;
}

std::vector<int> ShmArea::behind(uint64_t value) const {
  std::vector<int> ranks;
  for (int p = 0; p < size_; ++p) {
    if (counters_[p]->load(std::memory_order_acquire) < value) ranks.push_back(groupRank(p));
  }
  return ranks;
}

bool ShmArea::slotFree(uint64_t id, uint64_t depth) const {
  if (id <= depth) return true;
  for (int p = 0; p < size_; ++p) {
    if (released_[p]->load(std::memory_order_acquire) < id - depth) return false;
  }
  return true;
}

std::vector<int> ShmArea::holdingSlot(uint64_t id, uint64_t depth) const {
  std::vector<int> ranks;
  for (int p = 0; p < size_ && id > depth; ++p) {
    if (released_[p]->load(std::memory_order_acquire) < id - depth) ranks.push_back(groupRank(p));
  }
  return ranks;
}

void ShmArea::checkSameOp(int which, const SlotHeader& mine) const {
  for (int q = 0; q < size_; ++q) checkSameOp(q, which, mine);
}

namespace {

// `theirs` by value: a copy of what a peer may rewrite, compared and reported alike.
void checkSame(ShmArea::SlotHeader theirs, const ShmArea::SlotHeader& mine, int theirGroupRank) {
  if (theirs != mine) throw Error(ErrorKind::InvalidArgument, mismatch(mine, theirs, theirGroupRank));
}

}  // namespace

void ShmArea::checkSameOp(int rank, int which, const SlotHeader& mine) const {
  checkSame(header(rank, which), mine, groupRank(rank));
}

void ShmArea::checkSameEagerOp(int rank, uint64_t id, const SlotHeader& mine) const {
  checkSame(eagerHeader(rank, id), mine, groupRank(rank));
}

}  // namespace ringx
