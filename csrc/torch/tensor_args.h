// Argument checks and conversions between torch's and core's vocabularies.
// Every error names the op and the rank ("ringx: <op> (rank R, seq S): ...").
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "core/common/types.h"

namespace ringx {

// The message prefix of one call.
struct CallContext {
  std::string op;
  int rank;
  int size;
  uint64_t seq;
  std::string prefix() const;
};

[[noreturn]] void throwValueError(const CallContext& c, const std::string& what);
[[noreturn]] void throwTypeError(const CallContext& c, const std::string& what);

// The tensor of a single-tensor call, on the CPU, with a supported dtype.
const at::Tensor& singleTensor(const CallContext& c, const std::vector<at::Tensor>& tensors);
void checkDevice(const CallContext& c, const at::Tensor& t);
void checkRoot(const CallContext& c, int64_t root);
// A per-rank tensor list (`what`: "input" or "output") must hold one per rank.
void checkListLength(const CallContext& c, size_t got, const char* what);
// Every tensor of a list must match `expected` (named `expectedWhat` in errors)
// in dtype and element count.
void checkSameType(const CallContext& c, const at::Tensor& expected, const std::string& expectedWhat,
                   const at::Tensor& t, const std::string& what);

// Complex tensors reduce as their real view where the op allows it.
at::Tensor asReducible(const CallContext& c, const at::Tensor& t, c10d::ReduceOp::RedOpType op);

DType toDType(const CallContext& c, at::ScalarType t);
ReduceOp toReduceOp(const c10d::ReduceOp& op);
double premulFactor(const CallContext& c, const c10d::ReduceOp& op);

}  // namespace ringx
