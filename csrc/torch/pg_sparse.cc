// all_reduce(SUM) of sparse COO tensors, as gloo does it: every rank's
// indices and values are gathered, concatenated and coalesced. The ranks'
// nonzero counts differ, so they are gathered first, on the calling thread:
// the call returns once every rank has made it. Indices and values then move
// as one all_gather of bytes, in the background like any other collective,
// and the sum is built into the caller's tensor when it has arrived (gloo
// does all of it on its worker thread).
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "torch/process_group_ringx.hpp"
#include "torch/staging.h"

namespace ringx {
namespace {

// Where each rank's indices and values lie in its block of the gathered
// bytes: both start on a 64-byte boundary, so each views as its own dtype.
struct SparseLayout {
  int64_t sparseDim = 0;
  int64_t most = 0;  // the largest nonzero count: every rank's block is padded to it
  std::vector<int64_t> valueShape;  // of one block's values, first dimension `most`
  at::ScalarType valueType = at::kFloat;
  int64_t indexBytes = 0, valueAt = 0, valueBytes = 0, block = 0;

  SparseLayout(int64_t sparseDim, int64_t most, const at::Tensor& values)
      : sparseDim(sparseDim), most(most), valueShape(values.sizes().vec()), valueType(values.scalar_type()) {
    valueShape[0] = most;
    indexBytes = sparseDim * most * int64_t(sizeof(int64_t));
    valueBytes = c10::multiply_integers(valueShape) * int64_t(values.element_size());
    valueAt = roundUp(indexBytes);
    block = roundUp(valueAt + valueBytes);
  }
  static int64_t roundUp(int64_t n) { return (n + 63) / 64 * 64; }

  at::Tensor indices(const at::Tensor& rankBytes) const {
    return rankBytes.narrow(0, 0, indexBytes).view(at::kLong).view({sparseDim, most});
  }
  at::Tensor values(const at::Tensor& rankBytes) const {
    return rankBytes.narrow(0, valueAt, valueBytes).view(valueType).view(valueShape);
  }
};

}  // namespace

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
  const SparseLayout layout(sparseDim, *std::max_element(counts.begin(), counts.end()), values);

  // The padding is never read.
  at::Tensor mine = at::empty({layout.block}, at::kByte);
  layout.indices(mine).narrow(1, 0, nnz).copy_(indices);
  layout.values(mine).narrow(0, 0, nnz).copy_(values);
  at::Tensor all = at::empty({int64_t(size_) * layout.block}, at::kByte);

  // Runs where the gather ends, on the progress thread or a waiting caller.
  // The sum becomes the caller's tensor, so it is made outside inference
  // mode (later in-place updates, DDP's division among them, must be able
  // to touch it) and without autograd recording the overwrite.
  auto publish = [t, all, counts, layout, sizes = in.sizes().vec(), options = in.options()]() mutable {
    c10::InferenceMode normalTensors(false);
    at::NoGradGuard noGrad;
    std::vector<at::Tensor> idxs, vals;
    for (size_t r = 0; r < counts.size(); ++r) {
      const at::Tensor rankBytes = all.narrow(0, int64_t(r) * layout.block, layout.block);
      idxs.push_back(layout.indices(rankBytes).narrow(1, 0, counts[r]));
      vals.push_back(layout.values(rankBytes).narrow(0, 0, counts[r]));
    }
    t.copy_(at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals, 0), sizes, options).coalesce());
  };

  call.title = "sparse_all_reduce";
  call.recorded = {t};
  CollArgs a = argsFor(call, Collective::AllGather);
  a.dtype = toDType(call.ctx, at::kByte);
  a.buf = all.data_ptr();
  a.input = mine.data_ptr();
  a.count = size_t(layout.block);
  return submit(call, a, {mine, all}, {t}, std::move(publish));
}

}  // namespace ringx
