// CUDA reduction kernels. The arithmetic, the conversions and which dtype x op
// pairs exist all come from reduce_functors.h, and the dispatch tables are
// built by the same generator as the CPU ones, so the two paths cannot drift.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "core/common/error.h"
#include "core/reduce/flags_cuda.h"
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

void check(cudaError_t err, const char* what, const char* call) {
  if (err != cudaSuccess) {
    throw Error(ErrorKind::Internal, std::string(what) + ": " + call + " failed: " + cudaGetErrorString(err));
  }
}

// How many blocks of `kernel` the current device holds at once: its SM count
// times the blocks of kThreads one SM fits with the kernel's registers. A grid
// that size is one full wave, and the grid-stride loops cover larger buffers.
// Cached per device, so that a launch on the hot path makes no query.
constexpr int kMaxDevices = 64;

template <auto kernel>
size_t residentBlocks(const char* what) {
  static std::atomic<int> cached[kMaxDevices];
  int device = 0;
  check(cudaGetDevice(&device), what, "cudaGetDevice");
  if (device < kMaxDevices) {
    const int blocks = cached[device].load(std::memory_order_relaxed);
    if (blocks != 0) return static_cast<size_t>(blocks);
  }
  int sms = 0;
  int perSm = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), what, "cudaDeviceGetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, kThreads, 0), what,
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  const int blocks = std::max(1, sms * perSm);
  if (device < kMaxDevices) cached[device].store(blocks, std::memory_order_relaxed);
  return static_cast<size_t>(blocks);
}

// How a buffer is walked: `head` elements one by one up to the first pack
// boundary, then `packs` whole packs, then the remaining elements one by one.
// Pointers that are not equally misaligned never reach a boundary together,
// so they are walked element by element throughout.
struct Split {
  size_t head;
  size_t packs;
};

template <class S>
Split splitFor(const void* const* ptrs, int n, size_t count) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(ptrs[0]) % kPackBytes;
  if (offset % sizeof(S) != 0) return {count, 0};
  for (int k = 1; k < n; ++k) {
    if (reinterpret_cast<uintptr_t>(ptrs[k]) % kPackBytes != offset) return {count, 0};
  }
  const size_t head = std::min(count, ((kPackBytes - offset) % kPackBytes) / sizeof(S));
  return {head, (count - head) / Pack<S>::kSize};
}

// Blocks for one launch over `count` elements walked as `split`: the head and
// tail loops each need at most the loose-element count of threads.
template <class S, auto kernel>
unsigned gridFor(size_t count, Split split, const char* what) {
  const size_t loose = count - split.packs * Pack<S>::kSize;
  const size_t threads = std::max(split.packs, loose);
  const size_t needed = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min(needed, residentBlocks<kernel>(what)));
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
  const void* ptrs[] = {dst, src};
  const Split split = splitFor<S>(ptrs, 2, count);
  const unsigned grid = gridFor<S, &mapKernel<S, Step>>(count, split, what);
  mapKernel<<<grid, kThreads, 0, stream>>>(dst, src, count, split, step);
  check(cudaGetLastError(), what, "kernel launch");
}

// The n-way reduce takes its source pointers by value in the kernel's
// parameters (the caller's array is host memory), so one launch reads at most
// kMaxSources of them; the parameter block stays far below the 4 KiB limit.
constexpr int kMaxSources = 32;

template <class S>
struct Sources {
  const S* p[kMaxSources];
};

