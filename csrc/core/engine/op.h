// One collective or point-to-point call on its way through the engine.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/common/error.h"
#include "core/engine/schedule.h"

namespace ringx {

struct Op {
  Op(std::string name, uint64_t seq, Schedule schedule)
      : name(std::move(name)), seq(seq), schedule(std::move(schedule)) {}

  std::string name;  // the torch name users know: "all_reduce", "broadcast", ...
  uint64_t seq;
  Schedule schedule;
  std::chrono::milliseconds timeout{0};  // 0: the communicator's default
  // The payload; a small op on an idle communicator runs inline in submit().
  size_t bytes = SIZE_MAX;
  // The caller waits on it at once (torch's async_op=False) and so drives it
  // itself: it is not handed to the progress thread, whose wake-up timer
  // costs two system calls per op (about 10 us on a VM, measured).
  bool callerWaits = false;

  // Runs on the progress thread when the op ends (error == nullptr on
  // success). Must be quick and must not call user code: it only publishes.
  std::function<void(const Error* error)> onDone;
  // Runs afterwards on the communicator's callback pool, where user
  // callbacks (future continuations) may block or issue more collectives.
  std::function<void(const Error* error)> onCallbacks;
  // Asked once onDone has run; false skips onCallbacks (nobody listens, so
  // no pool thread is woken). Unset: onCallbacks always runs.
  std::function<bool()> callbacksWanted;
  // Whatever must outlive every transfer (tensors): released only once the
  // transport no longer references the op's buffers.
  std::shared_ptr<void> keepAlive;
  // The sender of the last completed receive (recv from any source).
  int recvSource = -1;
};

}  // namespace ringx
