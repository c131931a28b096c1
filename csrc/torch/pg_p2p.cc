// send, recv and recv from any source: one-step schedules with user tags.
#include "core/transport/transport.h"
#include "torch/process_group_ringx.hpp"
#include "torch/staging.h"

namespace ringx {

namespace {

void checkPeer(const CallContext& c, int peer, const char* role) {
  if (peer < 0 || peer >= c.size) {
    throwValueError(c, std::string(role) + " rank " + std::to_string(peer) + " is out of range for a group of size " +
                           std::to_string(c.size));
  }
  if (peer == c.rank) {
    throwValueError(c, std::string(role) + " rank " + std::to_string(peer) +
                           " is this rank; send and recv need a different rank");
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  Call call = beginP2P("send", c10d::OpType::SEND);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  call.recorded = {t};
  checkPeer(call.ctx, dstRank, "destination");
  at::Tensor src = asParts(t).contiguous();
  Schedule s(toDType(call.ctx, src.scalar_type()), ReduceOp::Sum);
  s.setAlgorithm("direct");
  s.send(dstRank, p2pTag(tag), src.data_ptr(), src.nbytes());
  return submitSchedule(call, std::move(s), {t, src}, {t}, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  Call call = beginP2P("recv", c10d::OpType::RECV);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  call.recorded = {t};
  checkPeer(call.ctx, srcRank, "source");
  Staged st = stage(asParts(t));
  Schedule s(toDType(call.ctx, st.buf.scalar_type()), ReduceOp::Sum);
  s.setAlgorithm("direct");
  s.recv(srcRank, p2pTag(tag), st.buf.data_ptr(), st.buf.nbytes());
  return submitSchedule(call, std::move(s), {t, st.buf}, {t}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Call call = beginP2P("recv", c10d::OpType::RECVANYSOURCE);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  // Which rank a receive in a batch heard from is not kept per receive.
  if (held_) throwValueError(call.ctx, "a receive from any source cannot be coalesced; name the source rank");
  call.title = "recvAnySource";
  call.recorded = {t};
  Staged st = stage(asParts(t));
  Schedule s(toDType(call.ctx, st.buf.scalar_type()), ReduceOp::Sum);
  s.setAlgorithm("direct");
  s.recv(kAnySource, p2pTag(tag), st.buf.data_ptr(), st.buf.nbytes());
  return submitSchedule(call, std::move(s), {t, st.buf}, {t}, std::move(st.publish));
}

}  // namespace ringx
