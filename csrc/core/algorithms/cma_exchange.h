// What the single-copy (CMA) algorithms share: one chunk of the shared-memory
// area's numbering per op, in which every rank publishes its buffer, copies
// what it needs straight from (or into) its peers' buffers with
// process_vm_readv (process_vm_writev), and does not hand its own buffer
// back to the caller before every peer that copies from or into it is done.
//
// The protocol, for chunk `id` (counter values as the slot algorithms use
// them, so both kinds of op compose in one numbering):
//   1. publish: once this rank's previous chunk is done and the header slot
//      of parity id % 2 is free, write the op's identity into the header and
//      the buffer's address into the op record; counter := 2 id - 1.
//   2. match: once every peer's counter >= 2 id - 1, compare its header
//      with this rank's; then the collective's plan (given the peers'
//      records) lists the copies and may check more (split sizes). The
//      peers are every other rank, or in a rooted collective the root for
//      the others and every other rank for the root.
//   3. transfer: the copies, a bounded piece per poll so the progress
//      thread stays responsive; counter := 2 id (this rank copies no more).
//   4. finish: once no peer can still be copying from or into this rank's
//      buffer (its counter >= 2 id, or it published another identity and so
//      never matches, or its process is gone), the op ends. A plan under
//      which peers copy only out of slots ends it at step 3 instead
//      (endWithOwnCopies).
// A failure at any step (different identities, a peer that died, a copy
// that failed, split sizes that disagree) is recorded, the rest of the
// copies are skipped, the header is marked failed, and the op still waits
// at step 4 before it fails: a rank never hands its buffer back while a peer
// may be copying it. A peer that finds a header marked failed fails too
// (its result may lack what the failed rank was to copy into it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/common/error.h"
#include "core/common/identity.h"
#include "core/engine/schedule.h"
#include "core/reduce/reduce.h"
#include "core/transport/shm/cma.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

// What a rank publishes in its op record for a single-copy chunk.
struct CmaRecord {
  uint64_t addr = 0;   // the buffer peers copy from or into; 0 when none
  uint64_t bytes = 0;  // its length
  uint64_t table = 0;  // all_to_all: the address of this rank's CmaBlock[n]; 0 otherwise
  // Non-zero when the table fits this rank's slot and was copied there at
  // publish: peers look it up in shared memory instead of with a system call
  // each. The bytes copied, the table's and those of dataInline below.
  uint64_t inlineBytes = 0;
  // all_to_all: 1 when the input follows the table in the slot, for inputs
  // small enough that two copies cost less than the system calls that read
  // another process's memory; peers then read nothing from this rank's.
  uint64_t dataInline = 0;
};
static_assert(sizeof(CmaRecord) <= ShmArea::kOpRecordBytes);

// Why a rank failed its part, written into its op record (after the
// CmaRecord) before it marks its header failed: peers that fail because it
// did then name the rank whose process died, not just the messenger.
struct CmaCause {
  int32_t rank = -1;    // the rank this one failed on; -1 when none
  uint32_t closed = 0;  // 1 when that rank's process was gone
};
static_assert(sizeof(CmaRecord) + sizeof(CmaCause) <= ShmArea::kOpRecordBytes);

// all_to_all: rank r's entry j of its table describes its exchange with rank
// j, so that j can check both directions against its own split sizes.
struct CmaBlock {
  uint64_t sendOffset;  // where the block for j starts in r's input
  uint64_t sendBytes;   // bytes r sends j
  uint64_t recvBytes;   // bytes r expects from j
  uint64_t recvAddr;    // where j's block for r goes in r's memory (j may write its tail)
};

class CmaExchange {
 public:
  // `root` >= 0: a rooted collective, where the other ranks copy from or
  // into the root only, so they wait for it alone and it for all of them.
  CmaExchange(ShmArea* shm, const Cma* cma, uint64_t id, const CollIdentity& mine,
              CmaRecord published, int root = -1);

  // The four poll steps, in order (see above).
  bool publish();
  bool match();
  bool transfer();
  bool finish();
  // The ranks each step still waits for, for timeout messages.
  std::vector<int> publishWaitsFor() const { return shm_->holdingSlot(id_); }
  std::vector<int> matchWaitsFor() const;
  std::vector<int> finishWaitsFor() const;

  // For the plan (step 2): rank `peer`'s record, and the copies to make.
  // addRead from this rank itself is a local copy.
  const CmaRecord& record(int peer) const { return records_[size_t(peer)]; }
  void addRead(int peer, uint64_t remote, void* local, size_t bytes);
  // A copy into rank `peer`'s published output, for ranks that would
  // otherwise idle while their peers copy (a broadcast's root, a gather's
  // senders); the peer keeps that buffer until this rank is done.
  void addWrite(int peer, uint64_t remote, const void* local, size_t bytes);
  // For the reducing collectives: `bytes` at `offset` into every rank's
  // published buffer, the peers' read a piece at a time into scratch that
  // stays in cache and reduced with this rank's own into `dst` (which may be
  // that same place) in one n-way pass per piece, sources in rank order as
  // the slot algorithms reduce them, then scaled by `factor` unless it is 1
  // (AVG).
  struct Reduction {
    uint64_t offset;
    std::byte* dst;
    size_t bytes;
    ReduceNFn fn;
    DType dtype;
    double factor;
  };
  void addReduce(Reduction reduction);
  const Cma& cma() const { return *cma_; }
  int rank() const { return shm_->rank(); }
  int size() const { return shm_->size(); }

