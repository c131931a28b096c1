// What a reduction computes, in one place for the CPU loops (reduce_cpu.cc)
// and the CUDA kernels (reduce_cuda.cu): the 16-bit float conversions, how
// each dtype is loaded into the type ops compute in, the per-op functors,
// which dtype x op pairs exist, and the generator both sides build their
// dispatch tables with. Everything a kernel calls is RINGX_HD so nvcc compiles
// it for the device as well. nvcc compiles it as C++17 (see CMakeLists.txt),
// so it keeps to C++17.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "core/common/error.h"
#include "core/common/types.h"
#include "core/reduce/hd.h"


namespace ringx::reduce {

// The tables below index arrays by enum value.
static_assert(static_cast<int>(DType::F8E5M2) + 1 == kNumDTypes);
static_assert(static_cast<int>(ReduceOp::BXor) + 1 == kNumReduceOps);

RINGX_HD inline uint32_t floatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

RINGX_HD inline float bitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// The conversions compute every case and pick one with selectBits, a mask
// select rather than ?:, because GCC sinks the floating-point work of a ?:
// arm into a branch it then may not speculate (the op could trap), and a
// loop with a branch does not vectorise below AVX-512. NaN handling matches
// x86 F16C (vcvtph2ps/vcvtps2ph): a NaN stays a NaN of the same sign, is made
// quiet, and keeps the top bits of its payload.

RINGX_HD inline uint32_t selectBits(bool cond, uint32_t ifTrue, uint32_t ifFalse) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (ifTrue & mask) | (ifFalse & ~mask);
}

RINGX_HD inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  // Normal: move the fields up and rebias the exponent from 15 to 127.
  const uint32_t normal = (em << 13) + ((127u - 15u) << 23);
  // Subnormal (and zero): em * 2^-24, got exactly by placing em in the low
  // mantissa bits of 0.5f (whose ulp is 2^-24) and subtracting 0.5f.
  const uint32_t subnormal = floatToBits(bitsToFloat(0x3F000000u | em) - 0.5f);
  const uint32_t infOrNan = 0x7F800000u | ((em & 0x3FFu) << 13) | (em > 0x7C00u ? 0x00400000u : 0u);
  const uint32_t mag = selectBits(em >= 0x7C00u, infOrNan, selectBits(em >= 0x0400u, normal, subnormal));
  return bitsToFloat(sign | mag);
}

