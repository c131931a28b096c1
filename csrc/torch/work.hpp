// The Work a ringx collective returns. It completes in two phases:
//   1. on whichever thread progresses the communicator when the data is in
//      place (the caller's own, when it waits: wait() drives the
//      communicator until its op is done): outputs are published (copied
//      back into non-contiguous user tensors), the error is recorded, and
//      wait() returns;
//   2. the Future is completed. If someone asked for the Future before the
//      op ended, on the communicator's callback pool, so its callbacks (DDP
//      comm hooks, .then chains that issue collectives and wait on them)
//      never run on, or block, a progressing thread; none runs after the
//      group's shutdown returns (destroy_process_group) or once the
//      interpreter exits (an atexit hook stops every pool). Otherwise the
//      pool is not involved: getFuture() completes it when first asked.
// A Work, like its group, belongs to the process that created it: wait() in
// a forked child raises instead of hanging.
//
// On CUDA tensors (onDevice()) the data is in place once a device event has
// fired, after the op ended on the host: isCompleted() asks the event too;
// wait() and synchronize() make the caller's current stream wait for it and
// return at once (wait() blocks, as before, with RINGX_BLOCKING_WAIT=1, and
// wait(timeout) blocks until the outputs are in place or raises, as NCCL's); the
// Future is created for the device, so its callbacks run stream-ordered.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>

#include "core/common/error.h"
#include "core/device/device.h"
#include "core/engine/communicator.h"

namespace ringx {

class WorkRingx : public c10d::Work {
 public:
  WorkRingx(int rank, c10d::OpType type, const char* profilingTitle, std::vector<at::Tensor> inputs,
            std::vector<at::Tensor> outputs, uint64_t seq, std::weak_ptr<Communicator> comm);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  // Blocks the current stream until the outputs are in place: synchronize()
  // for CUDA tensors; torch's spin kernel otherwise.
  void blockCurrentStream() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override;
  void setSourceRank(int rank) { sourceRank_ = rank; }

  // Phase 1 (progress thread). `publish` runs first when the op succeeded.
  void markDone(const Error* error);
  // Whether phase 2 must run on the callback pool: someone holds the Future.
  bool futureWanted();
  // Phase 2; nothing to do before getFuture() made the Future (which then
  // completes it itself, the Work having ended).
  void completeFuture(const Error* error);

  // How the device side ends: `finished` fires once the outputs are in
  // place; waitOnCurrentStream makes the calling thread's current stream
  // wait for it; onFinishedStream runs a function with a current stream that
  // has waited for it (the Future records its event there). Only before the
  // Work is handed out.
  struct DeviceEnd {
    c10::Device device;
    std::shared_ptr<DeviceEvent> finished;
    std::function<void()> waitOnCurrentStream;
    std::function<void(const std::function<void()>&)> onFinishedStream;
    bool blockingWait = false;
    // RINGX_ASYNC_ERROR_HANDLING=teardown: a failure aborts the process.
    bool teardownOnError = false;
  };
  void onDevice(DeviceEnd end);
  std::optional<DeviceEnd> deviceEnd() const;

  std::function<void()> publish;
  std::string opName;

 private:
  std::vector<at::Tensor> outputs_;
  uint64_t seq_;
  std::atomic<int> sourceRank_{-1};
  // Made by the first getFuture(): most calls never ask for it. Guarded by
  // mutex_, as futureWanted_ is.
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool futureWanted_ = false;
  std::atomic<bool> futureDone_{false};
  std::atomic<bool> done_{false};  // phase 1 over; read by a driving waiter
  std::weak_ptr<Communicator> comm_;
  std::optional<DeviceEnd> device_;
  const int creatorPid_;
  const int creatorFork_;  // forkGeneration() at creation
};

// The exception a core error becomes when it reaches Python.
std::exception_ptr toTorchException(const Error& e);

}  // namespace ringx
