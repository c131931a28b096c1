// Reduction kernels against a scalar reference written independently of
// reduce_functors.h: 16-bit floats are decoded and rounded with ldexp and
// nearbyint, integers wrap through unsigned __int128, bool uses && and ||.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/reduce/reduce.h"
#include "core/reduce/reduce_functors.h"

using namespace ringx;

namespace {

// ---- reference 16-bit float formats ----------------------------------------

struct Format16 {
  int mantBits;
  int expBits;
  double maxFinite;
  int bias() const { return (1 << (expBits - 1)) - 1; }
  int minExp() const { return 1 - bias(); }
};

constexpr Format16 kHalf{10, 5, 65504.0};
constexpr Format16 kBFloat{7, 8, 0x1.fep+127};

double refDecode(const Format16& f, uint16_t bits) {
  const bool neg = bits >> 15;
  const int e = (bits >> f.mantBits) & ((1 << f.expBits) - 1);
  const int m = bits & ((1 << f.mantBits) - 1);
  double v;
  if (e == (1 << f.expBits) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(m, f.minExp() - f.mantBits);
  } else {
    v = std::ldexp((1 << f.mantBits) + m, e - f.bias() - f.mantBits);
  }
  return neg ? -v : v;
}

// Rounds to the format's precision, ties to even, overflowing to infinity.
double refRound(const Format16& f, double x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const double ax = std::fabs(x);
  const int e = ax == 0 ? f.minExp() : std::max(std::ilogb(ax), f.minExp());
  const double quantum = std::ldexp(1.0, e - f.mantBits);
  double r = std::nearbyint(ax / quantum) * quantum;
  if (r > f.maxFinite) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

uint16_t refEncode(const Format16& f, double x) {
  const double r = refRound(f, x);
  const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const uint16_t expMask = static_cast<uint16_t>(((1 << f.expBits) - 1) << f.mantBits);
  if (std::isnan(r)) return sign | expMask | (1 << (f.mantBits - 1));
  if (std::isinf(r)) return sign | expMask;
  const double ar = std::fabs(r);
  if (ar == 0) return sign;
  const int e = std::ilogb(ar);
  if (e < f.minExp()) return sign | static_cast<uint16_t>(std::ldexp(ar, f.mantBits - f.minExp()));
  const auto m = static_cast<uint16_t>(std::ldexp(ar, f.mantBits - e) - (1 << f.mantBits));
  return sign | static_cast<uint16_t>((e + f.bias()) << f.mantBits) | m;
}

// ---- reference 8-bit float formats ------------------------------------------

// float8_e5m2 has float16's infinities and NaN; float8_e4m3fn has neither an
// infinity nor any NaN but S.1111.111, and its largest value is 448.
struct Format8 {
  int mantBits;
  int expBits;
  bool ieeeSpecials;
  int bias() const { return (1 << (expBits - 1)) - 1; }
};

constexpr Format8 kE4M3{3, 4, false};
constexpr Format8 kE5M2{2, 5, true};

double refDecode8(const Format8& f, uint8_t bits) {
  const bool neg = bits >> 7;
  const int e = (bits >> f.mantBits) & ((1 << f.expBits) - 1);
  const int m = bits & ((1 << f.mantBits) - 1);
  const int topE = (1 << f.expBits) - 1, topM = (1 << f.mantBits) - 1;
  double v;
  if (f.ieeeSpecials && e == topE) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!f.ieeeSpecials && e == topE && m == topM) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(m, 1 - f.bias() - f.mantBits);
  } else {
    v = std::ldexp((1 << f.mantBits) + m, e - f.bias() - f.mantBits);
  }
  return neg ? -v : v;
}

// The nearest of the format's finite values by search, ties to the even code;
// past the largest finite value by half its ulp or more (e4m3fn: more), an
// infinity (e5m2) or NaN (e4m3fn), as torch's casts give.
uint8_t refEncode8(const Format8& f, double x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double ax = std::fabs(x);
  int best = -1;
  double maxFinite = 0, below = 0;
  for (int c = 0; c < 0x80; ++c) {
    const double v = refDecode8(f, uint8_t(c));
    if (std::isnan(v) || std::isinf(v)) continue;
    if (v > maxFinite) below = maxFinite, maxFinite = v;
    if (best < 0) {
      best = c;
      continue;
    }
    const double d = std::fabs(v - ax), bd = std::fabs(refDecode8(f, uint8_t(best)) - ax);
    if (d < bd || (d == bd && c % 2 == 0)) best = c;
  }
  const double half = (maxFinite - below) / 2;
  if (f.ieeeSpecials ? ax >= maxFinite + half : ax > maxFinite + half) {
    return sign | (f.ieeeSpecials ? uint8_t(((1 << f.expBits) - 1) << f.mantBits) : uint8_t(0x7F));
  }
  return sign | uint8_t(best);
}