RINGX_HD inline uint16_t floatToHalf(float f) {
  const uint32_t u = floatToBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // Normal result: rebias, then add just under half an ulp plus the ulp's
  // parity, which rounds to nearest with ties to even. A carry out of the
  // mantissa bumps the exponent, so 65520 and above become infinity here.
  const uint32_t normal = (a - ((127u - 15u) << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal result (|f| < 2^-14): adding 0.5f, whose ulp is 2^-24 (the
  // half subnormal step), makes the FPU round to nearest even for us.
  const uint32_t subnormal = floatToBits(bitsToFloat(a) + 0.5f) - 0x3F000000u;
  const uint32_t infOrNan = a > 0x7F800000u ? (0x7E00u | ((a >> 13) & 0x3FFu)) : 0x7C00u;
  const uint32_t mag = selectBits(a >= 0x47800000u, infOrNan, selectBits(a < 0x38800000u, subnormal, normal));
  return static_cast<uint16_t>(sign | mag);
}

RINGX_HD inline float bf16ToFloat(uint16_t h) { return bitsToFloat(static_cast<uint32_t>(h) << 16); }

RINGX_HD inline uint16_t floatToBf16(float f) {
  const uint32_t u = floatToBits(f);
  // Same rounding trick as floatToHalf; a NaN must not round into infinity,
  // so it is truncated and made quiet instead.
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>(selectBits((u & 0x7FFFFFFFu) > 0x7F800000u, nan, rounded));
}

// The 8-bit floats round as torch's casts do (to nearest, ties to even, by the
// same add-and-shift as floatToHalf; subnormals by adding a float whose ulp is
// the format's subnormal step). float8_e4m3fn has no infinity: anything at or
// past 480 (halfway above its largest value, 448), infinities and NaN become
// its NaN, S.1111.111. float8_e5m2 is the top byte of a float16, with float16's
// infinities and NaN.
RINGX_HD inline float e4m3ToFloat(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t em = v & 0x7Fu;
  const uint32_t normal = (em << 20) + ((127u - 7u) << 23);
  const uint32_t subnormal = floatToBits(static_cast<float>(em) * 0.001953125f);  // em * 2^-9, exact
  const uint32_t mag = selectBits(em == 0x7Fu, 0x7FC00000u, selectBits(em >= 0x08u, normal, subnormal));
  return bitsToFloat(sign | mag);
}

RINGX_HD inline uint8_t floatToE4m3(float f) {
  const uint32_t u = floatToBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t normal = (a + ((7u - 127u) << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
  const uint32_t magic = 141u << 23;  // 2^14, whose ulp is 2^-9
  const uint32_t subnormal = floatToBits(bitsToFloat(a) + bitsToFloat(magic)) - magic;
  const uint32_t mag = selectBits(a >= 0x43F00000u, 0x7Fu, selectBits(a < (121u << 23), subnormal, normal));
  return static_cast<uint8_t>(sign | mag);
}

RINGX_HD inline float e5m2ToFloat(uint8_t v) { return halfToFloat(static_cast<uint16_t>(v << 8)); }

RINGX_HD inline uint8_t floatToE5m2(float f) {
  const uint32_t u = floatToBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t normal = (a + ((15u - 127u) << 23) + 0xFFFFFu + ((a >> 21) & 1u)) >> 21;
  const uint32_t magic = 134u << 23;  // 2^7, whose ulp is 2^-16
  const uint32_t subnormal = floatToBits(bitsToFloat(a) + bitsToFloat(magic)) - magic;
  const uint32_t infOrNan = a > 0x7F800000u ? 0x7Fu : 0x7Cu;
  const uint32_t mag = selectBits(a >= (143u << 23), infOrNan, selectBits(a < (113u << 23), subnormal, normal));
  return static_cast<uint8_t>(sign | mag);
}

// Elem<D>: Storage is the element as it lies in memory, Acc the type the ops
// compute in; load/store convert between them. 16- and 8-bit floats compute
// in float32. bool loads as 0 or 1 (any nonzero byte counts as true) and is
// combined bitwise (see OpFor), so results are always 0 or 1.
template <DType D>
struct Elem;

template <class T>
struct PlainElem {
  using Storage = T;
  using Acc = T;
  RINGX_HD static T load(T v) { return v; }
  RINGX_HD static T store(T v) { return v; }
};

template <> struct Elem<DType::F32> : PlainElem<float> {};
template <> struct Elem<DType::F64> : PlainElem<double> {};
template <> struct Elem<DType::I8> : PlainElem<int8_t> {};
template <> struct Elem<DType::U8> : PlainElem<uint8_t> {};
template <> struct Elem<DType::I16> : PlainElem<int16_t> {};
template <> struct Elem<DType::I32> : PlainElem<int32_t> {};
template <> struct Elem<DType::I64> : PlainElem<int64_t> {};
template <> struct Elem<DType::U16> : PlainElem<uint16_t> {};
template <> struct Elem<DType::U32> : PlainElem<uint32_t> {};
template <> struct Elem<DType::U64> : PlainElem<uint64_t> {};

template <>
struct Elem<DType::F16> {
  using Storage = uint16_t;
  using Acc = float;
  RINGX_HD static float load(uint16_t v) { return halfToFloat(v); }
  RINGX_HD static uint16_t store(float v) { return floatToHalf(v); }
};

template <>
struct Elem<DType::BF16> {
  using Storage = uint16_t;
  using Acc = float;
  RINGX_HD static float load(uint16_t v) { return bf16ToFloat(v); }
  RINGX_HD static uint16_t store(float v) { return floatToBf16(v); }
};

template <>
struct Elem<DType::F8E4M3> {
  using Storage = uint8_t;
  using Acc = float;
  RINGX_HD static float load(uint8_t v) { return e4m3ToFloat(v); }
  RINGX_HD static uint8_t store(float v) { return floatToE4m3(v); }
};

template <>
struct Elem<DType::F8E5M2> {
  using Storage = uint8_t;
  using Acc = float;
  RINGX_HD static float load(uint8_t v) { return e5m2ToFloat(v); }
  RINGX_HD static uint8_t store(float v) { return floatToE5m2(v); }
};

template <>
struct Elem<DType::Bool> {
  using Storage = uint8_t;
  using Acc = uint8_t;
  RINGX_HD static uint8_t load(uint8_t v) { return v != 0; }
  RINGX_HD static uint8_t store(uint8_t v) { return v; }
};

// Signed overflow is undefined, so integer Sum and Product run in an unsigned
// type at least as wide as int (uint16 * uint16 would otherwise promote to a
// signed int and overflow) and wrap like two's complement on the way back.
template <class T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <class T>
struct Sum {
  RINGX_HD T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
    } else {
      return a + b;
    }
  }
};

template <class T>
struct Product {
  RINGX_HD T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
    } else {
      return a * b;
    }
  }
};

// Min and Max propagate NaN from either side, like torch.minimum/maximum.
template <class T>
struct Min {
  RINGX_HD T operator()(T a, T b) const {
    const T m = b < a ? b : a;
    if constexpr (std::is_floating_point_v<T>) {
      return b != b ? b : m;  // a NaN in a already survived the compare
    } else {
      return m;
    }
  }
};

template <class T>
struct Max {
  RINGX_HD T operator()(T a, T b) const {
    const T m = a < b ? b : a;
    if constexpr (std::is_floating_point_v<T>) {
      return b != b ? b : m;
    } else {
      return m;
    }
  }
};

template <class T>
struct BAnd {
  RINGX_HD T operator()(T a, T b) const { return static_cast<T>(a & b); }
};

template <class T>
struct BOr {
  RINGX_HD T operator()(T a, T b) const { return static_cast<T>(a | b); }
};

template <class T>
struct BXor {
  RINGX_HD T operator()(T a, T b) const { return static_cast<T>(a ^ b); }
};

// Avg and PremulSum reduce as a sum; scale() completes them.
constexpr bool opSupported(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      return !isFloating(dtype);
    case ReduceOp::Avg:
    case ReduceOp::PremulSum:
      return isFloating(dtype);
    case ReduceOp::Sum:
    case ReduceOp::Product:
    case ReduceOp::Min:
    case ReduceOp::Max:
      return true;
  }
  return false;
}

