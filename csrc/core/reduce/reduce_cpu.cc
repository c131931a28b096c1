// CPU reduction loops and their dtype x op tables. These are the hot loops of
// every CPU all-reduce, and memory-bound, so they are written as plain
// elementwise loops that GCC vectorises (the 16-bit conversions in
// reduce_functors.h are branch-free for the same reason).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/reduce/reduce.h"
#include "core/reduce/reduce_functors.h"

// ThreadSanitizer instruments the ifunc resolvers of target clones, which run
// before its runtime is up: TSan builds get the portable loops only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#include <immintrin.h>
#define RINGX_X86_MULTIVERSION 1
#endif

// A wheel runs on CPUs it was not built on, so instead of -march=native each
// loop is compiled for x86-64-v4 (AVX-512 F/BW/DQ/VL), x86-64-v3 (AVX2, F16C,
// FMA) and the baseline, and the dynamic loader binds the best one once per
// process through an ifunc. The loops take no __restrict: dst may equal a
// source, and GCC's runtime overlap check keeps equal pointers on the vector
// path, while __restrict would make that case undefined.
#if defined(RINGX_X86_MULTIVERSION)
#define RINGX_CPU_CLONE_TARGETS "arch=x86-64-v4", "arch=x86-64-v3", "default"
#define RINGX_CPU_CLONES __attribute__((target_clones(RINGX_CPU_CLONE_TARGETS)))
#else
#define RINGX_CPU_CLONES
#endif

