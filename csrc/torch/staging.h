// Contiguous working buffers for user tensors, and the copy-back that hands
// results to tensors whose layout the schedule could not write directly.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
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

// Each tensor's parts as one dimension, for concatenating.
inline std::vector<at::Tensor> flatParts(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flats;
  flats.reserve(ts.size());
  for (const auto& t : ts) flats.push_back(asParts(t).reshape({-1}));
  return flats;
}

// Concatenates flattened tensors (same dtype) into one contiguous buffer.
inline at::Tensor flatCat(const std::vector<at::Tensor>& ts) { return at::cat(flatParts(ts)); }

// Whether two tensors' storage spans share a byte.
inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor pa = asParts(a), pb = asParts(b);
  const size_t na = size_t(pa.numel()) * pa.element_size(), nb = size_t(pb.numel()) * pb.element_size();
  if (!na || !nb) return false;
  auto* ba = static_cast<const std::byte*>(pa.data_ptr());
  auto* bb = static_cast<const std::byte*>(pb.data_ptr());
  return ba < bb + nb && bb < ba + na;
}

// A flat view of `ts` when they already lie back to back in memory, in
// order and contiguous, of one dtype (a list made by split, chunk or unbind
// of one tensor); empty tensors may lie anywhere. None when the list holds
// no element.
inline std::optional<at::Tensor> backToBack(const std::vector<at::Tensor>& ts) {
  const at::Tensor* first = nullptr;
  const std::byte* end = nullptr;
  int64_t numel = 0;
  for (const at::Tensor& t : ts) {
    const at::Tensor p = asParts(t);
    if (!p.is_contiguous() || p.scalar_type() != asParts(ts[0]).scalar_type() || p.device() != ts[0].device())
      return std::nullopt;
    if (p.numel() == 0) continue;
    auto* b = static_cast<const std::byte*>(p.data_ptr());
    if (first && b != end) return std::nullopt;
    if (!first) first = &t;
    end = b + size_t(p.numel()) * p.element_size();
    numel += p.numel();
  }
  if (!first) return std::nullopt;
  const at::Tensor p = asParts(*first);
  return at::from_blob(p.data_ptr(), {numel}, p.options());
}

// backToBack for blocks of one size (the collectives whose blocks are each
// one rank's), none of them overlapping `other`: the schedule then reads or
// writes them directly, without a staging buffer and a copy through it.
inline std::optional<at::Tensor> adjacentFlat(const std::vector<at::Tensor>& ts, const at::Tensor& other) {
  if (ts.empty()) return std::nullopt;
  const int64_t numel = asParts(ts[0]).numel();
  for (const at::Tensor& t : ts) {
    if (asParts(t).numel() != numel) return std::nullopt;
  }
  auto flat = backToBack(ts);
  if (!flat || overlaps(*flat, other)) return std::nullopt;
  return flat;
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