// bool is logical: on loaded 0/1 values, Sum and Max are or, Product and Min
// are and. Bitwise ops give that and keep the loops vectorisable.
template <DType D, ReduceOp O>
constexpr auto makeFunctor() {
  using T = typename Elem<D>::Acc;
  if constexpr (D == DType::Bool && (O == ReduceOp::Sum || O == ReduceOp::Max)) {
    return BOr<T>{};
  } else if constexpr (D == DType::Bool && (O == ReduceOp::Product || O == ReduceOp::Min)) {
    return BAnd<T>{};
  } else if constexpr (O == ReduceOp::Sum || O == ReduceOp::Avg || O == ReduceOp::PremulSum) {
    return Sum<T>{};
  } else if constexpr (O == ReduceOp::Product) {
    return Product<T>{};
  } else if constexpr (O == ReduceOp::Min) {
    return Min<T>{};
  } else if constexpr (O == ReduceOp::Max) {
    return Max<T>{};
  } else if constexpr (O == ReduceOp::BAnd) {
    return BAnd<T>{};
  } else if constexpr (O == ReduceOp::BOr) {
    return BOr<T>{};
  } else {
    static_assert(O == ReduceOp::BXor);
    return BXor<T>{};
  }
}

// The functor that combines two elements of dtype D under op O.
template <DType D, ReduceOp O>
using OpFor = decltype(makeFunctor<D, O>());

