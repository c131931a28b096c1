// ringx._C: the backend class and a view of the algorithm registry.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "core/algorithms/registry.h"
#include "core/engine/callback_pool.h"
#include "torch/bindings_info.h"
#include "torch/exit_safe_release.h"
#include "torch/process_group_ringx.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  // The base class must be registered before ours refers to it.
  py::module_::import("torch.distributed");

  py::class_<ringx::ProcessGroupRingx, c10d::Backend, c10::intrusive_ptr<ringx::ProcessGroupRingx>>(
      m, "ProcessGroupRingx")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ringx::ProcessGroupRingx>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("_bootstrap_store", &ringx::ProcessGroupRingx::bootstrapStore);

  // Completion callbacks run Python (future continuations): none may start
  // once the interpreter is being torn down. Queued ones run here, while
  // Python still works, with the GIL released so their threads can take it.
  // Then the engine's threads stop releasing tensors (exit_safe_release.cc).
  py::module_::import("atexit").attr("register")(py::cpp_function(
      [] {
        ringx::CallbackPool::stopAll();
        ringx::stopReleasingAtExit();
      },
      py::call_guard<py::gil_scoped_release>()));

  m.def("algorithms", [] {
    py::list out;
    for (const auto& alg : ringx::algorithms()) {
      py::dict d;
      d["collective"] = std::string(ringx::collectiveName(alg.coll));
      d["name"] = std::string(alg.name);
      d["description"] = std::string(alg.description);
      d["constraints"] = std::string(alg.constraints);
      out.append(d);
    }
    return out;
  });

  ringx::bindInfo(m);
}
