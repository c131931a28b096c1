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

c10::intrusive_ptr<WorkRingx> ProcessGroupRingx::submitRecv(Call& call, const at::Tensor& t, int srcRank, int tag) {
  Staged st = stage(asParts(t));
  const DType dtype = toDType(call.ctx, st.buf.scalar_type());
  const size_t bytes = st.buf.nbytes();
  return submitSchedule(
      call, {{st.buf.data_ptr(), bytes, false, true}},
      [&](const std::vector<void*>& buf) {
        Schedule s(dtype, ReduceOp::Sum);
        s.setAlgorithm("direct");
        s.recv(srcRank, p2pTag(tag), buf[0], bytes);
        return s;
      },
      {t, st.buf}, {t}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  Call call = beginP2P("send", c10d::OpType::SEND);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  call.recorded = {t};
  checkPeer(call.ctx, dstRank, "destination");
  at::Tensor src = asParts(t).contiguous();
  const DType dtype = toDType(call.ctx, src.scalar_type());
  const size_t bytes = src.nbytes();
  return submitSchedule(
      call, {{src.data_ptr(), bytes, true, false}},
      [&](const std::vector<void*>& buf) {
        Schedule s(dtype, ReduceOp::Sum);
        s.setAlgorithm("direct");
        s.send(dstRank, p2pTag(tag), buf[0], bytes);
        return s;
      },
      {t, src}, {t}, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  Call call = beginP2P("recv", c10d::OpType::RECV);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  call.recorded = {t};
  checkPeer(call.ctx, srcRank, "source");
  return submitRecv(call, t, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Call call = beginP2P("recv", c10d::OpType::RECVANYSOURCE);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  // Which rank a receive in a batch heard from is not kept per receive.
  if (held_) throwValueError(call.ctx, "a receive from any source cannot be coalesced; name the source rank");
  call.title = "recvAnySource";
  call.recorded = {t};
  return submitRecv(call, t, kAnySource, tag);
}

}  // namespace ringx