// ---- reference element semantics per dtype ----------------------------------

// S: storage; V: the value the reference computes with (float32 for 16-bit
// floats, as reduce.h specifies).
template <class S_, class V_>
struct Plain {
  using S = S_;
  using V = V_;
  static V decode(S s) { return s; }
  static S encode(V v) { return v; }
};

template <DType D>
struct Ref;
template <> struct Ref<DType::F32> : Plain<float, float> {};
template <> struct Ref<DType::F64> : Plain<double, double> {};
template <> struct Ref<DType::I8> : Plain<int8_t, int8_t> {};
template <> struct Ref<DType::U8> : Plain<uint8_t, uint8_t> {};
template <> struct Ref<DType::I16> : Plain<int16_t, int16_t> {};
template <> struct Ref<DType::I32> : Plain<int32_t, int32_t> {};
template <> struct Ref<DType::I64> : Plain<int64_t, int64_t> {};
template <> struct Ref<DType::U16> : Plain<uint16_t, uint16_t> {};
template <> struct Ref<DType::U32> : Plain<uint32_t, uint32_t> {};
template <> struct Ref<DType::U64> : Plain<uint64_t, uint64_t> {};

template <const Format16& F>
struct Ref16 {
  using S = uint16_t;
  using V = float;
  static V decode(S s) { return static_cast<float>(refDecode(F, s)); }
  static S encode(V v) { return refEncode(F, v); }
};
template <> struct Ref<DType::F16> : Ref16<kHalf> {};
template <> struct Ref<DType::BF16> : Ref16<kBFloat> {};

template <const Format8& F>
struct Ref8 {
  using S = uint8_t;
  using V = float;
  static V decode(S s) { return static_cast<float>(refDecode8(F, s)); }
  static S encode(V v) { return refEncode8(F, v); }
};
template <> struct Ref<DType::F8E4M3> : Ref8<kE4M3> {};
template <> struct Ref<DType::F8E5M2> : Ref8<kE5M2> {};

template <>
struct Ref<DType::Bool> {
  using S = uint8_t;
  using V = bool;
  static V decode(S s) { return s != 0; }
  static S encode(V v) { return v ? 1 : 0; }
};

// Integer sums and products modulo 2^128 (unsigned, so never undefined), then
// to the dtype's width: two's complement wrap-around for signed and unsigned alike.
template <class T>
T wrapTo(unsigned __int128 v) {
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(v));
}

template <class T>
unsigned __int128 wide(T v) {
  return static_cast<unsigned __int128>(v);
}

template <class V>
V refCombine(ReduceOp op, V a, V b) {
  if constexpr (std::is_same_v<V, bool>) {
    if (op == ReduceOp::BXor) return a != b;
    const bool isOr = op == ReduceOp::Sum || op == ReduceOp::Max || op == ReduceOp::BOr;
    return isOr ? a || b : a && b;
  } else if constexpr (std::is_floating_point_v<V>) {
    if (op == ReduceOp::Product) return a * b;
    if (op == ReduceOp::Min || op == ReduceOp::Max) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<V>::quiet_NaN();
      return op == ReduceOp::Min ? std::min(a, b) : std::max(a, b);
    }
    return a + b;  // Sum, Avg and PremulSum
  } else {
    switch (op) {
      case ReduceOp::Sum: return wrapTo<V>(wide(a) + wide(b));
      case ReduceOp::Product: return wrapTo<V>(wide(a) * wide(b));
      case ReduceOp::Min: return std::min(a, b);
      case ReduceOp::Max: return std::max(a, b);
      case ReduceOp::BAnd: return a & b;
      case ReduceOp::BOr: return a | b;
      case ReduceOp::BXor: return a ^ b;
      default: FAIL("reference has no rule for op " << reduceOpName(op));
    }
    return a;
  }
}

constexpr bool expectSupported(DType d, ReduceOp op) {
  const bool floating = d == DType::F32 || d == DType::F64 || d == DType::F16 || d == DType::BF16 ||
                        d == DType::F8E4M3 || d == DType::F8E5M2;
  switch (op) {
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      return !floating;
    case ReduceOp::Avg:
    case ReduceOp::PremulSum:
      return floating;
    default:
      return true;
  }
}

