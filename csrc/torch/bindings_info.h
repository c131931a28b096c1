#pragma once

#include <torch/csrc/utils/pybind.h>

namespace ringx {

// Adds _settings, _simd, _ucx and _host to ringx._C.
void bindInfo(pybind11::module_& m);

}  // namespace ringx
