// Cross-memory attach (Linux CMA): reading a peer process's memory with one
// process_vm_readv, the single copy MPI uses between ranks of one host. A
// group probes at creation whether every rank can read every other (the
// kernel may refuse: Yama, seccomp, different users, non-dumpable
// processes), and all ranks agree on the answer through the store, so the
// algorithms built on it are chosen alike everywhere or nowhere.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/common/store.h"

namespace ringx {

enum class CmaMode { Auto, Off, On };

// RINGX_CMA's value; throws Error(InvalidArgument) naming the variable when
// it is not auto, 0 or 1.
CmaMode cmaModeSetting();

class Cma {
 public:
  // Collective over the ranks of a single-host group (call it where
  // ShmArea::create succeeded). Returns nullptr when `mode` is Off or a rank
  // could not read a peer's probe page; RINGX_DEBUG=INFO says which and why.
  // With CmaMode::On that last case throws Error(InvalidArgument) on every
  // rank instead.
  static std::unique_ptr<Cma> create(Store& store, const std::string& keyPrefix, int rank, int size,
                                     CmaMode mode);
  ~Cma();
  Cma(const Cma&) = delete;
  Cma& operator=(const Cma&) = delete;

  // For a group shrunk from this one, over `ranks` (this rank among them):
  // what every rank learnt of the others still holds, so nothing is asked
  // again. The probe page lasts as long as either does.
  std::unique_ptr<Cma> subset(const std::vector<int>& ranks) const;

  int rank() const { return rank_; }

  // Copies `bytes` at address `remote` of rank `peer` to `local` (the local
  // copy itself when peer is this rank). Throws Error naming the peer: kind
  // PeerClosed when its process is gone, Internal otherwise (its buffer no
  // longer mapped: it left the collective early).
  void read(int peer, void* local, uint64_t remote, size_t bytes) const;
  // The other way: copies `bytes` at `local` to address `remote` of rank
  // `peer` (process_vm_writev), with the same errors.
  void write(int peer, uint64_t remote, const void* local, size_t bytes) const;

  // Whether rank `peer`'s process still exists, by reading its probe page;
  // false once it exited (also while it is a zombie).
  bool alive(int peer) const;

 private:
  Cma(int rank, int size) : rank_(rank), pids_(size), probes_(size) {}
  // Empty when this process can read `peer`'s probe page and finds the
  // pattern it wrote; otherwise why not.
  std::string probe(int peer) const;
  [[noreturn]] void fail(int peer, const char* call, int err) const;

  int rank_;
  std::vector<pid_t> pids_;
  std::vector<uint64_t> probes_;
  std::shared_ptr<void> probePage_;
};

}  // namespace ringx
