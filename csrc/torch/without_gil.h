// Runs fn with the GIL released when the calling thread holds it.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

namespace ringx {

// Stopping a group joins its threads, and a completion callback on one of
// them may be waiting for the GIL (a Python continuation): never hold it
// across the join. Python may call in holding it (destroy_process_group, the
// last reference dropped, from any thread).
template <typename Fn>
void withoutGil(Fn fn) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release nogil;
    fn();
  } else {
    fn();
  }
}

}  // namespace ringx