// dst[i] = op(...op(srcs[0][i], srcs[1][i])..., srcs[nsrc-1][i]), combined in
// index order and in Acc (float32 for 16-bit floats), stored once. Each
// thread reads every source of an element before writing it, so dst may be
// one of the sources.
template <DType D, ReduceOp O>
__global__ void __launch_bounds__(kThreads)
    reduceNKernel(typename Elem<D>::Storage* dst, Sources<typename Elem<D>::Storage> srcs, int nsrc, size_t count,
                  Split split) {
  using E = Elem<D>;
  using S = typename E::Storage;
  using Acc = typename E::Acc;
  using P = Pack<S>;
  const OpFor<D, O> op;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto one = [&](size_t i) {
    Acc acc = E::load(srcs.p[0][i]);
    for (int k = 1; k < nsrc; ++k) acc = op(acc, E::load(srcs.p[k][i]));
    dst[i] = E::store(acc);
  };
  for (size_t i = first; i < split.head; i += stride) one(i);
  for (size_t p = first; p < split.packs; p += stride) {
    Acc acc[P::kSize];
    const P x = reinterpret_cast<const P*>(srcs.p[0] + split.head)[p];
#pragma unroll
    for (size_t j = 0; j < P::kSize; ++j) acc[j] = E::load(x.v[j]);
    for (int k = 1; k < nsrc; ++k) {
      const P y = reinterpret_cast<const P*>(srcs.p[k] + split.head)[p];
#pragma unroll
      for (size_t j = 0; j < P::kSize; ++j) acc[j] = op(acc[j], E::load(y.v[j]));
    }
    P out;
#pragma unroll
    for (size_t j = 0; j < P::kSize; ++j) out.v[j] = E::store(acc[j]);
    reinterpret_cast<P*>(dst + split.head)[p] = out;
  }
  for (size_t i = split.head + split.packs * P::kSize + first; i < count; i += stride) one(i);
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
using ReduceNLauncher = void (*)(void* dst, const void* const* srcs, int nsrc, size_t count, cudaStream_t stream);
using ScaleLauncher = void (*)(void* buf, size_t count, double factor, cudaStream_t stream);

template <DType D, ReduceOp O>
void launchReduce(void* dst, const void* src, size_t count, cudaStream_t stream) {
  using S = typename Elem<D>::Storage;
  launch(static_cast<S*>(dst), static_cast<const S*>(src), count, ReduceStep<D, O>{}, stream, "reduceCuda");
}

// Sources beyond kMaxSources take further launches, each folding the next
// ones into dst (now its first source); 16-bit floats are then rounded once
// per launch rather than once in all, and a source that dst overlaps must be
// among the first kMaxSources, which the first launch reads before writing.
template <DType D, ReduceOp O>
void launchReduceN(void* dst, const void* const* srcs, int nsrc, size_t count, cudaStream_t stream) {
  using S = typename Elem<D>::Storage;
  constexpr const char* kWhat = "reduceNCuda";
  if (nsrc < 1) {
    throw Error(ErrorKind::InvalidArgument, "n-way reduce needs at least one source, got " + std::to_string(nsrc));
  }
  if (count == 0) return;
  S* out = static_cast<S*>(dst);
  Sources<S> batch{};
  int taken = 0;
  int next = 0;
  while (next < nsrc) {
    if (next > 0) batch.p[taken++] = out;
    while (taken < kMaxSources && next < nsrc) batch.p[taken++] = static_cast<const S*>(srcs[next++]);
    const void* ptrs[kMaxSources + 1] = {out};
    std::copy(batch.p, batch.p + taken, ptrs + 1);
    const Split split = splitFor<S>(ptrs, taken + 1, count);
    const unsigned grid = gridFor<S, &reduceNKernel<D, O>>(count, split, kWhat);
    reduceNKernel<D, O><<<grid, kThreads, 0, stream>>>(out, batch, taken, count, split);
    check(cudaGetLastError(), kWhat, "kernel launch");
    taken = 0;
  }
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

template <DType D, ReduceOp O>
struct PickReduceN {
  static constexpr ReduceNLauncher get() { return &launchReduceN<D, O>; }
};

template <DType D>
struct PickScale {
  static constexpr ScaleLauncher get() { return &launchScale<D>; }
};

// Reads the flag once per thread: the host set it before the stream let
// this kernel start (waitFlag), so every thread sees the same value.
__global__ void __launch_bounds__(kThreads)
    copyUnlessFailedKernel(unsigned char* dst, const unsigned char* src, size_t bytes, Split split,
                           const volatile uint32_t* flag, uint32_t failedBit) {
  if (*flag & failedBit) return;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = first; i < split.head; i += stride) dst[i] = src[i];
  using P = Pack<unsigned char>;
  P* dstPacks = reinterpret_cast<P*>(dst + split.head);
  const P* srcPacks = reinterpret_cast<const P*>(src + split.head);
  for (size_t p = first; p < split.packs; p += stride) dstPacks[p] = srcPacks[p];
  for (size_t i = split.head + split.packs * P::kSize + first; i < bytes; i += stride) dst[i] = src[i];
}

// Loads a kernel into the current device's context (cudaFuncGetAttributes
// does, whatever CUDA_MODULE_LOADING says) and caches its occupancy, so that
// its first launch neither loads a module nor queries the device.
template <auto kernel>
void load() {
  constexpr const char* kWhat = "loadCudaKernels";
  cudaFuncAttributes attributes{};
  check(cudaFuncGetAttributes(&attributes, kernel), kWhat, "cudaFuncGetAttributes");
  residentBlocks<kernel>(kWhat);
}

using Loader = void (*)();

template <DType D, ReduceOp O>
struct PickLoadReduce {
  static constexpr Loader get() {
    return [] {
      load<&mapKernel<typename Elem<D>::Storage, ReduceStep<D, O>>>();
      load<&reduceNKernel<D, O>>();
    };
  }
};

template <DType D>
struct PickLoadScale {
  static constexpr Loader get() {
    return [] { load<&mapKernel<typename Elem<D>::Storage, ScaleStep<D>>>(); };
  }
};

constexpr auto kReduce = reduce::makeOpTable<ReduceLauncher, PickReduce>();
constexpr auto kReduceN = reduce::makeOpTable<ReduceNLauncher, PickReduceN>();
constexpr auto kScale = reduce::makeFloatTable<ScaleLauncher, PickScale>();
constexpr auto kLoadReduce = reduce::makeOpTable<Loader, PickLoadReduce>();
constexpr auto kLoadScale = reduce::makeFloatTable<Loader, PickLoadScale>();

}  // namespace

