// broadcast, all_gather, gather, scatter and all_to_all in their tensor,
// list and coalesced forms.
#include <algorithm>
#include <numeric>
#include <optional>

#include "torch/process_group_ringx.hpp"
#include "torch/staging.h"

namespace ringx {

namespace {

void checkSameDtype(const CallContext& c, const at::Tensor& a, const at::Tensor& b) {
  checkDevice(c, a);
  checkDevice(c, b);
  if (a.scalar_type() != b.scalar_type()) {
    throwTypeError(c, "output dtype " + std::string(c10::toString(a.scalar_type())) + " differs from input dtype " +
                          std::string(c10::toString(b.scalar_type())));
  }
}

// gather's outputs and scatter's inputs: the root passes one list of a
// tensor per rank, each like this rank's own tensor; the other ranks pass
// none.
void checkRootList(const CallContext& c, int64_t root, const std::vector<std::vector<at::Tensor>>& lists,
                   const std::string& listName, const at::Tensor& own, const std::string& ownName) {
  if (c.rank != root) {
    if (!lists.empty() && !lists[0].empty()) {
      throwValueError(c, "only the root (rank " + std::to_string(root) + ") takes an " + listName + " list");
    }
    return;
  }
  if (lists.size() != 1) throwValueError(c, "the root expects one " + listName + " list");
  checkListLength(c, lists[0].size(), listName.c_str());
  for (size_t i = 0; i < lists[0].size(); ++i) {
    checkSameType(c, own, ownName, lists[0][i], listName + " tensor " + std::to_string(i));
  }
}

// The addresses of `ts` when each is a contiguous CPU tensor and no two
// share a byte: a single-copy algorithm may then copy each block straight
// from or into its tensor. An empty tensor's address is null.
std::optional<std::vector<void*>> disjointCpuBlocks(const std::vector<const at::Tensor*>& ts) {
  std::vector<void*> blocks;
  std::vector<std::pair<const std::byte*, const std::byte*>> spans;
  for (const at::Tensor* t : ts) {
    const at::Tensor p = asParts(*t);
    if (!p.device().is_cpu() || !p.is_contiguous()) return std::nullopt;
    const size_t bytes = size_t(p.numel()) * p.element_size();
    auto* b = bytes ? static_cast<std::byte*>(p.data_ptr()) : nullptr;
    blocks.push_back(b);
    if (bytes) spans.emplace_back(b, b + bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) return std::nullopt;
  }
  return blocks;
}

// disjointCpuBlocks of `ts` and `other` (contiguous), each of `ts` `bytes`
// (> 0) long: the addresses of `ts`.
std::optional<std::vector<void*>> separateBlocks(const std::vector<at::Tensor>& ts, size_t bytes,
                                                 const at::Tensor& other) {
  if (bytes == 0) return std::nullopt;
  std::vector<const at::Tensor*> all;
  for (const at::Tensor& t : ts) {
    if (size_t(asParts(t).numel()) * asParts(t).element_size() != bytes) return std::nullopt;
    all.push_back(&t);
  }
  all.push_back(&other);
  auto blocks = disjointCpuBlocks(all);
  if (blocks) blocks->pop_back();
  return blocks;
}

}  // namespace

const Algorithm* ProcessGroupRingx::inPlaceAlgorithm(const CollArgs& args) const {
  try {
    const Algorithm& chosen = selectAlgorithm(args, algo_);
    return takesSeparateBlocks(chosen) ? &chosen : nullptr;
  } catch (const Error&) {
    return nullptr;  // submit() reports the bad override
  }
}

bool ProcessGroupRingx::takeBlocksInPlace(Call& call, CollArgs& args, const std::vector<at::Tensor>& ts,
                                          const at::Tensor& other) const {
  auto blocks = separateBlocks(ts, args.bytes(), other);
  if (!blocks) return false;
  const Algorithm* chosen = inPlaceAlgorithm(args);
  if (!chosen) return false;
  args.blocks = std::move(*blocks);
  call.algorithm = chosen;
  return true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::submitIntoList(Call& call, CollArgs& a,
                                                                 const std::vector<at::Tensor>& targets,
                                                                 const at::Tensor& src,
                                                                 std::vector<at::Tensor> keep) {
  if (auto direct = adjacentFlat(targets, src)) {
    a.buf = direct->data_ptr();
    return submit(call, a, std::move(keep), targets, nullptr);
  }
  if (takeBlocksInPlace(call, a, targets, src)) return submit(call, a, std::move(keep), targets, nullptr);
  at::Tensor flat = at::empty({int64_t(size_) * src.numel()}, src.options());
  a.buf = flat.data_ptr();
  keep.push_back(flat);
  return submit(call, a, std::move(keep), targets,
                [outs = targets, flat]() mutable { unflatten(flat, outs); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  Call call = begin("broadcast", c10d::OpType::BROADCAST, opts.timeout, opts.asyncOp);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  call.recorded = {t};
  checkRoot(call.ctx, opts.rootRank);
  if (opts.rootTensor != 0) throwValueError(call.ctx, "rootTensor must be 0 with one tensor per call");
  Staged st = stage(asParts(t));
  CollArgs a = argsFor(call, Collective::Broadcast);
  a.dtype = toDType(call.ctx, st.buf.scalar_type());
  a.buf = st.buf.data_ptr();
  a.count = size_t(st.buf.numel());
  a.root = int(opts.rootRank);
  return submit(call, a, {t, st.buf}, {t}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  Call call = begin("all_gather", c10d::OpType::ALLGATHER, opts.timeout, opts.asyncOp);
  const at::Tensor& in = singleTensor(call.ctx, inputs);
  call.recorded = {in};
  if (outputs.size() != 1) {
    throwValueError(call.ctx, "expects one output list per input tensor, got " + std::to_string(outputs.size()));
  }
  auto& outs = outputs[0];
  checkListLength(call.ctx, outs.size(), "output");
  for (size_t i = 0; i < outs.size(); ++i) checkSameType(call.ctx, in, "the input", outs[i], "output tensor " + std::to_string(i));
  at::Tensor src = asParts(in).contiguous();
  CollArgs a = argsFor(call, Collective::AllGather);
  a.dtype = toDType(call.ctx, src.scalar_type());
  a.input = src.data_ptr();
  a.count = size_t(src.numel());
  std::vector<at::Tensor> keep = outs;
  keep.insert(keep.end(), {in, src});
  return submitIntoList(call, a, outs, src, std::move(keep));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  Call call = begin("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, opts.timeout, opts.asyncOp);
  checkSameDtype(call.ctx, output, input);
  call.title = "all_gather";
  call.recorded = {input};
  if (output.numel() != input.numel() * size_) {
    throwValueError(call.ctx, "output has " + std::to_string(output.numel()) + " elements, expected " +
                                  std::to_string(input.numel() * size_) + " (world size x input elements)");
  }
  at::Tensor src = asParts(input).contiguous();
  Staged st = stage(asParts(output));
  CollArgs a = argsFor(call, Collective::AllGather);
  a.dtype = toDType(call.ctx, src.scalar_type());
  a.buf = st.buf.data_ptr();
  a.input = src.data_ptr();
  a.count = size_t(src.numel());
  return submit(call, a, {input, src, output, st.buf}, {output}, std::move(st.publish));
}

// outputLists[r][i] receives rank r's inputs[i]; one all_gather of every
// input back to back serves them all.
c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Call call = begin("all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED, opts.timeout, opts.asyncOp);
  call.title = "all_gather";
  call.recorded = inputs;
  if (inputs.empty()) throwValueError(call.ctx, "got an empty input list");
  checkListLength(call.ctx, outputLists.size(), "output");
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkDevice(call.ctx, inputs[i]);
    if (inputs[i].scalar_type() != inputs[0].scalar_type()) {
      throwTypeError(call.ctx, "all input tensors must have one dtype; got " +
                                   std::string(c10::toString(inputs[i].scalar_type())) + " and " +
                                   std::string(c10::toString(inputs[0].scalar_type())));
    }
  }
  for (size_t r = 0; r < outputLists.size(); ++r) {
    if (outputLists[r].size() != inputs.size()) {
      throwValueError(call.ctx, "output list " + std::to_string(r) + " has " + std::to_string(outputLists[r].size()) +
                                    " tensors, expected " + std::to_string(inputs.size()) + " (one per input)");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkSameType(call.ctx, inputs[i], "input tensor " + std::to_string(i), outputLists[r][i],
                    "output tensor [" + std::to_string(r) + "][" + std::to_string(i) + "]");
    }
  }
  at::Tensor src = flatCat(inputs);
  at::Tensor flat = at::empty({int64_t(size_) * src.numel()}, src.options());
  CollArgs a = argsFor(call, Collective::AllGather);
  a.dtype = toDType(call.ctx, src.scalar_type());
  a.buf = flat.data_ptr();
  a.input = src.data_ptr();
  a.count = size_t(src.numel());
  std::vector<at::Tensor> targets, keep = inputs;
  for (const auto& list : outputLists) targets.insert(targets.end(), list.begin(), list.end());
  keep.insert(keep.end(), targets.begin(), targets.end());
  keep.insert(keep.end(), {src, flat});
  // `flat` is rank 0's inputs, then rank 1's, ...: the order of `targets`.
  return submit(call, a, keep, targets, [targets, flat]() mutable { unflatten(flat, targets); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  Call call = begin("all_gather_into_tensor_coalesced", c10d::OpType::COALESCED, opts.timeout, opts.asyncOp);
  call.title = "all_gather";
  call.recorded = inputs;
  if (inputs.empty() || inputs.size() != outputs.size()) {
    throwValueError(call.ctx, std::to_string(inputs.size()) + " inputs and " + std::to_string(outputs.size()) +
                                  " outputs; expected as many outputs as inputs, at least one");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkSameDtype(call.ctx, outputs[i], inputs[0]);
    checkSameDtype(call.ctx, outputs[i], inputs[i]);
    if (outputs[i].numel() != inputs[i].numel() * size_) {
      throwValueError(call.ctx, "output " + std::to_string(i) + " has " + std::to_string(outputs[i].numel()) +
                                    " elements, expected " + std::to_string(inputs[i].numel() * size_));
    }
  }
  at::Tensor src = flatCat(inputs);
  at::Tensor flat = at::empty({int64_t(size_) * src.numel()}, src.options());
  CollArgs a = argsFor(call, Collective::AllGather);
  a.dtype = toDType(call.ctx, src.scalar_type());
  a.buf = flat.data_ptr();
  a.input = src.data_ptr();
  a.count = size_t(src.numel());
  // Rank q's block of `flat` is every input of rank q, back to back.
  auto publish = [outs = outputs, flat, n = size_, block = src.numel()]() mutable {
    int64_t off = 0;
    for (auto& o : outs) {
      at::Tensor parts = asParts(o).reshape({n, -1});
      const int64_t len = parts.size(1);
      parts.copy_(flat.view({n, block}).narrow(1, off, len));
      off += len;
    }
  };
  std::vector<at::Tensor> keep = inputs;
  keep.insert(keep.end(), outputs.begin(), outputs.end());
  keep.insert(keep.end(), {src, flat});
  return submit(call, a, keep, outputs, std::move(publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  Call call = begin("gather", c10d::OpType::GATHER, opts.timeout, opts.asyncOp);
  const at::Tensor& in = singleTensor(call.ctx, inputs);
  call.recorded = {in};
  checkRoot(call.ctx, opts.rootRank);
  const bool isRoot = rank_ == opts.rootRank;
  checkOnThisRankOnly(call, Collective::Gather, int(opts.rootRank),
                      [&] { checkRootList(call.ctx, opts.rootRank, outputs, "output", in, "the input"); });
  at::Tensor src = asParts(in).contiguous();
  CollArgs a = argsFor(call, Collective::Gather);
  a.dtype = toDType(call.ctx, src.scalar_type());
  a.input = src.data_ptr();
  a.count = size_t(src.numel());
  a.root = int(opts.rootRank);
  std::vector<at::Tensor> targets = isRoot ? outputs[0] : std::vector<at::Tensor>{};
  std::vector<at::Tensor> keep = targets;
  keep.insert(keep.end(), {in, src});
  if (!isRoot) return submit(call, a, keep, targets, nullptr);
  return submitIntoList(call, a, targets, src, std::move(keep));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  Call call = begin("scatter", c10d::OpType::SCATTER, opts.timeout, opts.asyncOp);
  const at::Tensor& out = singleTensor(call.ctx, outputs);
  checkRoot(call.ctx, opts.rootRank);
  const bool isRoot = rank_ == opts.rootRank;
  at::Tensor flat;
  checkOnThisRankOnly(call, Collective::Scatter, int(opts.rootRank),
                      [&] { checkRootList(call.ctx, opts.rootRank, inputs, "input", out, "the output"); });
  Staged st = stage(asParts(out));
  CollArgs a = argsFor(call, Collective::Scatter);
  a.dtype = toDType(call.ctx, st.buf.scalar_type());
  a.buf = st.buf.data_ptr();
  a.count = size_t(st.buf.numel());
  a.root = int(opts.rootRank);
  std::vector<at::Tensor> keep{out, st.buf};
  if (isRoot) {
    call.recorded = inputs[0];
    keep.insert(keep.end(), inputs[0].begin(), inputs[0].end());
    flat = adjacentFlat(inputs[0], st.buf).value_or(at::Tensor());
    if (!flat.defined() && !takeBlocksInPlace(call, a, inputs[0], st.buf)) flat = flatCat(inputs[0]);
    if (flat.defined()) {
      a.input = flat.data_ptr();
      keep.push_back(flat);
    }
  }
  return submit(call, a, keep, {out}, std::move(st.publish));
}

// Splits count rows of dim 0; a row is every element of the other dims.
CollArgs ProcessGroupRingx::allToAllArgs(const Call& call, const at::Tensor& src, const at::Tensor& dst,
                                         const std::vector<int64_t>& outputSplitSizes,
                                         const std::vector<int64_t>& inputSplitSizes) const {
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which,
                    std::vector<size_t>& bytes, std::vector<size_t>& offsets) {
    const int64_t rows = t.dim() ? t.size(0) : 1;
    const int64_t rowElems = rows ? t.numel() / rows : 0;
    const size_t rowBytes = size_t(rowElems) * t.element_size();
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      if (rows % size_) {
        throwValueError(call.ctx, std::string(which) + " has " + std::to_string(rows) +
                                      " rows, which do not split evenly over " + std::to_string(size_) +
                                      " ranks; pass split sizes");
      }
      s.assign(size_, rows / size_);
    }
    if (int(s.size()) != size_) {
      throwValueError(call.ctx, std::string(which) + " split sizes have " + std::to_string(s.size()) +
                                    " entries, expected " + std::to_string(size_) + " (one per rank)");
    }
    for (int64_t v : s) {
      if (v < 0) throwValueError(call.ctx, std::string(which) + " split sizes must not be negative");
    }
    const int64_t total = std::accumulate(s.begin(), s.end(), int64_t{0});
    if (total != rows) {
      throwValueError(call.ctx, std::string(which) + " split sizes add up to " + std::to_string(total) +
                                    " but the tensor has " + std::to_string(rows) + " rows in dim 0");
    }
    size_t off = 0;
    for (int64_t v : s) {
      offsets.push_back(off);
      bytes.push_back(size_t(v) * rowBytes);
      off += size_t(v) * rowBytes;
    }
  };
  CollArgs a = argsFor(call, Collective::AllToAll);
  a.dtype = toDType(call.ctx, src.scalar_type());
  layout(src, inputSplitSizes, "input", a.sendBytes, a.sendOffsets);
  layout(dst, outputSplitSizes, "output", a.recvBytes, a.recvOffsets);
  if (a.sendBytes[rank_] != a.recvBytes[rank_]) {
    throwValueError(call.ctx, "this rank sends itself " + std::to_string(a.sendBytes[rank_]) +
                                  " bytes but expects to receive " + std::to_string(a.recvBytes[rank_]));
  }
  a.input = src.data_ptr();
  a.buf = dst.data_ptr();
  a.count = size_t(src.numel());
  a.evenSplits = outputSplitSizes.empty() && inputSplitSizes.empty();
  return a;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& outputSplitSizes,
                                                                std::vector<int64_t>& inputSplitSizes,
                                                                const c10d::AllToAllOptions& opts) {
  Call call = begin("all_to_all_single", c10d::OpType::ALLTOALL_BASE, opts.timeout, opts.asyncOp);
  checkSameDtype(call.ctx, output, input);
  call.title = "all_to_all";
  call.recorded = {input};
  at::Tensor src = asParts(input).contiguous();
  Staged st = stage(asParts(output));
  CollArgs a = allToAllArgs(call, src, st.buf, outputSplitSizes, inputSplitSizes);
  return submit(call, a, {input, src, output, st.buf}, {output}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  Call call = begin("all_to_all", c10d::OpType::ALLTOALL, opts.timeout, opts.asyncOp);
  call.recorded = inputs;
  checkListLength(call.ctx, inputs.size(), "input");
  checkListLength(call.ctx, outputs.size(), "output");
  for (int i = 0; i < size_; ++i) {
    checkSameDtype(call.ctx, outputs[i], inputs[0]);
    checkSameDtype(call.ctx, inputs[i], inputs[0]);
  }
  // One flat buffer each way, one split (in elements) per tensor: the
  // tensors themselves when they lie back to back (split or chunk views of
  // one tensor) and the input run does not overlap the output run; else,
  // when the single copy is chosen, the separate tensors in place; else a
  // packed copy.
  std::vector<int64_t> inSplits, outSplits;
  for (const auto& t : inputs) inSplits.push_back(asParts(t).numel());
  for (const auto& t : outputs) outSplits.push_back(asParts(t).numel());
  const auto options = asParts(inputs[0]).options();
  std::optional<at::Tensor> outRun = backToBack(outputs);
  at::Tensor out = outRun ? *outRun
                          : at::empty({std::accumulate(outSplits.begin(), outSplits.end(), int64_t{0})}, options);
  std::optional<at::Tensor> inRun = backToBack(inputs);
  if (inRun && overlaps(*inRun, out)) inRun.reset();
  at::Tensor in =
      inRun ? *inRun : at::empty({std::accumulate(inSplits.begin(), inSplits.end(), int64_t{0})}, options);
  CollArgs a = allToAllArgs(call, in, out, outSplits, inSplits);
  std::vector<at::Tensor> targets = outputs;
  std::vector<at::Tensor> keep = inputs;
  keep.insert(keep.end(), outputs.begin(), outputs.end());
  keep.insert(keep.end(), {in, out});
  if (!inRun || !outRun) {
    std::vector<const at::Tensor*> all;
    for (const auto& t : inputs) all.push_back(&t);
    for (const auto& t : outputs) all.push_back(&t);
    auto blocks = a.cma ? disjointCpuBlocks(all) : std::nullopt;
    const Algorithm* chosen = blocks ? inPlaceAlgorithm(a) : nullptr;
    if (chosen) {
      a.inputBlocks.assign(blocks->begin(), blocks->begin() + size_);
      a.blocks.assign(blocks->begin() + size_, blocks->end());
      call.algorithm = chosen;
      return submit(call, a, keep, outputs, nullptr);
    }
  }
  if (!inRun) at::cat_out(in, flatParts(inputs));
  if (outRun) return submit(call, a, keep, outputs, nullptr);
  return submit(call, a, keep, outputs, [targets, out]() mutable { unflatten(out, targets); });
}

}  // namespace ringx
