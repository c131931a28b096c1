// A group's transport: its ranks and tag channel on the process's shared UCX
// worker (ucx_worker.h says how the worker is progressed for every group).
// Destroying a view drops its channel and tells the group's peers that this
// rank left it (ucx_worker.h: by its presence mark on this host, by a notice
// to other hosts); the worker and its endpoints stay for the other groups,
// and end after the last view, on a thread of their own (ucx_worker.h).
#pragma once

#include <memory>
#include <vector>

#include "core/transport/transport.h"
#include "core/transport/ucx/ucx_worker.h"

namespace ringx {

class UcxView final : public Transport {
 public:
  UcxView(std::shared_ptr<UcxWorker> worker, std::unique_ptr<UcxChannel> channel);
  ~UcxView() override;

  int rank() const override { return channel_->rank; }
  int size() const override { return channel_->size(); }
  std::string name() const override { return "ucx"; }

  TransferId isend(int peer, uint64_t tag, const void* buf, size_t bytes, MemoryKind mem,
                   TransferCallback done) override;
  TransferId irecv(int peer, uint64_t tag, void* buf, size_t bytes, MemoryKind mem, TransferCallback done) override;
  void cancel(TransferId id) override;
  bool progress() override;
  int eventFd() const override { return channel_->eventFd; }
  bool arm() override;
  void checkPeers() override;
  std::vector<int> failedPeers() const override;
  void forgetPending() override;

  uint32_t nextChannel() const override;
  const UcxChannel* channel() const { return channel_.get(); }
  std::unique_ptr<Transport> subset(const std::vector<int>& ranks, uint32_t channel) override;

 private:
  std::shared_ptr<UcxWorker> worker_;
  std::unique_ptr<UcxChannel> channel_;
  int fork_;
};

}  // namespace ringx