template <class F>
void forEachDType(F&& f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (f.template operator()<static_cast<DType>(I)>(), ...);
  }(std::make_index_sequence<kNumDTypes>{});
}

std::vector<ReduceOp> allOps() {
  std::vector<ReduceOp> ops;
  for (int i = 0; i < kNumReduceOps; ++i) ops.push_back(static_cast<ReduceOp>(i));
  return ops;
}

// ---- random data --------------------------------------------------------------

template <DType D>
typename Ref<D>::S randomElem(std::mt19937_64& rng) {
  using S = typename Ref<D>::S;
  std::uniform_int_distribution<int> pct(0, 99);
  const int p = pct(rng);
  if constexpr (D == DType::F16 || D == DType::BF16 || D == DType::F8E4M3 || D == DType::F8E5M2) {
    // Half arbitrary bit patterns (NaN, infinity, subnormals, huge values),
    // half values near 1 whose sums and products need rounding.
    if (p < 50) return static_cast<S>(rng());
    return Ref<D>::encode(std::uniform_real_distribution<float>(-4, 4)(rng));
  } else if constexpr (std::is_floating_point_v<S>) {
    const S specials[] = {std::numeric_limits<S>::quiet_NaN(), std::numeric_limits<S>::infinity(),
                          -std::numeric_limits<S>::infinity(), 0, -S(0), std::numeric_limits<S>::denorm_min(),
                          std::numeric_limits<S>::max()};
    if (p < 10) return specials[rng() % std::size(specials)];
    if (p < 20) return std::uniform_real_distribution<S>(-1, 1)(rng) * std::numeric_limits<S>::max();
    return std::uniform_real_distribution<S>(-4, 4)(rng);
  } else if constexpr (D == DType::Bool) {
    if (p < 10) return static_cast<S>(rng() | 1);  // any nonzero byte is true
    return static_cast<S>(rng() & 1);
  } else {
    if (p < 50) return static_cast<S>(rng());
    return static_cast<S>(std::uniform_int_distribution<int>(-3, 3)(rng));
  }
}

// Room for `len` elements at element offset 0 or 1 plus spare random elements
// around them, which no kernel may touch.
template <DType D>
std::vector<typename Ref<D>::S> randomBuffer(std::mt19937_64& rng, size_t len) {
  std::vector<typename Ref<D>::S> v(len + 2);
  for (auto& x : v) x = randomElem<D>(rng);
  return v;
}

template <class S>
std::string show(S s) {
  char buf[64];
  if constexpr (std::is_floating_point_v<S>) {
    std::snprintf(buf, sizeof buf, "%.17g", static_cast<double>(s));
  } else if constexpr (sizeof(S) == 2 && std::is_unsigned_v<S>) {
    std::snprintf(buf, sizeof buf, "0x%04x", static_cast<unsigned>(s));
  } else {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(s));
  }
  return buf;
}

// Equal bits, except that any NaN matches a NaN.
template <DType D>
bool same(typename Ref<D>::S got, typename Ref<D>::S want) {
  if constexpr (std::is_same_v<typename Ref<D>::V, float> || std::is_same_v<typename Ref<D>::V, double>) {
    if (std::isnan(Ref<D>::decode(want))) return std::isnan(Ref<D>::decode(got));
  }
  return std::memcmp(&got, &want, sizeof got) == 0;
}

// "" when equal, else where and how they first differ.
template <DType D>
std::string firstMismatch(const std::vector<typename Ref<D>::S>& got, const std::vector<typename Ref<D>::S>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!same<D>(got[i], want[i])) {
      return "buffer element " + std::to_string(i) + ": got " + show(got[i]) + ", want " + show(want[i]);
    }
  }
  return "";
}

const size_t kLengths[] = {0, 1, 3, 15, 17, 31, 33, 64, 1000 + 7, 2048 + 5, 8192 + 7};

template <DType D>
std::string context(ReduceOp op, size_t len) {
  return std::string(dtypeName(D)) + " " + std::string(reduceOpName(op)) + " length " + std::to_string(len);
}

// ---- the kernels against the reference ---------------------------------------

