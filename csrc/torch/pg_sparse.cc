// all_reduce(SUM) of sparse COO tensors, as gloo does it: every rank's
// indices and values are gathered, concatenated and coalesced. One op does
// all of it in the background, so the call returns at once, as gloo's does:
// each rank first sends every other its shape and nonzero count, then its
// indices and values, whose receives are sized once the counts are in
// (LateExtent). The op moves its data as tagged messages: the shared-memory
// and single-copy all_gathers reserve their chunks when they are built, which
// would need the counts on the calling thread.
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <array>
#include <memory>

#include "core/algorithms/identity.h"
#include "core/algorithms/shm_steps.h"
#include "torch/process_group_ringx.hpp"

namespace ringx {
namespace {

// What a rank tells the others first, padded to a fixed length.
constexpr int64_t kMaxDims = 64;
// The dtype of the values travels with the op's identity (addIdentityChecks).
enum MetaWord : size_t { kNnz, kSparseDims, kDims, kSizes };
using Meta = std::array<int64_t, kSizes + size_t(kMaxDims)>;

int64_t roundUp64(int64_t n) { return (n + 63) / 64 * 64; }

// Where a rank's indices and values lie in its block: indices first, values
// from a 64-byte boundary, so each views as its own dtype. Once the ranks
// agree on the shape, their blocks differ only in the nonzero count.
struct BlockLayout {
  int64_t sparseDims = 0, valueAt = 0, bytes = 0;
  std::vector<int64_t> valueShape;  // first dimension: the nonzero count
  at::ScalarType valueType = at::kFloat;
  size_t elementSize = 0;

  BlockLayout(int64_t sparseDims, const at::Tensor& values)
      : sparseDims(sparseDims),
        valueShape(values.sizes().vec()),
        valueType(values.scalar_type()),
        elementSize(values.element_size()) {
    resize(valueShape[0]);
  }
  BlockLayout withRows(int64_t nnz) const {
    BlockLayout l = *this;
    l.resize(nnz);
    return l;
  }
  at::Tensor indices(std::byte* block) const {
    return at::from_blob(block, {sparseDims, valueShape[0]}, at::kLong);
  }
  at::Tensor values(std::byte* block) const {
    return at::from_blob(block + valueAt, valueShape, at::TensorOptions().dtype(valueType));
  }

 private:
  void resize(int64_t nnz) {
    valueShape[0] = nnz;
    valueAt = roundUp64(sparseDims * nnz * int64_t(sizeof(int64_t)));
    bytes = valueAt + c10::multiply_integers(valueShape) * int64_t(elementSize);
  }
};

std::string describe(const Meta& m) {
  std::string dims;
  for (int64_t d = 0; d < std::min(m[kDims], kMaxDims); ++d) {
    dims += (d ? ", " : "") + std::to_string(m[kSizes + size_t(d)]);
  }
  return "[" + dims + "] with " + std::to_string(m[kSparseDims]) + " sparse dims";
}

// Everything the op's steps and its publication share. No torch objects:
// the schedule holding it may be released after torch at exit.
struct SparseExchange {
  explicit SparseExchange(BlockLayout mine) : layout(std::move(mine)) {}
  BlockLayout layout;  // of this rank's block
  int rank = 0;
  std::vector<Meta> metas;                         // every rank's; this rank's is sent
  std::vector<std::unique_ptr<std::byte[]>> from;  // the peers' blocks, once sized
  std::vector<LateExtent> extents;                 // the peers' receives; at `rank`, this rank's send
  std::string prefix;                              // of the op's messages
  std::string mismatch;                            // set when the ranks passed different shapes

