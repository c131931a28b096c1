#include "torch/tensor_args.h"

#include <c10/util/Exception.h>

namespace ringx {

std::string CallContext::prefix() const {
  return "ringx: " + op + " (rank " + std::to_string(rank) + ", seq " + std::to_string(seq) + "): ";
}

void throwValueError(const CallContext& c, const std::string& what) {
  throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, c.prefix() + what);
}

void throwTypeError(const CallContext& c, const std::string& what) {
  throw c10::TypeError({__func__, __FILE__, uint32_t(__LINE__)}, c.prefix() + what);
}

const at::Tensor& singleTensor(const CallContext& c, const std::vector<at::Tensor>& tensors) {
  if (tensors.size() != 1) {
    throwValueError(c, "expects exactly one tensor per call, got " + std::to_string(tensors.size()));
  }
  checkDevice(c, tensors[0]);
  return tensors[0];
}

void checkDevice(const CallContext& c, const at::Tensor& t) {
  if (!t.defined()) throwValueError(c, "got an undefined tensor");
  if (t.is_sparse()) throwTypeError(c, "sparse tensors are supported only by all_reduce with SUM; pass a dense tensor");
#ifdef RINGX_WITH_CUDA
  if (t.is_cuda()) return;
#endif
  if (!t.device().is_cpu()) {
    throwTypeError(c, "tensors on " + t.device().str() +
                          " need a CUDA build of ringx (RINGX_CUDA=on; README, CUDA); this one runs CPU tensors "
                          "(use \"cpu:ringx,cuda:nccl\" to route CUDA tensors to NCCL)");
  }
}

void checkRoot(const CallContext& c, int64_t root) {
  if (root < 0 || root >= c.size) {
    throwValueError(c, "root rank " + std::to_string(root) + " is out of range for a group of size " +
                           std::to_string(c.size));
  }
}

void checkListLength(const CallContext& c, size_t got, const char* what) {
  if (int(got) != c.size) {
    throwValueError(c, std::string("the ") + what + " list has " + std::to_string(got) +
                           (got == 1 ? " tensor" : " tensors") + ", expected " + std::to_string(c.size) +
                           " (one per rank)");
  }
}

void checkSameType(const CallContext& c, const at::Tensor& expected, const std::string& expectedWhat,
                   const at::Tensor& t, const std::string& what) {
  checkDevice(c, t);
  if (t.scalar_type() != expected.scalar_type()) {
    throwTypeError(c, what + " has dtype " + std::string(c10::toString(t.scalar_type())) + " but " + expectedWhat +
                          " has " + std::string(c10::toString(expected.scalar_type())));
  }
  if (t.numel() != expected.numel()) {
    throwValueError(c, what + " has " + std::to_string(t.numel()) + " elements but " + expectedWhat + " has " +
                           std::to_string(expected.numel()));
  }
}

at::Tensor asReducible(const CallContext& c, const at::Tensor& t, c10d::ReduceOp::RedOpType op) {
  if (!t.is_complex()) return t;
  if (op != c10d::ReduceOp::SUM && op != c10d::ReduceOp::AVG && op != c10d::ReduceOp::PREMUL_SUM) {
    throwTypeError(c, "complex tensors support only SUM, AVG and PREMUL_SUM");
  }
  return at::view_as_real(t);
}

DType toDType(const CallContext& c, at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kChar: return DType::I8;
    case at::kByte: return DType::U8;
    case at::kShort: return DType::I16;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    case at::kBool: return DType::Bool;
    case at::kUInt16: return DType::U16;
    case at::kUInt32: return DType::U32;
    case at::kUInt64: return DType::U64;
    case at::kFloat8_e4m3fn: return DType::F8E4M3;
    case at::kFloat8_e5m2: return DType::F8E5M2;
    default:
      throwTypeError(c, "dtype " + std::string(c10::toString(t)) +
                            " is not supported (supported: float32, float64, float16, bfloat16, float8_e4m3fn, "
                            "float8_e5m2, int8, uint8, int16, uint16, int32, uint32, int64, uint64, bool, and "
                            "complex for SUM/AVG)");
  }
}

ReduceOp toReduceOp(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::Sum;
    case c10d::ReduceOp::AVG: return ReduceOp::Avg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::Product;
    case c10d::ReduceOp::MIN: return ReduceOp::Min;
    case c10d::ReduceOp::MAX: return ReduceOp::Max;
    case c10d::ReduceOp::BAND: return ReduceOp::BAnd;
    case c10d::ReduceOp::BOR: return ReduceOp::BOr;
    case c10d::ReduceOp::BXOR: return ReduceOp::BXor;
    case c10d::ReduceOp::PREMUL_SUM: return ReduceOp::PremulSum;
    default: break;
  }
  throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, "ringx: unknown reduce op");
}

#ifndef RINGX_PREMUL_SUPPLEMENT
#define RINGX_PREMUL_SUPPLEMENT PreMulSumSupplement
#endif

double premulFactor(const CallContext& c, const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return 1.0;
  auto* sup = dynamic_cast<c10d::RINGX_PREMUL_SUPPLEMENT*>(op.supplement_.get());
  if (!sup) throwValueError(c, "PREMUL_SUM without a factor");
  if (sup->tensor_factor.defined()) {
    checkDevice(c, sup->tensor_factor);
    return sup->tensor_factor.item<double>();
  }
  return sup->double_factor;
}

}  // namespace ringx
