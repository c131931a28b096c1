// Element types, reduction ops and memory kinds as core sees them: no torch here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ringx {

// New types go at the end: the values travel in collective identities.
enum class DType : uint8_t { F32, F64, F16, BF16, I8, U8, I16, I32, I64, Bool, U16, U32, U64, F8E4M3, F8E5M2 };
inline constexpr int kNumDTypes = 15;

enum class ReduceOp : uint8_t { Sum, Avg, Product, Min, Max, PremulSum, BAnd, BOr, BXor };
inline constexpr int kNumReduceOps = 9;

enum class MemoryKind : uint8_t { Host, Cuda };

constexpr size_t dtypeSize(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64:
    case DType::U64:
      return 8;
    case DType::F32:
    case DType::I32:
    case DType::U32:
      return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16:
    case DType::U16:
      return 2;
    case DType::I8:
    case DType::U8:
    case DType::Bool:
    case DType::F8E4M3:
    case DType::F8E5M2:
      return 1;
  }
  return 0;
}

constexpr bool isFloat8(DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2; }

constexpr bool isFloating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16 || isFloat8(t);
}

constexpr std::string_view dtypeName(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I8: return "int8";
    case DType::U8: return "uint8";
    case DType::I16: return "int16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::Bool: return "bool";
    case DType::U16: return "uint16";
    case DType::U32: return "uint32";
    case DType::U64: return "uint64";
    case DType::F8E4M3: return "float8_e4m3fn";
    case DType::F8E5M2: return "float8_e5m2";
  }
  return "?";
}

constexpr std::string_view reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Avg: return "AVG";
    case ReduceOp::Product: return "PRODUCT";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::PremulSum: return "PREMUL_SUM";
    case ReduceOp::BAnd: return "BAND";
    case ReduceOp::BOr: return "BOR";
    case ReduceOp::BXor: return "BXOR";
  }
  return "?";
}

}  // namespace ringx
