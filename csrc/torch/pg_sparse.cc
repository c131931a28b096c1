// all_reduce(SUM) of sparse COO tensors, as gloo does it: every rank's
// indices and values are gathered, concatenated and coalesced. The ranks'
// nonzero counts differ, so their sizes are gathered first; each gather runs
// to completion on the calling thread, and the Work returned is already
// complete.
#include <algorithm>

#include "torch/process_group_ringx.hpp"
#include "torch/staging.h"

namespace ringx {

at::Tensor ProcessGroupRingx::gatherAll(const char* op, const at::Tensor& src, std::chrono::milliseconds timeout) {
  Call call = begin(op, c10d::OpType::ALLGATHER, timeout, false);
  call.title.clear();
  at::Tensor in = asParts(src).contiguous().reshape({-1});
  at::Tensor out = at::empty({int64_t(size_) * in.numel()}, in.options());
  CollArgs a = argsFor(call, Collective::AllGather);
  a.dtype = toDType(call.ctx, in.scalar_type());
  a.buf = out.data_ptr();
  a.input = in.data_ptr();
  a.count = size_t(in.numel());
  submit(call, a, {in, out}, {out}, nullptr)->wait();
  return out;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allreduceSparse(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  Call call = begin("all_reduce", c10d::OpType::ALLREDUCE, opts.timeout, opts.asyncOp);
  if (opts.reduceOp != c10d::ReduceOp::SUM) {
    throwValueError(call.ctx, "sparse tensors reduce only with ReduceOp.SUM (as in gloo); densify the tensor "
                              "(.to_dense()) for other ops");
  }
  if (held_) throwValueError(call.ctx, "a sparse all_reduce cannot be coalesced; call it after the block ends");
  if (!t.device().is_cpu()) throwTypeError(call.ctx, "sparse tensors on " + t.device().str() + " are not supported");
  auto work = c10::make_intrusive<WorkRingx>(rank_, c10d::OpType::ALLREDUCE, "ringx:sparse_all_reduce",
                                             std::vector<at::Tensor>{t}, std::vector<at::Tensor>{t}, call.ctx.seq, comm_);
  work->opName = "all_reduce";
  const at::Tensor in = t.coalesce();
  const at::Tensor indices = in.indices(), values = in.values();
  const int64_t nnz = in._nnz(), sparseDim = in.sparse_dim();

  // Every rank's nonzero count, then its shape: ranks must agree on the shape.
  std::vector<int64_t> meta{nnz, sparseDim, in.dense_dim()};
  for (int64_t s : in.sizes()) meta.push_back(s);
  at::Tensor metas = gatherAll("all_reduce", at::tensor(meta, at::kLong), opts.timeout).view({size_, -1});
  auto shapeOf = [&](int r) {
    std::string dims;
    for (int64_t d = 3; d < metas.size(1); ++d) dims += (d > 3 ? ", " : "") + std::to_string(metas[r][d].item<int64_t>());
    return "[" + dims + "] with " + std::to_string(metas[r][1].item<int64_t>()) + " sparse dims";
  };
  std::vector<int64_t> counts(size_);
  for (int r = 0; r < size_; ++r) {
    if (!metas[r].slice(0, 1).equal(metas[rank_].slice(0, 1))) {
      throwValueError(call.ctx, "rank " + std::to_string(r) + " passed a sparse tensor of shape " + shapeOf(r) +
                                    ", this rank one of shape " + shapeOf(rank_) + "; all ranks must pass one shape");
    }
    counts[size_t(r)] = metas[r][0].item<int64_t>();
  }
  const int64_t most = *std::max_element(counts.begin(), counts.end());

  // Indices and values, each rank's padded to the largest count.
  at::Tensor idx = at::zeros({sparseDim, most}, indices.options());
  idx.narrow(1, 0, nnz).copy_(indices);
  std::vector<int64_t> valShape = values.sizes().vec();
  valShape[0] = most;
  at::Tensor val = at::zeros(valShape, values.options());
  val.narrow(0, 0, nnz).copy_(values);
  at::Tensor allIdx = gatherAll("all_reduce", idx, opts.timeout).view({size_, sparseDim, most});
  at::Tensor allVal = gatherAll("all_reduce", val, opts.timeout);

  std::vector<int64_t> perRank{size_};
  for (int64_t s : asParts(val).sizes()) perRank.push_back(s);
  at::Tensor valParts = allVal.view(perRank);
  std::vector<at::Tensor> idxs, vals;
  for (int r = 0; r < size_; ++r) {
    idxs.push_back(allIdx[r].narrow(1, 0, counts[size_t(r)]));
    at::Tensor v = valParts[r].narrow(0, 0, counts[size_t(r)]);
    vals.push_back(values.is_complex() ? at::view_as_complex(v.contiguous()) : v);
  }
  at::Tensor sum = at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals, 0), in.sizes(), in.options()).coalesce();
  t.copy_(sum);
  work->markDone(nullptr);
  work->completeFuture(nullptr);
  return work;
}

}  // namespace ringx