namespace ringx {
namespace {

using reduce::Elem;
using reduce::OpFor;

template <DType D, ReduceOp O>
RINGX_CPU_CLONES void reduceLoop(void* dst, const void* src, size_t count) {
  using E = Elem<D>;
  using S = typename E::Storage;
  const OpFor<D, O> op;
  S* d = static_cast<S*>(dst);
  const S* s = static_cast<const S*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = E::store(op(E::load(d[i]), E::load(s[i])));
}

template <DType D, ReduceOp O>
RINGX_CPU_CLONES void reduce2Loop(void* dst, const void* a, const void* b, size_t count) {
  using E = Elem<D>;
  using S = typename E::Storage;
  const OpFor<D, O> op;
  S* d = static_cast<S*>(dst);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = E::store(op(E::load(x[i]), E::load(y[i])));
}

template <DType D>
RINGX_CPU_CLONES void copyLoop(void* dst, const void* src, size_t count) {
  using E = Elem<D>;
  using S = typename E::Storage;
  S* d = static_cast<S*>(dst);
  const S* s = static_cast<const S*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = E::store(E::load(s[i]));
}

template <DType D>
RINGX_CPU_CLONES void scaleLoop(void* buf, size_t count, double factor) {
  using E = Elem<D>;
  using S = typename E::Storage;
  using Acc = typename E::Acc;
  const Acc f = static_cast<Acc>(factor);
  S* b = static_cast<S*>(buf);
  for (size_t i = 0; i < count; ++i) b[i] = E::store(E::load(b[i]) * f);
}

void checkSourceCount(int nsrc) {
  if (nsrc < 1) {
    throw Error(ErrorKind::InvalidArgument, "n-way reduce needs at least one source, got " + std::to_string(nsrc));
  }
}

// The n-way reduce walks the buffers in blocks small enough that an
// accumulator block stays in L1 while every source streams through it once:
// the first pass combines two sources into the accumulator, each middle pass
// folds in one more, and the last folds in the final source while writing
// dst, so dst may be one of the sources. Sources are combined in index order,
// which every rank repeats, so results agree bit for bit. Each pass is one of
// the loops above, called per block (GCC vectorises these simple loops far
// better than one loop nest over the sources).
constexpr size_t kBlockBytes = 8192;

template <DType D, ReduceOp O>
void reduceNLoop(void* dst, const void* const* srcs, int nsrc, size_t count) {
  using S = typename Elem<D>::Storage;
  constexpr size_t kBlock = kBlockBytes / sizeof(S);
  checkSourceCount(nsrc);
  if (nsrc == 1) {
    copyLoop<D>(dst, srcs[0], count);
    return;
  }
  if (nsrc == 2) {
    reduce2Loop<D, O>(dst, srcs[0], srcs[1], count);
    return;
  }
  alignas(64) S acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const auto src = [&](int k) { return static_cast<const S*>(srcs[k]) + base; };
    reduce2Loop<D, O>(acc, src(0), src(1), m);
    for (int k = 2; k < nsrc - 1; ++k) reduceLoop<D, O>(acc, src(k), m);
    reduce2Loop<D, O>(static_cast<S*>(dst) + base, acc, src(nsrc - 1), m);
  }
}

// float16 is widened a block at a time into float32 scratch, combined by the
// float32 loops, and narrowed back, so it gets exactly float32's arithmetic
// followed by one rounding. Converting in its own pass is what lets it use
// F16C (every x86-64-v3 CPU), which converts eight elements per instruction
// where the portable code needs about fifteen, and gives the same bits
// (reduce_functors.h matches its rounding and NaN handling); GCC function
// multiversioning binds the F16C or the portable converter once per process.
// bfloat16 converts cheaply (a shift in, an add and a shift out), so its
// two-buffer loops convert inline, one pass instead of three; only its n-way
// reduce takes the block path, which GCC vectorises better than mixed-type
// loops over many sources. The 8-bit floats take it too, so that an n-way
// reduce accumulates in float32 and rounds once, as NCCL's does.
constexpr size_t kHalfBlock = kBlockBytes / sizeof(float);

template <DType D>
RINGX_CPU_CLONES void widenPortable(float* out, const typename Elem<D>::Storage* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Elem<D>::load(in[i]);
}

template <DType D>
RINGX_CPU_CLONES void narrowPortable(typename Elem<D>::Storage* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Elem<D>::store(in[i]);
}

#if defined(RINGX_X86_MULTIVERSION)
__attribute__((target("default"))) void halfToFloatBlock(float* out, const uint16_t* in, size_t n) {
  widenPortable<DType::F16>(out, in, n);
}

__attribute__((target("default"))) void floatToHalfBlock(uint16_t* out, const float* in, size_t n) {
  narrowPortable<DType::F16>(out, in, n);
}

__attribute__((target("arch=x86-64-v3"))) void halfToFloatBlock(float* out, const uint16_t* in, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  widenPortable<DType::F16>(out + i, in + i, n - i);
}

__attribute__((target("arch=x86-64-v3"))) void floatToHalfBlock(uint16_t* out, const float* in, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  narrowPortable<DType::F16>(out + i, in + i, n - i);
}
#else
void halfToFloatBlock(float* out, const uint16_t* in, size_t n) { widenPortable<DType::F16>(out, in, n); }
void floatToHalfBlock(uint16_t* out, const float* in, size_t n) { narrowPortable<DType::F16>(out, in, n); }
#endif

template <DType D>
void widen(float* out, const void* in, size_t offset, size_t n) {
  const auto* p = static_cast<const typename Elem<D>::Storage*>(in) + offset;
  if constexpr (D == DType::F16) {
    halfToFloatBlock(out, p, n);
  } else {
    widenPortable<D>(out, p, n);
  }
}

template <DType D>
void narrow(void* out, size_t offset, const float* in, size_t n) {
  auto* p = static_cast<typename Elem<D>::Storage*>(out) + offset;
  if constexpr (D == DType::F16) {
    floatToHalfBlock(p, in, n);
  } else {
    narrowPortable<D>(p, in, n);
  }
}

template <DType D, ReduceOp O>
void reduce2_16(void* dst, const void* x, const void* y, size_t count) {
  alignas(64) float a[kHalfBlock];
  alignas(64) float b[kHalfBlock];
  for (size_t base = 0; base < count; base += kHalfBlock) {
    const size_t m = std::min(kHalfBlock, count - base);
    widen<D>(a, x, base, m);
    widen<D>(b, y, base, m);
    reduceLoop<DType::F32, O>(a, b, m);
    narrow<D>(dst, base, a, m);
  }
}

template <DType D, ReduceOp O>
void reduce16(void* dst, const void* src, size_t count) {
  reduce2_16<D, O>(dst, dst, src, count);
}

template <DType D, ReduceOp O>
void reduceN16(void* dst, const void* const* srcs, int nsrc, size_t count) {
  checkSourceCount(nsrc);
  alignas(64) float acc[kHalfBlock];
  alignas(64) float next[kHalfBlock];
  for (size_t base = 0; base < count; base += kHalfBlock) {
    const size_t m = std::min(kHalfBlock, count - base);
    widen<D>(acc, srcs[0], base, m);
    for (int k = 1; k < nsrc; ++k) {
      widen<D>(next, srcs[k], base, m);
      reduceLoop<DType::F32, O>(acc, next, m);
    }
    narrow<D>(dst, base, acc, m);
  }
}

template <DType D>
void scale16(void* buf, size_t count, double factor) {
  alignas(64) float a[kHalfBlock];
  for (size_t base = 0; base < count; base += kHalfBlock) {
    const size_t m = std::min(kHalfBlock, count - base);
    widen<D>(a, buf, base, m);
    scaleLoop<DType::F32>(a, m, factor);
    narrow<D>(buf, base, a, m);
  }
}

template <DType D, ReduceOp O>
struct PickReduce {
  static constexpr ReduceFn get() {
    if constexpr (D == DType::F16) return &reduce16<D, O>;
    else return &reduceLoop<D, O>;
  }
};

template <DType D, ReduceOp O>
struct PickReduce2 {
  static constexpr Reduce2Fn get() {
    if constexpr (D == DType::F16) return &reduce2_16<D, O>;
    else return &reduce2Loop<D, O>;
  }
};

template <DType D, ReduceOp O>
struct PickReduceN {
  static constexpr ReduceNFn get() {
    if constexpr (D == DType::F16 || D == DType::BF16 || isFloat8(D)) return &reduceN16<D, O>;
    else return &reduceNLoop<D, O>;
  }
};

using ScaleFn = void (*)(void* buf, size_t count, double factor);

template <DType D>
struct PickScale {
  static constexpr ScaleFn get() {
    if constexpr (D == DType::F16) return &scale16<D>;
    else return &scaleLoop<D>;
  }
};

constexpr auto kReduce = reduce::makeOpTable<ReduceFn, PickReduce>();
constexpr auto kReduce2 = reduce::makeOpTable<Reduce2Fn, PickReduce2>();
constexpr auto kReduceN = reduce::makeOpTable<ReduceNFn, PickReduceN>();
constexpr auto kScale = reduce::makeFloatTable<ScaleFn, PickScale>();

}  // namespace

bool reduceSupported(DType dtype, ReduceOp op) { return reduce::opSupported(dtype, op); }

ReduceFn reduceFn(DType dtype, ReduceOp op) { return reduce::lookup(kReduce, dtype, op); }

Reduce2Fn reduce2Fn(DType dtype, ReduceOp op) { return reduce::lookup(kReduce2, dtype, op); }

ReduceNFn reduceNFn(DType dtype, ReduceOp op) { return reduce::lookup(kReduceN, dtype, op); }

void scale(void* buf, size_t count, DType dtype, double factor) { reduce::lookup(kScale, dtype)(buf, count, factor); }

std::vector<std::string> cpuKernelTargets() {
#if defined(RINGX_X86_MULTIVERSION)
  return {RINGX_CPU_CLONE_TARGETS};
#else
  return {"default"};
#endif
}

std::string cpuKernelTargetInUse() {
#if defined(RINGX_X86_MULTIVERSION)
  // The order the ifunc resolver prefers them in.
  if (__builtin_cpu_supports("x86-64-v4")) return "arch=x86-64-v4";
  if (__builtin_cpu_supports("x86-64-v3")) return "arch=x86-64-v3";
#endif
  return "default";
}

}  // namespace ringx
