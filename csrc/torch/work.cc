#include "torch/work.hpp"

#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <cstdlib>

#include "core/common/fork_generation.h"
#include "core/common/log.h"

namespace ringx {

std::exception_ptr toTorchException(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::InvalidArgument:
    case ErrorKind::Timeout:
    case ErrorKind::PeerClosed:
    case ErrorKind::Aborted:
    case ErrorKind::Internal:
      return std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, e.what()));
    case ErrorKind::Unsupported:
      return std::make_exception_ptr(c10::TypeError({__func__, __FILE__, uint32_t(__LINE__)}, e.what()));
  }
  return std::make_exception_ptr(std::runtime_error(e.what()));
}

WorkRingx::WorkRingx(int rank, c10d::OpType type, const char* profilingTitle, std::vector<at::Tensor> inputs,
                     std::vector<at::Tensor> outputs, uint64_t seq, std::weak_ptr<Communicator> comm)
    : c10d::Work(rank, type, profilingTitle, std::optional<std::vector<at::Tensor>>(std::move(inputs))),
      outputs_(std::move(outputs)),
      seq_(seq),
      comm_(std::move(comm)),
      creatorPid_(processId()),
      creatorFork_(forkGeneration()) {}

void WorkRingx::onDevice(DeviceEnd end) {
  std::lock_guard<std::mutex> lock(mutex_);
  device_ = std::move(end);
}

std::optional<WorkRingx::DeviceEnd> WorkRingx::deviceEnd() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return device_;
}

bool WorkRingx::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && (!device_ || exception_ || device_->finished->query());
}

void WorkRingx::synchronize() {
  if (device_) device_->waitOnCurrentStream();
}

void WorkRingx::blockCurrentStream() {
  if (device_) {
    synchronize();
  } else {
    c10d::Work::blockCurrentStream();
  }
}

bool WorkRingx::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr WorkRingx::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

bool WorkRingx::wait(std::chrono::milliseconds timeout) {
  if (forkGeneration() != creatorFork_) {
    throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)},
                                "ringx: " + opName + " (rank " + std::to_string(rank_) + ", seq " +
                                    std::to_string(seq_) + "): this Work belongs to process " +
                                    std::to_string(creatorPid_) +
                                    ", whose engine threads a forked child does not have; wait on it in "
                                    "the parent, or create a new process group in the child");
  }
  auto timedOut = [&] {
    return c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)},
                                 "ringx: " + opName + " (rank " + std::to_string(rank_) + ", seq " +
                                     std::to_string(seq_) + "): Timed out after " + std::to_string(timeout.count()) +
                                     " ms in Work.wait(timeout); the operation is still pending");
  };
  // With a timeout the host blocks, as NCCL's wait(timeout) does.
  if (device_ && !device_->blockingWait && timeout == kNoTimeout) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (completed_ && exception_) std::rethrow_exception(exception_);
    }
    device_->waitOnCurrentStream();
    return true;
  }
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> until;
  if (timeout != kNoTimeout) until = Clock::now() + timeout;
  // Drive the communicator while waiting; when another thread drives it,
  // wait for this op's notification and try again.
  if (auto comm = comm_.lock()) {
    for (;;) {
      auto r = comm->drive([this] { return done_.load(); }, until);
      if (r != Communicator::Drive::Busy) break;
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait_for(lock, std::chrono::milliseconds(1), [this] { return completed_; });
      if (completed_) break;
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!until) {
    cv_.wait(lock, [this] { return completed_; });
  } else if (!cv_.wait_until(lock, *until, [this] { return completed_; })) {
    throw timedOut();
  }
  if (exception_) std::rethrow_exception(exception_);
  lock.unlock();
  if (!device_) return true;
  if (!device_->finished->waitUntil(until)) throw timedOut();
  device_->waitOnCurrentStream();
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkRingx::getFuture() {
  bool ended;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_) {
      future_ = device_ ? c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(),
                                                                   std::vector<c10::Device>{device_->device})
                        : c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    }
    futureWanted_ = true;
    ended = completed_;
    future = future_;
  }
  // Ended before anyone asked: no callback is attached yet, so completing
  // it here runs none.
  if (ended) completeFuture(nullptr);
  return future;
}

bool WorkRingx::futureWanted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return futureWanted_;
}

int WorkRingx::sourceRank() const {
  int r = sourceRank_.load();
  if (r < 0) {
    throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)},
                          "ringx: " + opName + ": sourceRank() is only defined for a completed recv from any source");
  }
  return r;
}

std::vector<at::Tensor> WorkRingx::result() { return outputs_; }

void WorkRingx::markDone(const Error* error) {
  std::exception_ptr ex;
  if (error && device_ && device_->teardownOnError) {
    // As TORCH_NCCL_ASYNC_ERROR_HANDLING=1: nobody may be waiting to hear.
    RINGX_LOG(Warn, "ringx: " << opName << " (rank " << rank_ << ", seq " << seq_ << ") failed, and "
                               << "RINGX_ASYNC_ERROR_HANDLING=teardown aborts the process: " << error->what());
    std::abort();
  }
  if (error) {
    ex = toTorchException(*error);
  } else if (publish) {
    try {
      // The copy into the user's tensor runs on the progress thread, whose
      // autograd state is not the caller's: an inference tensor, or a leaf
      // that requires grad, must not make it fail. The tensor was handed to a
      // collective to be overwritten, as gloo's and NCCL's copies do.
      c10::InferenceMode guard;
      publish();
    } catch (const Error& e) {
      // A publication that finds the ranks' arguments disagree (a sparse
      // all_reduce's shapes) says so in full.
      ex = toTorchException(e);
    } catch (const std::exception& e) {
      ex = toTorchException(Error(ErrorKind::Internal, std::string("ringx: ") + opName + ": " + e.what()));
    }
  }
  finish(ex);
  done_ = true;
}

void WorkRingx::completeFuture(const Error*) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    future = future_;
  }
  if (!future || futureDone_.exchange(true)) return;
  std::exception_ptr ex = exception();
  if (ex) {
    future->setError(ex);
  } else if (device_) {
    device_->onFinishedStream([&] { future->markCompleted(c10::IValue(outputs_)); });
  } else {
    future->markCompleted(c10::IValue(outputs_));
  }
}

}  // namespace ringx