template <DType D>
void checkReduce(ReduceOp op, std::mt19937_64& rng) {
  using R = Ref<D>;
  const ReduceFn fn = reduceFn(D, op);
  for (size_t len : kLengths) {
    for (size_t dOff : {0, 1}) {
      for (size_t sOff : {0, 1}) {
        INFO(context<D>(op, len) << ", dst offset " << dOff << ", src offset " << sOff);
        auto dst = randomBuffer<D>(rng, len);
        const auto src = randomBuffer<D>(rng, len);
        auto want = dst;
        for (size_t i = 0; i < len; ++i) {
          want[dOff + i] = R::encode(refCombine(op, R::decode(dst[dOff + i]), R::decode(src[sOff + i])));
        }
        fn(dst.data() + dOff, src.data() + sOff, len);
        REQUIRE(firstMismatch<D>(dst, want) == "");
      }
    }
    INFO(context<D>(op, len) << ", dst == src");
    auto buf = randomBuffer<D>(rng, len);
    auto want = buf;
    for (size_t i = 1; i <= len; ++i) want[i] = R::encode(refCombine(op, R::decode(buf[i]), R::decode(buf[i])));
    fn(buf.data() + 1, buf.data() + 1, len);
    REQUIRE(firstMismatch<D>(buf, want) == "");
  }
}

template <DType D>
void checkReduce2(ReduceOp op, std::mt19937_64& rng) {
  using R = Ref<D>;
  const Reduce2Fn fn = reduce2Fn(D, op);
  for (size_t len : kLengths) {
    for (size_t off : {0, 1}) {
      const auto a = randomBuffer<D>(rng, len);
      const auto b = randomBuffer<D>(rng, len);
      auto expect = [&](auto base, size_t dOff) {
        for (size_t i = 0; i < len; ++i) {
          base[dOff + i] = R::encode(refCombine(op, R::decode(a[off + i]), R::decode(b[1 - off + i])));
        }
        return base;
      };
      {
        INFO(context<D>(op, len) << ", third buffer, a offset " << off);
        auto dst = randomBuffer<D>(rng, len);
        const auto want = expect(dst, 1 - off);
        fn(dst.data() + 1 - off, a.data() + off, b.data() + 1 - off, len);
        REQUIRE(firstMismatch<D>(dst, want) == "");
      }
      {
        INFO(context<D>(op, len) << ", dst == a, a offset " << off);
        auto dst = a;
        const auto want = expect(a, off);
        fn(dst.data() + off, dst.data() + off, b.data() + 1 - off, len);
        REQUIRE(firstMismatch<D>(dst, want) == "");
      }
      {
        INFO(context<D>(op, len) << ", dst == b, a offset " << off);
        auto dst = b;
        const auto want = expect(b, 1 - off);
        fn(dst.data() + 1 - off, a.data() + off, dst.data() + 1 - off, len);
        REQUIRE(firstMismatch<D>(dst, want) == "");
      }
    }
  }
}

template <DType D>
void checkReduceN(ReduceOp op, std::mt19937_64& rng) {
  using R = Ref<D>;
  const ReduceNFn fn = reduceNFn(D, op);
  for (size_t len : kLengths) {
    for (int nsrc : {1, 2, 3, 5, 8}) {
      // Source k starts at element offset k % 2, so sources are misaligned
      // against each other and against dst.
      std::vector<std::vector<typename R::S>> bufs;
      for (int k = 0; k < nsrc; ++k) bufs.push_back(randomBuffer<D>(rng, len));
      const auto at = [](int k) { return static_cast<size_t>(k % 2); };
      std::vector<typename R::S> folded(len);
      for (size_t i = 0; i < len; ++i) {
        typename R::V acc = R::decode(bufs[0][at(0) + i]);
        for (int k = 1; k < nsrc; ++k) acc = refCombine(op, acc, R::decode(bufs[k][at(k) + i]));
        folded[i] = R::encode(acc);  // 16- and 8-bit floats round once, at the end
      }
      const auto expect = [&](auto base, size_t dOff) {
        std::copy(folded.begin(), folded.end(), base.begin() + dOff);
        return base;
      };
      const auto sources = [&](std::vector<std::vector<typename R::S>>& b) {
        std::vector<const void*> p;
        for (int k = 0; k < nsrc; ++k) p.push_back(b[k].data() + at(k));
        return p;
      };
      {
        INFO(context<D>(op, len) << ", " << nsrc << " sources into a third buffer");
        auto dst = randomBuffer<D>(rng, len);
        const auto want = expect(dst, 1);
        fn(dst.data() + 1, sources(bufs).data(), nsrc, len);
        REQUIRE(firstMismatch<D>(dst, want) == "");
      }
      for (int k : {0, nsrc - 1}) {
        INFO(context<D>(op, len) << ", " << nsrc << " sources, dst == source " << k);
        auto copy = bufs;
        const auto want = expect(bufs[k], at(k));
        fn(copy[k].data() + at(k), sources(copy).data(), nsrc, len);
        REQUIRE(firstMismatch<D>(copy[k], want) == "");
      }
    }
  }
}

