// The Work a ringx collective returns. It completes in two phases:
//   1. on the communicator's progress thread, as soon as the data is in
//      place: outputs are published (copied back into non-contiguous user
//      tensors), the error is recorded, and wait() returns;
//   2. on the communicator's callback pool: the Future is completed, so its
//      callbacks (DDP comm hooks, .then chains that issue collectives and
//      wait on them) never run on, or block, the progress thread. None runs
//      after the group's shutdown returns (destroy_process_group) or once the
//      interpreter exits (an atexit hook stops every pool).
// A Work, like its group, belongs to the process that created it: wait() in
// a forked child raises instead of hanging.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>

#include "core/common/error.h"

namespace ringx {

class WorkRingx : public c10d::Work {
 public:
  WorkRingx(int rank, c10d::OpType type, const char* profilingTitle, std::vector<at::Tensor> inputs,
            std::vector<at::Tensor> outputs, uint64_t seq);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override;
  void setSourceRank(int rank) { sourceRank_ = rank; }

  // Phase 1 (progress thread). `publish` runs first when the op succeeded.
  void markDone(const Error* error);
  // Phase 2 (callback pool).
  void completeFuture(const Error* error);

  std::function<void()> publish;
  std::string opName;

 private:
  std::vector<at::Tensor> outputs_;
  uint64_t seq_;
  std::atomic<int> sourceRank_{-1};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  const int creatorPid_;
};

// The exception a core error becomes when it reaches Python.
std::exception_ptr toTorchException(const Error& e);

}  // namespace ringx