  // Runs once every rank's meta has arrived: sizes the data transfers, or,
  // when the ranks disagree, makes them empty on every rank alike (each sees
  // the same metas) and leaves the error to the publication, so the group
  // stays in step and usable, as after a call refused at once.
  void size() {
    const Meta& mine = metas[size_t(rank)];
    for (size_t r = 0; r < metas.size() && mismatch.empty(); ++r) {
      if (!std::equal(metas[r].begin() + kSparseDims, metas[r].end(), mine.begin() + kSparseDims)) {
        mismatch = "rank " + std::to_string(r) + " passed a sparse tensor of shape " + describe(metas[r]) +
                   ", this rank one of shape " + describe(mine) + "; all ranks must pass one shape";
      }
    }
    if (!mismatch.empty()) {
      for (auto& e : extents) e.bytes = 0;
      return;
    }
    for (size_t r = 0; r < metas.size(); ++r) {
      if (int(r) == rank) continue;
      extents[r].bytes = size_t(layout.withRows(metas[r][kNnz]).bytes);
      from[r] = std::make_unique_for_overwrite<std::byte[]>(extents[r].bytes ? extents[r].bytes : 1);
      extents[r].data = from[r].get();
    }
  }
};

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allreduceSparse(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  Call call = begin("all_reduce", c10d::OpType::ALLREDUCE, opts.timeout, opts.asyncOp);
  if (opts.reduceOp != c10d::ReduceOp::SUM) {
    throwValueError(call.ctx, "sparse tensors reduce only with ReduceOp.SUM (as in gloo); densify the tensor "
                              "(.to_dense()) for other ops");
  }
  if (held_) throwValueError(call.ctx, "a sparse all_reduce cannot be coalesced; call it after the block ends");
  if (!t.device().is_cpu()) throwTypeError(call.ctx, "sparse tensors on " + t.device().str() + " are not supported");
  if (t.dim() > kMaxDims) {
    throwValueError(call.ctx, "sparse tensors of more than " + std::to_string(kMaxDims) +
                                  " dimensions are not supported; this one has " + std::to_string(t.dim()));
  }
  const at::Tensor in = t.coalesce();
  const at::Tensor values = in.values();
  const int64_t nnz = in._nnz(), sparseDims = in.sparse_dim();
  const DType valueType = toDType(call.ctx, values.scalar_type());
  auto x = std::make_shared<SparseExchange>(BlockLayout(sparseDims, values));
  const BlockLayout& layout = x->layout;
  x->rank = rank_;
  x->metas.assign(size_t(size_), Meta{});
  x->from.resize(size_t(size_));
  x->extents.resize(size_t(size_));
  Meta& meta = x->metas[size_t(rank_)];
  meta[kNnz] = nnz;
  meta[kSparseDims] = sparseDims;
  meta[kDims] = in.dim();
  for (int64_t d = 0; d < in.dim(); ++d) meta[kSizes + size_t(d)] = in.size(d);

  // The padding between indices and values is never read.
  at::Tensor mine = at::empty({layout.bytes}, at::kByte);
  auto* block = static_cast<std::byte*>(mine.data_ptr());
  layout.indices(block).copy_(in.indices());
  layout.values(block).copy_(values);
  x->extents[size_t(rank_)] = {block, size_t(layout.bytes)};

  auto build = [&](uint64_t seq) {
    x->prefix = call.ctx.prefix();
    Schedule s(DType::U8, ReduceOp::Sum);
    s.setAlgorithm("sparse");
    std::vector<StepId> told;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      s.send(p, collTag(seq, 0), &meta, sizeof(Meta));
      told.push_back(s.recv(p, collTag(seq, 0), &x->metas[size_t(p)], sizeof(Meta)));
    }
    // A rank in another collective then fails at once instead of reading
    // its messages as counts.
    CollArgs a = argsFor(call, Collective::AllReduce);
    a.seq = seq;
    a.dtype = valueType;
    CollIdentity id = identityOf(a);
    id.flags |= kSparse;
    addIdentityChecks(s, a, id);
    // Peers on this host in a shared-memory or single-copy collective read
    // headers, not messages: the identity also goes through one empty chunk,
    // as a barrier's, where such a peer finds it in place of its own call's.
    if (ShmArea* shm = a.shm) {
      const uint64_t chunk = shm->reserveChunks(1);
      shmReadAll(s, shm, chunk, id, [](int) {}, shmCopyIn(s, shm, chunk, id, [](std::byte*) {}, kNoStep));
    }
    const StepId sized = s.poll(
        [x] {
          x->size();
          return true;
        },
        nullptr, {s.join(told)});
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      s.sendLate(p, collTag(seq, 1), &x->extents[size_t(rank_)], {sized});
      s.recvLate(p, collTag(seq, 1), &x->extents[size_t(p)], {sized});
    }
    return s;
  };

  // Runs where the op ends, on the progress thread or a waiting caller. The
  // sum becomes the caller's tensor, so it is made outside inference mode
  // (later in-place updates, DDP's division among them, must be able to
  // touch it) and without autograd recording the overwrite.
  auto publish = [t, x, mine, sizes = in.sizes().vec(), options = in.options()]() mutable {
    if (!x->mismatch.empty()) throw Error(ErrorKind::InvalidArgument, x->prefix + x->mismatch);
    c10::InferenceMode normalTensors(false);
    at::NoGradGuard noGrad;
    std::vector<at::Tensor> idxs, vals;
    for (size_t r = 0; r < x->metas.size(); ++r) {
      const bool own = int(r) == x->rank;
      const BlockLayout rankLayout = x->layout.withRows(x->metas[r][kNnz]);
      std::byte* data = own ? static_cast<std::byte*>(mine.data_ptr()) : x->from[r].get();
      idxs.push_back(rankLayout.indices(data));
      vals.push_back(rankLayout.values(data));
    }
    t.copy_(at::sparse_coo_tensor(at::cat(idxs, 1), at::cat(vals, 0), sizes, options).coalesce());
  };

  call.title = "sparse_all_reduce";
  call.recorded = {t};
  return submitBuilt(call, build, {mine}, {t}, std::move(publish));
}

}  // namespace ringx