// The floating dtypes, or the integer and bool ones: the exhaustive checks
// run as two test cases each, which under the sanitizers keeps each within
// ctest's per-case timeout and lets ctest run the halves side by side.
enum class Family { Floating, IntegerAndBool };

template <class F>
void forEachSupportedPair(Family family, F&& check) {
  std::mt19937_64 rng(12345);
  forEachDType([&]<DType D>() {
    if (isFloating(D) != (family == Family::Floating)) return;
    for (ReduceOp op : allOps()) {
      if (expectSupported(D, op)) check.template operator()<D>(op, rng);
    }
  });
}

template <DType D>
std::vector<typename Ref<D>::S> encodeAll(std::initializer_list<typename Ref<D>::V> values) {
  std::vector<typename Ref<D>::S> out;
  for (auto v : values) out.push_back(Ref<D>::encode(v));
  return out;
}

}  // namespace

TEST_CASE("reduceSupported: bitwise ops need an integer or bool dtype, AVG and PREMUL_SUM a floating one") {
  forEachDType([&]<DType D>() {
    for (ReduceOp op : allOps()) {
      INFO(dtypeName(D) << " " << reduceOpName(op));
      CHECK(reduceSupported(D, op) == expectSupported(D, op));
    }
  });
}

TEST_CASE("unsupported dtype x op pairs throw Unsupported naming the op and the dtype") {
  forEachDType([&]<DType D>() {
    for (ReduceOp op : allOps()) {
      if (expectSupported(D, op)) continue;
      INFO(dtypeName(D) << " " << reduceOpName(op));
      const std::string opName(reduceOpName(op));
      const std::string dtype(dtypeName(D));
      for (int form = 0; form < 3; ++form) {
        try {
          if (form == 0) reduceFn(D, op);
          if (form == 1) reduce2Fn(D, op);
          if (form == 2) reduceNFn(D, op);
          FAIL("form " << form << " did not throw");
        } catch (const Error& e) {
          CHECK(e.kind() == ErrorKind::Unsupported);
          CHECK_THAT(std::string(e.what()), Catch::Contains("reduce op " + opName + " is not supported for dtype " + dtype));
        }
      }
    }
  });
}

TEST_CASE("the bitwise-op error explains that an integer or bool tensor is needed") {
  REQUIRE_THROWS_WITH(reduceFn(DType::F32, ReduceOp::BAnd),
                      "reduce op BAND is not supported for dtype float32 "
                      "(bitwise ops need an integer or bool tensor)");
}

TEST_CASE("scale on a non-floating dtype throws Unsupported naming the dtype") {
  int32_t x = 4;
  try {
    scale(&x, 1, DType::I32, 0.5);
    FAIL("scale on int32 did not throw");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Unsupported);
    CHECK_THAT(std::string(e.what()), Catch::Contains("int32"));
  }
  CHECK(x == 4);
}

TEST_CASE("float16 and bfloat16 decode every bit pattern to the IEEE value") {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    INFO("pattern " << show(h));
    const float half = reduce::halfToFloat(h);
    const float bf = reduce::bf16ToFloat(h);
    const double wantHalf = refDecode(kHalf, h);
    const double wantBf = refDecode(kBFloat, h);
    if (std::isnan(wantHalf)) {
      REQUIRE(std::isnan(half));
      REQUIRE(std::signbit(half) == std::signbit(wantHalf));
    } else {
      REQUIRE(std::bit_cast<uint32_t>(half) == std::bit_cast<uint32_t>(static_cast<float>(wantHalf)));
    }
    if (std::isnan(wantBf)) {
      REQUIRE(std::isnan(bf));
    } else {
      REQUIRE(std::bit_cast<uint32_t>(bf) == std::bit_cast<uint32_t>(static_cast<float>(wantBf)));
    }
  }
}