inline Error unsupportedError(DType dtype, ReduceOp op) {
  const char* why = isFloating(dtype) ? "bitwise ops need an integer or bool tensor"
                                      : "AVG and PREMUL_SUM need a floating-point tensor";
  return Error(ErrorKind::Unsupported, "reduce op " + std::string(reduceOpName(op)) +
                                           " is not supported for dtype " + std::string(dtypeName(dtype)) +
                                           " (" + why + ")");
}

inline Error scaleUnsupportedError(DType dtype) {
  return Error(ErrorKind::Unsupported, "scaling is not supported for dtype " + std::string(dtypeName(dtype)) +
                                           " (AVG and PREMUL_SUM need a floating-point tensor)");
}

// A [dtype][op] table of kernel pointers, nullptr where opSupported is false.
// Pick<D, O>::get() returns the kernel for one supported pair; the CPU and
// CUDA sides each supply their own Pick, so neither keeps a hand-written list.
template <class Fn>
using OpTable = std::array<std::array<Fn, kNumReduceOps>, kNumDTypes>;

template <class Fn, template <DType, ReduceOp> class Pick, DType D, size_t... Os>
constexpr std::array<Fn, kNumReduceOps> makeOpRow(std::index_sequence<Os...>) {
  return {[] {
    if constexpr (opSupported(D, static_cast<ReduceOp>(Os))) {
      return Fn{Pick<D, static_cast<ReduceOp>(Os)>::get()};
    } else {
      return Fn{nullptr};
    }
  }()...};
}

template <class Fn, template <DType, ReduceOp> class Pick, size_t... Ds>
constexpr OpTable<Fn> makeOpTable(std::index_sequence<Ds...>) {
  return {makeOpRow<Fn, Pick, static_cast<DType>(Ds)>(std::make_index_sequence<kNumReduceOps>{})...};
}

template <class Fn, template <DType, ReduceOp> class Pick>
constexpr OpTable<Fn> makeOpTable() {
  return makeOpTable<Fn, Pick>(std::make_index_sequence<kNumDTypes>{});
}

// The kernel for a pair, or Error(Unsupported) saying why there is none.
template <class Fn>
Fn lookup(const OpTable<Fn>& table, DType dtype, ReduceOp op) {
  const Fn fn = table[static_cast<size_t>(dtype)][static_cast<size_t>(op)];
  if (fn == nullptr) throw unsupportedError(dtype, op);
  return fn;
}

// The same for per-dtype kernels (scale): nullptr for non-floating dtypes.
template <class Fn>
using FloatTable = std::array<Fn, kNumDTypes>;

template <class Fn, template <DType> class Pick, size_t... Ds>
constexpr FloatTable<Fn> makeFloatTable(std::index_sequence<Ds...>) {
  return {[] {
    if constexpr (isFloating(static_cast<DType>(Ds))) {
      return Fn{Pick<static_cast<DType>(Ds)>::get()};
    } else {
      return Fn{nullptr};
    }
  }()...};
}

template <class Fn, template <DType> class Pick>
constexpr FloatTable<Fn> makeFloatTable() {
  return makeFloatTable<Fn, Pick>(std::make_index_sequence<kNumDTypes>{});
}

template <class Fn>
Fn lookup(const FloatTable<Fn>& table, DType dtype) {
  const Fn fn = table[static_cast<size_t>(dtype)];
  if (fn == nullptr) throw scaleUnsupportedError(dtype);
  return fn;
}

}  // namespace ringx::reduce
