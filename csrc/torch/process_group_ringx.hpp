// ringx as a c10d::Backend.
//
// Execution model. Every collective call runs on the caller's thread only as
// far as validating its arguments, choosing an algorithm and emitting the
// algorithm's schedule; it then submits the schedule to this group's
// Communicator and returns a WorkRingx at once. The communicator's progress
// thread drives the schedule over UCX; the Work completes as described in
// work.hpp.
//
// Why tags line up across ranks: collectives are numbered by a per-group
// sequence counter that every rank advances identically, because torch
// requires all ranks of a group to issue the same collectives in the same
// order. Each message of a collective is tagged (seq, index within the
// schedule), with the sender's rank in the tag, so concurrent collectives and
// segments never match each other's messages.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "core/algorithms/coll_args.h"
#include "core/engine/communicator.h"
#include "torch/work.hpp"

namespace ringx {

class ProcessGroupRingx : public c10d::Backend {
 public:
  ProcessGroupRingx(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout);
  ~ProcessGroupRingx() override;

  const std::string getBackendName() const override { return "ringx"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  void abort() override;
  void shutdown() override;
  c10d::ErrorType getError() override;

 private:
  struct Call;

  Call begin(const char* op, c10d::OpType type, std::chrono::milliseconds timeout);
  c10::intrusive_ptr<c10d::Work> submit(Call& call, const CollArgs& args, std::vector<at::Tensor> inputs,
                                        std::vector<at::Tensor> outputs, std::function<void()> publish);
  std::chrono::milliseconds timeoutFor(std::chrono::milliseconds requested) const;

  std::unique_ptr<Communicator> comm_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
};

}  // namespace ringx
