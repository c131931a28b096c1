// startCoalescing / endCoalescing: the calls in between become one op.
#include <algorithm>
#include <optional>
#include <utility>

#include "torch/exit_safe_release.h"
#include "torch/process_group_ringx.hpp"

namespace ringx {

void ProcessGroupRingx::startCoalescing() {
  // The previous block never ended (its body raised outside ringx, and
  // torch's _coalescing_manager does not end a block left by an exception):
  // its calls are submitted now, as they would have been at its end, since
  // the ranks numbered them and dropping them would leave this rank out of
  // step with its peers.
  if (held_) submitHeldQuietly(std::exchange(held_, std::nullopt).value());
  ended_.reset();
  held_.emplace();
}

void ProcessGroupRingx::endBlockEarly() {
  if (!held_) return;
  ended_ = submitHeldQuietly(std::exchange(held_, std::nullopt).value());
}

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitHeldQuietly(std::vector<Held> held) {
  try {
    return submitHeld(std::move(held));
  } catch (const std::exception&) {
    // The group is shut down or poisoned: submitHeld failed every held
    // call's Work with the reason, and the raising call's own error is the
    // one the caller sees.
    return {};
  }
}

// Checked before the call is numbered or built: a call refused here leaves
// the numbering and the shared-memory chunk ids as they were.
void ProcessGroupRingx::checkCoalescible(const Call& call) const {
  if (!held_ || !call.reduction) return;
  for (const auto& h : *held_) {
    if (h.reduction && h.reduction != call.reduction) {
      const auto& [dtype, redOp, factor] = *call.reduction;
      const auto& [earlierDtype, earlierOp, earlierFactor] = *h.reduction;
      throwValueError(call.ctx, "reductions coalesced into one op must share dtype and reduce op (this one reduces " +
                                    std::string(dtypeName(dtype)) + " with " + std::string(reduceOpName(redOp)) +
                                    ", an earlier one " + std::string(dtypeName(earlierDtype)) + " with " +
                                    std::string(reduceOpName(earlierOp)) +
                                    (factor != earlierFactor ? ", other PREMUL_SUM factors" : "") +
                                    "); end the coalescing block between them");
    }
  }
}

void ProcessGroupRingx::hold(Call& call, c10::intrusive_ptr<WorkRingx> work, std::unique_ptr<Op> op) {
  held_->push_back(Held{std::move(work), std::move(op), call.reduction});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::endCoalescing() {
  const std::string where = "ringx: endCoalescing (rank " + std::to_string(rank_) + "): ";
  if (ended_) {
    auto work = std::exchange(ended_, std::nullopt).value();
    if (!work) {
      throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)},
                                  where + "a call that raised ended the block early, and the process group refused "
                                          "the calls held before it (it was shut down or has failed)");
    }
    return work;
  }
  if (!held_) throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, where + "no coalescing block is open");
  return submitHeld(std::exchange(held_, std::nullopt).value());
}

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitHeld(std::vector<Held> held) {
  std::vector<at::Tensor> outputs;
  for (const auto& h : held) {
    auto res = h.work->result();
    outputs.insert(outputs.end(), res.begin(), res.end());
  }
  const uint64_t seq = held.empty() ? seq_.load() : held.front().op->seq;
  auto work = c10::make_intrusive<WorkRingx>(rank_, c10d::OpType::COALESCED, nullptr, std::vector<at::Tensor>{},
                                             outputs, seq, comm_);
  work->opName = "coalesced";
  if (held.empty()) {
    work->markDone(nullptr);
    work->completeFuture(nullptr);
    return work;
  }
  Schedule merged = std::move(held.front().op->schedule);
  std::vector<std::shared_ptr<void>> keepAlive;
  std::vector<c10::intrusive_ptr<WorkRingx>> calls;
  std::chrono::milliseconds timeout{0};
  for (size_t i = 0; i < held.size(); ++i) {
    if (i) merged.append(std::move(held[i].op->schedule));
    keepAlive.push_back(held[i].op->keepAlive);
    calls.push_back(held[i].work);
    timeout = std::max(timeout, held[i].op->timeout);
  }
  // CUDA calls end on the group's stream in issue order: the block is in
  // place once its last one is.
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    if (auto end = it->work->deviceEnd()) {
      work->onDevice(std::move(*end));
      break;
    }
  }
  auto op = std::make_unique<Op>("coalesced", seq, std::move(merged));
  op->timeout = timeout;
  op->keepAlive = exitSafe(std::move(keepAlive));
  auto works = exitSafe(std::make_pair(calls, work));
  op->onDone = [works](const Error* e) {
    for (const auto& w : works->first) w->markDone(e);
    works->second->markDone(e);
  };
  op->onCallbacks = [works](const Error* e) {
    for (const auto& w : works->first) w->completeFuture(e);
    works->second->completeFuture(e);
  };
  try {
    // Under the lock that orders numbering and submission (submitBuilt).
    std::lock_guard<std::mutex> lock(submitMu_);
    comm_->submit(std::move(op));
  } catch (const Error& e) {
    Error failed(e.kind(), e.what());
    for (const auto& w : calls) {
      w->markDone(&failed);
      w->completeFuture(&failed);
    }
    work->markDone(&failed);
    work->completeFuture(&failed);
    throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
  }
  return work;
}

}  // namespace ringx