namespace {

// Every float the encoders must round: each 16-bit value, the midpoints to
// its neighbours (ties), a float ulp either side of those, plus float32
// subnormals, the overflow edges and NaNs with assorted payloads.
std::vector<float> roundingProbes(const Format16& f) {
  std::vector<float> probes;
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const double v = refDecode(f, static_cast<uint16_t>(bits));
    if (std::isnan(v) || std::isinf(v)) continue;
    const double next = refDecode(f, static_cast<uint16_t>(bits + 1));
    probes.push_back(static_cast<float>(v));
    if (std::isinf(next) || std::isnan(next) || std::fabs(next) < std::fabs(v)) continue;
    const auto mid = static_cast<float>((v + next) / 2);
    probes.push_back(mid);
    probes.push_back(std::nextafter(mid, 0.0f));
    probes.push_back(std::nextafter(mid, std::copysign(INFINITY, mid)));
  }
  for (float x : {std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), 65504.0f, 65519.99f, 65520.0f, 1e9f, INFINITY,
                  std::ldexp(1.0f, -25), std::nextafter(std::ldexp(1.0f, -25), 1.0f)}) {
    probes.push_back(x);
    probes.push_back(-x);
  }
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFFC00000u, 0x7FFFFFFFu, 0x7FA00000u, 0xFF800001u}) {
    probes.push_back(std::bit_cast<float>(nan));
  }
  return probes;
}

}  // namespace

TEST_CASE("float16 encoding rounds to nearest even, becomes infinity from 65520 on, and keeps NaN") {
  for (float x : roundingProbes(kHalf)) {
    INFO("float " << show(x) << " bits " << std::bit_cast<uint32_t>(x));
    const uint16_t got = reduce::floatToHalf(x);
    if (std::isnan(x)) {
      REQUIRE(std::isnan(refDecode(kHalf, got)));
      REQUIRE(std::signbit(refDecode(kHalf, got)) == std::signbit(x));
    } else {
      REQUIRE(show(got) == show(refEncode(kHalf, x)));
    }
  }
  CHECK(reduce::floatToHalf(65519.99f) == 0x7BFF);
  CHECK(reduce::floatToHalf(65520.0f) == 0x7C00);
  CHECK(reduce::floatToHalf(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and the least subnormal
  CHECK(reduce::floatToHalf(2049.0f) == 0x6800);                 // tie: 2048 (even) not 2050
}

TEST_CASE("bfloat16 encoding rounds to nearest even and never turns a NaN into infinity") {
  for (float x : roundingProbes(kBFloat)) {
    INFO("float " << show(x) << " bits " << std::bit_cast<uint32_t>(x));
    const uint16_t got = reduce::floatToBf16(x);
    if (std::isnan(x)) {
      REQUIRE(std::isnan(refDecode(kBFloat, got)));
      REQUIRE(std::signbit(refDecode(kBFloat, got)) == std::signbit(x));
    } else {
      REQUIRE(show(got) == show(refEncode(kBFloat, x)));
    }
  }
  CHECK(reduce::floatToBf16(257.0f) == 0x4380);  // tie: 256 (even) not 258
  CHECK(reduce::floatToBf16(259.0f) == 0x4382);  // tie: 260 (even) not 258
}

#if defined(__FLT16_MAX__)
TEST_CASE("float16 conversions agree with the compiler's _Float16") {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto h = std::bit_cast<_Float16>(static_cast<uint16_t>(bits));
    const float want = static_cast<float>(h);
    if (std::isnan(want)) continue;
    REQUIRE(std::bit_cast<uint32_t>(reduce::halfToFloat(static_cast<uint16_t>(bits))) ==
            std::bit_cast<uint32_t>(want));
  }
  for (float x : roundingProbes(kHalf)) {
    if (std::isnan(x)) continue;
    INFO("float " << show(x));
    REQUIRE(reduce::floatToHalf(x) == std::bit_cast<uint16_t>(static_cast<_Float16>(x)));
  }
}
#endif

TEST_CASE("reduce combines src into dst for every dtype and op, at any length and element offset: floating dtypes") {
  forEachSupportedPair(Family::Floating, []<DType D>(ReduceOp op, std::mt19937_64& rng) { checkReduce<D>(op, rng); });
}

TEST_CASE("reduce combines src into dst for every dtype and op, at any length and element offset: integer and bool dtypes") {
  forEachSupportedPair(Family::IntegerAndBool,
                       []<DType D>(ReduceOp op, std::mt19937_64& rng) { checkReduce<D>(op, rng); });
}

TEST_CASE("reduce2 writes op(a, b) into a third buffer or over a or b: floating dtypes") {
  forEachSupportedPair(Family::Floating, []<DType D>(ReduceOp op, std::mt19937_64& rng) { checkReduce2<D>(op, rng); });
}

TEST_CASE("reduce2 writes op(a, b) into a third buffer or over a or b: integer and bool dtypes") {
  forEachSupportedPair(Family::IntegerAndBool,
                       []<DType D>(ReduceOp op, std::mt19937_64& rng) { checkReduce2<D>(op, rng); });
}

TEST_CASE("reduceN folds its sources in order, into a third buffer or over a source: floating dtypes") {
  forEachSupportedPair(Family::Floating, []<DType D>(ReduceOp op, std::mt19937_64& rng) { checkReduceN<D>(op, rng); });
}

TEST_CASE("reduceN folds its sources in order, into a third buffer or over a source: integer and bool dtypes") {
  forEachSupportedPair(Family::IntegerAndBool,
                       []<DType D>(ReduceOp op, std::mt19937_64& rng) { checkReduceN<D>(op, rng); });
}

TEST_CASE("reduceN needs at least one source") {
  float dst = 0;
  try {
    reduceNFn(DType::F32, ReduceOp::Sum)(&dst, nullptr, 0, 1);
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::InvalidArgument);
  }
}

