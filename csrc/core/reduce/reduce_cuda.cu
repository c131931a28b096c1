// CUDA reduction kernels. The arithmetic, the conversions and which dtype x op
// pairs exist all come from reduce_functors.h, and the dispatch tables are
// built by the same generator as the CPU ones, so the two paths cannot drift.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/common/error.h"
#include "core/reduce/reduce_cuda.h"
#include "core/reduce/reduce_functors.h"

namespace ringx {
namespace {

using reduce::Elem;
using reduce::OpFor;

// Elements move in 16-byte packs (one vector load or store per thread) where
// the pointers allow it: a memory-bound kernel needs wide accesses to reach
// full bandwidth.
constexpr size_t kPackBytes = 16;

template <class S>
struct alignas(kPackBytes) Pack {
  static constexpr size_t kSize = kPackBytes / sizeof(S);
  S v[kSize];
};

constexpr unsigned kThreads = 256;
// 1024 blocks of 256 threads fill every SM of current GPUs (an H100 holds
// about 1056 such blocks at once); larger buffers are covered by the
// grid-stride loops rather than by more blocks.
constexpr size_t kMaxBlocks = 1024;

// How a buffer is walked: `head` elements one by one up to the first pack
// boundary, then `packs` whole packs, then the remaining elements one by one.
// Two pointers that are not equally misaligned never reach a boundary
// together, so they are walked element by element throughout.
struct Split {
  size_t head;
  size_t packs;
};

template <class S>
Split splitFor(const void* a, const void* b, size_t count) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(a) % kPackBytes;
  if (reinterpret_cast<uintptr_t>(b) % kPackBytes != offset || offset % sizeof(S) != 0) return {count, 0};
  const size_t head = std::min(count, ((kPackBytes - offset) % kPackBytes) / sizeof(S));
  return {head, (count - head) / Pack<S>::kSize};
}

// dst[i] = step(dst[i], src[i]), grid-stride. A step that ignores its second
// argument (scaling) passes src == dst and the compiler drops the dead loads.
template <class S, class Step>
__global__ void __launch_bounds__(kThreads) mapKernel(S* dst, const S* src, size_t count, Split split, Step step) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = first; i < split.head; i += stride) dst[i] = step(dst[i], src[i]);
  using P = Pack<S>;
  P* dstPacks = reinterpret_cast<P*>(dst + split.head);
  const P* srcPacks = reinterpret_cast<const P*>(src + split.head);
  for (size_t p = first; p < split.packs; p += stride) {
    P x = dstPacks[p];
    const P y = srcPacks[p];
#pragma unroll
    for (size_t j = 0; j < P::kSize; ++j) x.v[j] = step(x.v[j], y.v[j]);
    dstPacks[p] = x;
  }
  for (size_t i = split.head + split.packs * P::kSize + first; i < count; i += stride) dst[i] = step(dst[i], src[i]);
}

template <class S, class Step>
void launch(S* dst, const S* src, size_t count, Step step, cudaStream_t stream, const char* what) {
  if (count == 0) return;
  const Split split = splitFor<S>(dst, src, count);
  // The head and tail loops each need at most the loose-element count of threads.
  const size_t loose = count - split.packs * Pack<S>::kSize;
  const size_t threads = std::max(split.packs, loose);
  const size_t blocks = std::min(kMaxBlocks, (threads + kThreads - 1) / kThreads);
  mapKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dst, src, count, split, step);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw Error(ErrorKind::Internal, std::string(what) + ": CUDA kernel launch failed: " + cudaGetErrorString(err));
  }
}

template <DType D, ReduceOp O>
struct ReduceStep {
  using E = Elem<D>;
  __device__ typename E::Storage operator()(typename E::Storage d, typename E::Storage s) const {
    return E::store(OpFor<D, O>{}(E::load(d), E::load(s)));
  }
};

template <DType D>
struct ScaleStep {
  using E = Elem<D>;
  typename E::Acc factor;
  __device__ typename E::Storage operator()(typename E::Storage d, typename E::Storage) const {
    return E::store(E::load(d) * factor);
  }
};

using ReduceLauncher = void (*)(void* dst, const void* src, size_t count, cudaStream_t stream);
using ScaleLauncher = void (*)(void* buf, size_t count, double factor, cudaStream_t stream);

template <DType D, ReduceOp O>
void launchReduce(void* dst, const void* src, size_t count, cudaStream_t stream) {
  using S = typename Elem<D>::Storage;
  launch(static_cast<S*>(dst), static_cast<const S*>(src), count, ReduceStep<D, O>{}, stream, "reduceCuda");
}

template <DType D>
void launchScale(void* buf, size_t count, double factor, cudaStream_t stream) {
  using S = typename Elem<D>::Storage;
  S* b = static_cast<S*>(buf);
  const ScaleStep<D> step{static_cast<typename Elem<D>::Acc>(factor)};
  launch(b, static_cast<const S*>(b), count, step, stream, "scaleCuda");
}

template <DType D, ReduceOp O>
struct PickReduce {
  static constexpr ReduceLauncher get() { return &launchReduce<D, O>; }
};

template <DType D>
struct PickScale {
  static constexpr ScaleLauncher get() { return &launchScale<D>; }
};

constexpr auto kReduce = reduce::makeOpTable<ReduceLauncher, PickReduce>();
constexpr auto kScale = reduce::makeFloatTable<ScaleLauncher, PickScale>();

}  // namespace

void reduceCuda(void* dst, const void* src, size_t count, DType dtype, ReduceOp op, cudaStream_t stream) {
  reduce::lookup(kReduce, dtype, op)(dst, src, count, stream);
}

void scaleCuda(void* buf, size_t count, DType dtype, double factor, cudaStream_t stream) {
  reduce::lookup(kScale, dtype)(buf, count, factor, stream);
}

}  // namespace ringx
