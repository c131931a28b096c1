// Contiguous working buffers for user tensors, and the copy-back that hands
// results to tensors whose layout the schedule could not write directly.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace ringx {

struct Staged {
  at::Tensor buf;                // contiguous; the schedule reads/writes it
  std::function<void()> publish;  // copies buf back into the user tensor, if needed
};

// A tensor's storage as the schedule sees it: complex tensors as their real
// view, so element counts and dtypes are those of the parts.
inline at::Tensor asParts(const at::Tensor& t) { return t.is_complex() ? at::view_as_real(t) : t; }

inline Staged stage(const at::Tensor& t) {
  if (t.is_contiguous()) return {t, nullptr};
  at::Tensor tmp = t.contiguous();
  at::Tensor target = t;
  return {tmp, [target, tmp]() mutable { target.copy_(tmp); }};
}

// Always a separate buffer, for outputs that alias an input.
inline Staged stageCopy(const at::Tensor& t) {
  at::Tensor tmp = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor target = t;
  return {tmp, [target, tmp]() mutable { target.copy_(tmp); }};
}

// Concatenates flattened tensors (same dtype) into one contiguous buffer.
inline at::Tensor flatCat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flats;
  flats.reserve(ts.size());
  for (const auto& t : ts) flats.push_back(asParts(t).reshape({-1}));
  return at::cat(flats);
}

// Copies consecutive runs of `flat` back into `ts`, in order.
inline void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& ts) {
  int64_t off = 0;
  for (auto& t : ts) {
    at::Tensor parts = asParts(t);
    parts.copy_(flat.narrow(0, off, parts.numel()).view(parts.sizes()));
    off += parts.numel();
  }
}

}  // namespace ringx