  // Records why the op fails, and on which rank; the first reason wins.
  void fail(const Error& e, CmaCause cause = {});
  // The engine ended the op before finish(): its buffer goes back to the
  // caller, so peers that read it from now on would take whatever the caller
  // puts there. Marks the header withdrawn, which they check at each piece.
  void abandon();
  using Plan = std::function<void(CmaExchange&)>;
  void setPlan(Plan plan) { plan_ = std::move(plan); }
  // Writes this rank's slot at publish, before peers may look (see
  // CmaRecord::inlineBytes); peers read it with peerSlot. The slot stays as
  // written until every rank has finished this chunk.
  using Fill = std::function<void(std::byte* slot)>;
  void setFill(Fill fill) { fill_ = std::move(fill); }
  const std::byte* peerSlot(int peer) const { return shm_->slot(peer, which_); }
  // For the plan, when no peer copies from or into this rank's buffers (every
  // record is inline, so peers copy out of slots) and the plan has checked
  // everything a peer could fail on: the op then ends once this rank's own
  // copies are done instead of waiting at step 4 for its peers' (the slots
  // stay theirs to read until every rank has finished the chunk).
  void endWithOwnCopies() { waitForPeers_ = false; }

 private:
  struct Transfer {
    int peer;
    uint64_t remote;
    std::byte* local;
    size_t bytes;
    bool write;
    int reduction;  // an index into reductions_, or -1 for a plain copy
  };
  // One piece of a copy, or of a reduction (`n` bytes from `offset`);
  // false once failed, the failure recorded.
  bool copyPiece(int peer, uint64_t remote, std::byte* local, size_t n, bool write);
  bool reducePiece(const Reduction& red, size_t offset, size_t n);
  // Every 100 ms of waiting, and at once when a watched process on this host
  // exited (exit_watch.h), looks for dead peers among the ranks a step waits
  // for (the list made only then); marks and reports those found.
  void checkAlive(std::vector<int> (CmaExchange::*waitingFor)() const);
  // Whether `peer` has published this chunk (or is dead: nothing to wait for).
  bool published(int peer) const;
  bool doneWith(int peer) const;
  // Whether a peer's header is this call's, marked as failed (step 3).
  bool failedSameCall(const CollIdentity& theirs) const;
  // Whether `peer` still stands behind the buffer it published for this
  // chunk: not withdrawn, not moved on to another call.
  bool stillPublished(int peer) const;
  // What `peer` recorded about its failure: the dead rank it failed on, if
  // any (so a chain of failures names the root), else the peer itself.
  CmaCause causeOf(int peer) const;
  Error peerFailed(int peer) const;
  // Writes this rank's cause where peers read it, then sets `flags` in its header.
  void publishFailure(uint8_t flags);

  ShmArea* shm_;
  const Cma* cma_;
  uint64_t id_;
  int which_;
  CollIdentity mine_;
  CmaRecord published_;
  Plan plan_;
  Fill fill_;
  std::vector<int> peers_;  // the ranks this one waits for and checks
  std::vector<CmaRecord> records_;
  std::vector<Transfer> transfers_;
  std::vector<Reduction> reductions_;
  std::unique_ptr<std::byte[]> scratch_;  // one piece per peer, for reductions
  size_t scratchPiece_ = 0;
  std::vector<const void*> sources_;
  size_t next_ = 0;
  size_t offset_ = 0;
  bool publishedOwn_ = false;
  bool finished_ = false;
  bool waitForPeers_ = true;
  std::vector<bool> dead_;
  std::optional<Error> failure_;
  CmaCause cause_;
  std::chrono::steady_clock::time_point nextAliveCheck_{};
  uint64_t exitsChecked_ = 0;  // exitsSeen() at the last check
};

// Adds a single-copy chunk's four steps to `s` (reserving its chunk number)
// and returns the last. `published` is what peers read from this rank;
// `plan` lists this rank's copies once its peers have published; the first
// step waits for `after` too; `root` as for CmaExchange; `fill`, if any,
// writes this rank's slot at publish (CmaExchange::setFill).
StepId addCmaExchange(Schedule& s, ShmArea* shm, const Cma* cma, const CollIdentity& mine,
                      CmaRecord published, CmaExchange::Plan plan, StepId after = kNoStep,
                      int root = -1, CmaExchange::Fill fill = {});

// The identity a single-copy chunk publishes: the call's, marked with the
// algorithm, so that ranks which chose different algorithms for the same
// call fail instead of mixing protocols.
struct CollArgs;
CollIdentity cmaIdentity(const CollArgs& a, Schedule (*build)(const CollArgs&));

}  // namespace ringx
