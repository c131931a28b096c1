// Contiguous working buffers for user tensors, and the copy-back that hands
// results to tensors whose layout the schedule could not write directly.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
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

// A flat view of `ts` when they already lie back to back in memory, in
// order and contiguous (a list made by unbind or chunk of one tensor), and
// none of them overlaps `other`: the schedule then reads or writes them
// directly, without a staging buffer and a copy through it.
inline std::optional<at::Tensor> adjacentFlat(const std::vector<at::Tensor>& ts, const at::Tensor& other) {
  if (ts.empty()) return std::nullopt;
  const at::Tensor first = asParts(ts[0]);
  const int64_t numel = first.numel();
  const size_t bytes = size_t(numel) * first.element_size();
  auto* base = static_cast<const std::byte*>(first.data_ptr());
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor t = asParts(ts[i]);
    if (!t.is_contiguous() || t.scalar_type() != first.scalar_type() || t.numel() != numel ||
        static_cast<const std::byte*>(t.data_ptr()) != base + i * bytes) {
      return std::nullopt;
    }
  }
  const at::Tensor o = asParts(other);
  auto* ob = static_cast<const std::byte*>(o.data_ptr());
  const size_t obytes = size_t(o.numel()) * o.element_size();
  if (bytes && obytes && ob < base + ts.size() * bytes && base < ob + obytes) return std::nullopt;
  return at::from_blob(first.data_ptr(), {int64_t(ts.size()) * numel}, first.options());
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
