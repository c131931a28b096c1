// all_reduce, reduce and reduce_scatter in their plain, list and coalesced forms.
#include "core/reduce/reduce.h"
#include "torch/process_group_ringx.hpp"
#include "torch/staging.h"

namespace ringx {

namespace {

// The core dtype of a reduction's tensors, refusing op/dtype pairs with a
// TypeError that says which types the op needs.
DType reducibleType(const CallContext& c, const at::Tensor& parts, ReduceOp op) {
  DType dtype = toDType(c, parts.scalar_type());
  if (!reduceSupported(dtype, op)) {
    throwTypeError(c, "reduce op " + std::string(reduceOpName(op)) + " is not supported for dtype " +
                          std::string(dtypeName(dtype)) +
                          (isFloating(dtype) ? " (bitwise ops need an integer or bool tensor)"
                                             : " (AVG and PREMUL_SUM need a floating-point tensor)"));
  }
  return dtype;
}

void checkOneDtype(const CallContext& c, const std::vector<at::Tensor>& ts, const char* what) {
  if (ts.empty()) throwValueError(c, std::string("got an empty ") + what + " list");
  for (const auto& t : ts) {
    checkDevice(c, t);
    if (t.scalar_type() != ts[0].scalar_type()) {
      throwTypeError(c, std::string("all ") + what + " tensors must have one dtype; got " +
                            std::string(c10::toString(t.scalar_type())) + " and " +
                            std::string(c10::toString(ts[0].scalar_type())));
    }
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
    return allreduceSparse(tensors[0], opts);
  }
  Call call = begin("all_reduce", c10d::OpType::ALLREDUCE, opts.timeout, opts.asyncOp);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  call.recorded = {t};
  ReduceOp op = toReduceOp(opts.reduceOp);
  Staged st = stage(asReducible(call.ctx, t, opts.reduceOp.op_));
  CollArgs a = argsFor(call, Collective::AllReduce);
  a.dtype = reducibleType(call.ctx, st.buf, op);
  a.op = op;
  a.premulFactor = premulFactor(call.ctx, opts.reduceOp);
  a.buf = st.buf.data_ptr();
  a.count = size_t(st.buf.numel());
  return submit(call, a, {t, st.buf}, {t}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  Call call = begin("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, opts.timeout, opts.asyncOp);
  checkOneDtype(call.ctx, tensors, "input");
  call.title = "all_reduce";
  call.recorded = tensors;
  for (const auto& t : tensors) asReducible(call.ctx, t, opts.reduceOp.op_);
  ReduceOp op = toReduceOp(opts.reduceOp);
  at::Tensor flat = flatCat(tensors);
  CollArgs a = argsFor(call, Collective::AllReduce);
  a.dtype = reducibleType(call.ctx, flat, op);
  a.op = op;
  a.premulFactor = premulFactor(call.ctx, opts.reduceOp);
  a.buf = flat.data_ptr();
  a.count = size_t(flat.numel());
  std::vector<at::Tensor> users = tensors;
  std::vector<at::Tensor> keep = tensors;
  keep.push_back(flat);
  return submit(call, a, keep, tensors, [users, flat]() mutable { unflatten(flat, users); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  Call call = begin("reduce", c10d::OpType::REDUCE, opts.timeout, opts.asyncOp);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  call.recorded = {t};
  checkRoot(call.ctx, opts.rootRank);
  if (opts.rootTensor != 0) throwValueError(call.ctx, "rootTensor must be 0 with one tensor per call");
  ReduceOp op = toReduceOp(opts.reduceOp);
  Staged st = stage(asReducible(call.ctx, t, opts.reduceOp.op_));
  CollArgs a = argsFor(call, Collective::Reduce);
  a.dtype = reducibleType(call.ctx, st.buf, op);
  a.op = op;
  a.premulFactor = premulFactor(call.ctx, opts.reduceOp);
  a.buf = st.buf.data_ptr();
  a.count = size_t(st.buf.numel());
  a.root = int(opts.rootRank);
  return submit(call, a, {t, st.buf}, {t}, rank_ == opts.rootRank ? std::move(st.publish) : nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  Call call = begin("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, opts.timeout, opts.asyncOp);
  checkDevice(call.ctx, input);
  checkDevice(call.ctx, output);
  call.recorded = {input};
  if (output.scalar_type() != input.scalar_type()) {
    throwTypeError(call.ctx, "output dtype " + std::string(c10::toString(output.scalar_type())) +
                                 " differs from input dtype " + std::string(c10::toString(input.scalar_type())));
  }
  if (input.numel() != output.numel() * size_) {
    throwValueError(call.ctx, "input has " + std::to_string(input.numel()) + " elements, expected " +
                                  std::to_string(output.numel() * size_) + " (world size x output elements)");
  }
  ReduceOp op = toReduceOp(opts.reduceOp);
  at::Tensor src = asReducible(call.ctx, input, opts.reduceOp.op_).contiguous();
  // The ring writes the output while it still reads the input, so an output
  // that is a view into the input (Megatron's in-place form) gets its own
  // buffer first.
  Staged st = output.is_alias_of(input) ? stageCopy(asParts(output)) : stage(asParts(output));
  CollArgs a = argsFor(call, Collective::ReduceScatter);
  a.dtype = reducibleType(call.ctx, src, op);
  a.op = op;
  a.premulFactor = premulFactor(call.ctx, opts.reduceOp);
  a.input = src.data_ptr();
  a.buf = st.buf.data_ptr();
  a.count = size_t(st.buf.numel());
  return submit(call, a, {input, src, output, st.buf}, {output}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  Call call = begin("reduce_scatter", c10d::OpType::REDUCE_SCATTER, opts.timeout, opts.asyncOp);
  const at::Tensor& out = singleTensor(call.ctx, outputs);
  if (inputs.size() != 1) throwValueError(call.ctx, "expects one input list, got " + std::to_string(inputs.size()));
  checkListLength(call.ctx, inputs[0].size(), "input");
  call.recorded = inputs[0];
  for (size_t i = 0; i < inputs[0].size(); ++i) {
    checkSameType(call.ctx, out, "the output", inputs[0][i], "input tensor " + std::to_string(i));
    asReducible(call.ctx, inputs[0][i], opts.reduceOp.op_);
  }
  ReduceOp op = toReduceOp(opts.reduceOp);
  Staged st = stage(asParts(out));
  at::Tensor src = adjacentFlat(inputs[0], st.buf).value_or(at::Tensor());
  if (!src.defined()) src = flatCat(inputs[0]);
  CollArgs a = argsFor(call, Collective::ReduceScatter);
  a.dtype = reducibleType(call.ctx, src, op);
  a.op = op;
  a.premulFactor = premulFactor(call.ctx, opts.reduceOp);
  a.input = src.data_ptr();
  a.buf = st.buf.data_ptr();
  a.count = size_t(st.buf.numel());
  std::vector<at::Tensor> keep = inputs[0];
  keep.insert(keep.end(), {src, out, st.buf});
  return submit(call, a, keep, {out}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  Call call = begin("reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, opts.timeout, opts.asyncOp);
  checkOneDtype(call.ctx, inputs, "input");
  checkOneDtype(call.ctx, outputs, "output");
  call.recorded = inputs;
  if (inputs.size() != outputs.size()) {
    throwValueError(call.ctx, std::to_string(inputs.size()) + " inputs but " + std::to_string(outputs.size()) +
                                  " outputs; expected one output per input");
  }
  // Lay the inputs out rank block by rank block: block q holds every
  // input's q-th slice, so one reduce-scatter serves them all.
  std::vector<at::Tensor> pieces;
  for (int q = 0; q < size_; ++q) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].numel() != outputs[i].numel() * size_) {
        throwValueError(call.ctx, "input " + std::to_string(i) + " has " + std::to_string(inputs[i].numel()) +
                                      " elements, expected " + std::to_string(outputs[i].numel() * size_));
      }
      at::Tensor parts = asReducible(call.ctx, inputs[i], opts.reduceOp.op_).reshape({-1});
      const int64_t len = parts.numel() / size_;
      pieces.push_back(parts.narrow(0, q * len, len));
    }
  }
  ReduceOp op = toReduceOp(opts.reduceOp);
  at::Tensor src = at::cat(pieces);
  at::Tensor flatOut = at::empty({src.numel() / size_}, src.options());
  CollArgs a = argsFor(call, Collective::ReduceScatter);
  a.dtype = reducibleType(call.ctx, src, op);
  a.op = op;
  a.premulFactor = premulFactor(call.ctx, opts.reduceOp);
  a.input = src.data_ptr();
  a.buf = flatOut.data_ptr();
  a.count = size_t(flatOut.numel());
  std::vector<at::Tensor> users = outputs;
  std::vector<at::Tensor> keep = inputs;
  keep.insert(keep.end(), {src, flatOut});
  return submit(call, a, keep, outputs, [users, flatOut]() mutable { unflatten(flatOut, users); });
}

}  // namespace ringx
