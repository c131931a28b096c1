#include "core/transport/shm/cma.h"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/settings.h"

namespace ringx {

namespace {

constexpr uint64_t kProbeMagic = 0x72696e6778636d61;  // "ringxcma"
constexpr size_t kPageBytes = 4096;

// The probe page's first words: what a peer must find there.
struct ProbeWords {
  uint64_t magic;
  uint64_t pid;
  uint64_t rank;
};

// Under Yama's ptrace_scope 1 only a process's ancestors may read it unless
// it names a ptracer; sibling ranks are not ancestors. MPI does the same.
// Scope 2 and 3 cannot be relaxed by the process: the probe then fails and
// says so.
void allowSiblingReaders() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (f >> scope && scope == 1) ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

// One process_vm_readv (or _writev) of everything left, continued after
// short transfers. Returns 0 or the errno of the call that failed.
int transferAll(bool write, pid_t pid, void* local, uint64_t remote, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec l{static_cast<std::byte*>(local) + done, bytes - done};
    iovec r{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t got = write ? ::process_vm_writev(pid, &l, 1, &r, 1, 0)
                              : ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got < 0 ? errno : EFAULT;
    done += size_t(got);
  }
  return 0;
}

}  // namespace

CmaMode cmaModeSetting() {
  std::string v = settingText("RINGX_CMA");
  for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (v == "auto") return CmaMode::Auto;
  if (v == "0") return CmaMode::Off;
  if (v == "1") return CmaMode::On;
  throw Error(ErrorKind::InvalidArgument, "ringx: RINGX_CMA='" + settingText("RINGX_CMA") +
                                              "' is not one of " + settingSpec("RINGX_CMA").values);
}

std::unique_ptr<Cma> Cma::create(Store& store, const std::string& keyPrefix, int rank, int size,
                                 CmaMode mode) {
  if (mode == CmaMode::Off) {
    RINGX_LOG(Info, "ringx: rank " << rank << ": single-copy (CMA) off: RINGX_CMA=0");
    return nullptr;
  }
  allowSiblingReaders();
  std::unique_ptr<Cma> cma(new Cma(rank, size));
  cma->probePage_ = std::shared_ptr<void>(std::aligned_alloc(kPageBytes, kPageBytes), std::free);
  if (!cma->probePage_) throw Error(ErrorKind::Internal, "ringx: single-copy probe: out of memory");
  std::memset(cma->probePage_.get(), 0, kPageBytes);
  const ProbeWords mine{kProbeMagic, uint64_t(::getpid()), uint64_t(rank)};
  std::memcpy(cma->probePage_.get(), &mine, sizeof(mine));

  const std::string me = std::to_string(::getpid()) + " " +
                         std::to_string(reinterpret_cast<uintptr_t>(cma->probePage_.get()));
  store.set(keyPrefix + "/cma/where/" + std::to_string(rank), bytesOf(me));
  const auto published = getFromEveryRank(store, keyPrefix + "/cma/where", size);
  for (int p = 0; p < size; ++p) {
    const std::string where = stringOf(published[size_t(p)]);
    unsigned long long pid = 0, addr = 0;
    if (std::sscanf(where.c_str(), "%llu %llu", &pid, &addr) != 2) {
      throw Error(ErrorKind::Internal, "ringx: single-copy probe: rank " + std::to_string(p) +
                                           " published '" + where + "', not a pid and an address");
    }
    cma->pids_[p] = pid_t(pid);
    cma->probes_[p] = addr;
  }

  std::string why;
  for (int p = 0; p < size && why.empty(); ++p) {
    if (p != rank) why = cma->probe(p);
  }
  store.set(keyPrefix + "/cma/verdict/" + std::to_string(rank), bytesOf(why));
  std::string off;
  const auto verdicts = getFromEveryRank(store, keyPrefix + "/cma/verdict", size);
  for (int p = 0; p < size && off.empty(); ++p) off = p == rank ? why : stringOf(verdicts[size_t(p)]);
  if (off.empty()) {
    RINGX_LOG(Info, "ringx: rank "
                        << rank
                        << ": single-copy (CMA) on: every rank can read every other's memory");
    return cma;
  }
  if (mode == CmaMode::On) {
    leaveStoreTogether(store, keyPrefix + "/cma/left", rank, size);
    throw Error(
        ErrorKind::InvalidArgument,
        "ringx: creating the process group (rank " + std::to_string(rank) +
            "): RINGX_CMA=1 but single-copy transfers are not possible in this group: " + off +
            ". Unset RINGX_CMA (or set it to auto) to use the shared-memory slots instead.");
  }
  RINGX_LOG(Info, "ringx: rank " << rank << ": single-copy (CMA) off: " << off);
  return nullptr;
}

Cma::~Cma() = default;

std::unique_ptr<Cma> Cma::subset(const std::vector<int>& ranks) const {
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  std::unique_ptr<Cma> cma(new Cma(int(me - ranks.begin()), int(ranks.size())));
  for (size_t i = 0; i < ranks.size(); ++i) {
    cma->pids_[i] = pids_[size_t(ranks[i])];
    cma->probes_[i] = probes_[size_t(ranks[i])];
  }
  cma->probePage_ = probePage_;
  return cma;
}

std::string Cma::probe(int peer) const {
  ProbeWords got{};
  const int err = transferAll(false, pids_[peer], &got, probes_[peer], sizeof(got));
  const std::string who = "rank " + std::to_string(rank_) + " could not read the memory of rank " +
                          std::to_string(peer) + " (pid " + std::to_string(pids_[peer]) + ")";
  if (err) return who + ": process_vm_readv: " + std::strerror(err);
  if (got.magic != kProbeMagic || got.pid != uint64_t(pids_[peer]) || got.rank != uint64_t(peer)) {
    return who +
           ": its probe page held other bytes (another process with that pid, or another pid "
           "namespace)";
  }
  return "";
}

bool Cma::alive(int peer) const { return peer == rank_ || probe(peer).empty(); }

void Cma::read(int peer, void* local, uint64_t remote, size_t bytes) const {
  if (bytes == 0) return;
  if (peer == rank_) {
    std::memmove(local, reinterpret_cast<const void*>(remote), bytes);
    return;
  }
  if (const int err = transferAll(false, pids_[peer], local, remote, bytes))
    fail(peer, "process_vm_readv", err);
}

void Cma::write(int peer, uint64_t remote, const void* local, size_t bytes) const {
  if (bytes == 0) return;
  if (peer == rank_) {
    std::memmove(reinterpret_cast<void*>(remote), local, bytes);
    return;
  }
  if (const int err = transferAll(true, pids_[peer], const_cast<void*>(local), remote, bytes)) {
    fail(peer, "process_vm_writev", err);
  }
}

void Cma::fail(int peer, const char* call, int err) const {
  const std::string how = std::string(call) + ": " + std::strerror(err);
  if (err == ESRCH || !alive(peer)) {
    throw Error(ErrorKind::PeerClosed, closedConnection(peer) +
                                           ": its process exited, or left the group, while this rank copied "
                                           "its memory (" + how + ")");
  }
  throw Error(ErrorKind::Internal,
              "copying the buffer of rank " + std::to_string(peer) + " failed (" + how +
                  "): it no longer holds the buffer it published, so it left the collective "
                  "early (timed out or failed); the group is no longer usable, create a new one");
}

}  // namespace ringx