void reduceCuda(void* dst, const void* src, size_t count, DType dtype, ReduceOp op, cudaStream_t stream) {
  reduce::lookup(kReduce, dtype, op)(dst, src, count, stream);
}

void reduceNCuda(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype, ReduceOp op,
                 cudaStream_t stream) {
  reduce::lookup(kReduceN, dtype, op)(dst, srcs, nsrc, count, stream);
}

void scaleCuda(void* buf, size_t count, DType dtype, double factor, cudaStream_t stream) {
  reduce::lookup(kScale, dtype)(buf, count, factor, stream);
}

void copyUnlessFailedCuda(void* dst, const void* src, size_t bytes, const uint32_t* flag, uint32_t failedBit,
                          cudaStream_t stream) {
  constexpr const char* kWhat = "copyUnlessFailedCuda";
  if (bytes == 0) return;
  const void* ptrs[] = {dst, src};
  const Split split = splitFor<unsigned char>(ptrs, 2, bytes);
  const unsigned grid = gridFor<unsigned char, &copyUnlessFailedKernel>(bytes, split, kWhat);
  copyUnlessFailedKernel<<<grid, kThreads, 0, stream>>>(static_cast<unsigned char*>(dst),
                                                        static_cast<const unsigned char*>(src), bytes, split, flag,
                                                        failedBit);
  check(cudaGetLastError(), kWhat, "kernel launch");
}

void loadCudaKernels() {
  load<&copyUnlessFailedKernel>();
  loadFlagKernels();
  for (const auto& row : kLoadReduce) {
    for (Loader fn : row) {
      if (fn) fn();
    }
  }
  for (Loader fn : kLoadScale) {
    if (fn) fn();
  }
}

}  // namespace ringx