TEST_CASE("16-bit float sums round to nearest even on every call") {
  auto h = encodeAll<DType::F16>({2048, 2050, -2048, 1});
  const auto ones = encodeAll<DType::F16>({1, 1, -1, 0x1p-24f});
  reduceFn(DType::F16, ReduceOp::Sum)(h.data(), ones.data(), h.size());
  CHECK(h == encodeAll<DType::F16>({2048, 2052, -2048, 1}));

  auto b = encodeAll<DType::BF16>({256, 258});
  const auto bOnes = encodeAll<DType::BF16>({1, 1});
  reduceFn(DType::BF16, ReduceOp::Sum)(b.data(), bOnes.data(), b.size());
  CHECK(b == encodeAll<DType::BF16>({256, 260}));
}

TEST_CASE("reduceN accumulates 16-bit floats in float32 and rounds once") {
  // 2048 + 1 + 1: rounding after each step would give 2048 twice over.
  for (DType d : {DType::F16, DType::BF16}) {
    INFO(dtypeName(d));
    const float big = d == DType::F16 ? 2048 : 256;
    const auto enc = [&](float v) { return d == DType::F16 ? Ref<DType::F16>::encode(v) : Ref<DType::BF16>::encode(v); };
    const uint16_t a = enc(big), one = enc(1);
    const void* srcs[] = {&a, &one, &one};
    uint16_t out = 0;
    reduceNFn(d, ReduceOp::Sum)(&out, srcs, 3, 1);
    CHECK(out == enc(big + 2));
  }
}

namespace {

template <DType D>
void checkNanPropagates(ReduceOp op) {
  using R = Ref<D>;
  using V = typename R::V;
  const V nan = std::numeric_limits<V>::quiet_NaN();
  auto a = encodeAll<D>({nan, 1, nan, -INFINITY});
  const auto b = encodeAll<D>({1, nan, nan, 2});
  reduceFn(D, op)(a.data(), b.data(), a.size());
  CHECK(std::isnan(R::decode(a[0])));
  CHECK(std::isnan(R::decode(a[1])));
  CHECK(std::isnan(R::decode(a[2])));
  CHECK(R::decode(a[3]) == (op == ReduceOp::Min ? -INFINITY : 2));
}

}  // namespace

TEST_CASE("Min and Max propagate NaN from either operand") {
  for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
    INFO(reduceOpName(op));
    checkNanPropagates<DType::F32>(op);
    checkNanPropagates<DType::F64>(op);
    checkNanPropagates<DType::F16>(op);
    checkNanPropagates<DType::BF16>(op);
  }
}

TEST_CASE("integer Sum and Product wrap around like two's complement") {
  auto sum = [](DType d, auto a, auto b) {
    reduceFn(d, ReduceOp::Sum)(&a, &b, 1);
    return a;
  };
  auto prod = [](DType d, auto a, auto b) {
    reduceFn(d, ReduceOp::Product)(&a, &b, 1);
    return a;
  };
  CHECK(sum(DType::I8, int8_t{127}, int8_t{1}) == -128);
  CHECK(sum(DType::U8, uint8_t{255}, uint8_t{1}) == 0);
  CHECK(sum(DType::I16, int16_t{-32768}, int16_t{-1}) == 32767);
  CHECK(sum(DType::I32, std::numeric_limits<int32_t>::max(), int32_t{1}) == std::numeric_limits<int32_t>::min());
  CHECK(sum(DType::I64, std::numeric_limits<int64_t>::max(), int64_t{1}) == std::numeric_limits<int64_t>::min());
  CHECK(prod(DType::U8, uint8_t{16}, uint8_t{16}) == 0);
  CHECK(prod(DType::I16, int16_t{300}, int16_t{300}) == static_cast<int16_t>(90000 - 65536));
  CHECK(prod(DType::I16, int16_t{-32768}, int16_t{-1}) == -32768);
  CHECK(prod(DType::I32, int32_t{65536}, int32_t{65537}) == 65536);
  CHECK(prod(DType::I64, int64_t{1} << 62, int64_t{4}) == 0);
  CHECK(prod(DType::I64, std::numeric_limits<int64_t>::min(), int64_t{-1}) == std::numeric_limits<int64_t>::min());
}

TEST_CASE("bool ops are logical and write 0 or 1 whatever nonzero byte held true") {
  const std::vector<uint8_t> a = {0, 0, 1, 1, 2, 2, 0, 255};
  const std::vector<uint8_t> b = {0, 1, 0, 1, 0, 2, 2, 1};
  const std::vector<uint8_t> orWant = {0, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<uint8_t> andWant = {0, 0, 0, 1, 0, 1, 0, 1};
  const std::vector<uint8_t> xorWant = {0, 1, 1, 0, 1, 0, 1, 0};
  const std::pair<ReduceOp, const std::vector<uint8_t>*> cases[] = {
      {ReduceOp::Sum, &orWant},      {ReduceOp::Max, &orWant},  {ReduceOp::BOr, &orWant},
      {ReduceOp::Product, &andWant}, {ReduceOp::Min, &andWant}, {ReduceOp::BAnd, &andWant},
      {ReduceOp::BXor, &xorWant}};
  for (const auto& [op, want] : cases) {
    INFO(reduceOpName(op));
    auto dst = a;
    reduceFn(DType::Bool, op)(dst.data(), b.data(), dst.size());
    CHECK(dst == *want);
    std::vector<uint8_t> third(a.size(), 7);
    reduce2Fn(DType::Bool, op)(third.data(), a.data(), b.data(), a.size());
    CHECK(third == *want);
    const void* srcs[] = {a.data(), b.data(), a.data()};
    reduceNFn(DType::Bool, op)(third.data(), srcs, 2, a.size());
    CHECK(third == *want);
  }
  const std::vector<uint8_t> twos = {2, 0, 255};
  std::vector<uint8_t> one(3, 9);
  const void* single[] = {twos.data()};
  reduceNFn(DType::Bool, ReduceOp::Sum)(one.data(), single, 1, 3);
  CHECK(one == std::vector<uint8_t>{1, 0, 1});
}

namespace {

template <DType D>
void checkScale(std::mt19937_64& rng) {
  using R = Ref<D>;
  for (double factor : {0.5, 1.0 / 3, -2.0, 1e-3, 1e30}) {
    for (size_t len : kLengths) {
      INFO(dtypeName(D) << " factor " << factor << " length " << len);
      auto buf = randomBuffer<D>(rng, len);
      auto want = buf;
      for (size_t i = 1; i <= len; ++i) {
        using V = typename R::V;
        want[i] = R::encode(R::decode(buf[i]) * static_cast<V>(factor));
      }
      scale(buf.data() + 1, len, D, factor);
      REQUIRE(firstMismatch<D>(buf, want) == "");
    }
  }
}

}  // namespace

TEST_CASE("scale multiplies in the dtype's precision, float32 for 16-bit floats") {
  std::mt19937_64 rng(777);
  checkScale<DType::F32>(rng);
  checkScale<DType::F64>(rng);
  checkScale<DType::F16>(rng);
  checkScale<DType::BF16>(rng);
}

TEST_CASE("float16 kernels give the portable conversions' bits, NaN payloads included") {
  // The CPU float16 path may use F16C; scaling by one is a round trip
  // through it that must match reduce_functors.h bit for bit.
  std::vector<uint16_t> all(0x10000);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  auto scaled = all;
  scale(scaled.data(), scaled.size(), DType::F16, 1.0);
  for (uint32_t i = 0; i < all.size(); ++i) {
    INFO("pattern " << show(all[i]));
    REQUIRE(show(scaled[i]) == show(reduce::floatToHalf(reduce::halfToFloat(all[i]) * 1.0f)));
  }
}
