// ringx._C's view of the settings table, the build and the host, for
// `python -m ringx` and the README's knob table.
#include "torch/bindings_info.h"

#include "core/common/error.h"
#include "core/common/host_caps.h"
#include "core/common/settings.h"
#include "core/reduce/reduce.h"
#include "core/transport/ucx/ucx_info.h"

namespace py = pybind11;

namespace ringx {

namespace {

const char* typeName(SettingType t) {
  switch (t) {
    case SettingType::Text:
      return "text";
    case SettingType::Choice:
      return "choice";
    case SettingType::Flag:
      return "flag";
    case SettingType::PositiveInt:
      return "positive integer";
  }
  return "?";
}

py::list settings() {
  py::list out;
  for (const auto& s : settingsTable()) {
    py::dict d;
    d["name"] = s.name;
    d["type"] = typeName(s.type);
    d["values"] = s.values;
    d["default"] = s.defaultText;
    d["ranks_must_agree"] = s.ranksMustAgree;
    d["help"] = s.help;
    const auto v = settingValue(s.name);
    d["set"] = v ? py::cast(*v) : py::none();
    try {
      d["effective"] = settingEffective(s.name);
    } catch (const Error& e) {
      d["effective"] = std::string("invalid: ") + e.what();
    }
    out.append(d);
  }
  return out;
}

}  // namespace

void bindInfo(py::module_& m) {
  m.def("_settings", &settings,
        "Every RINGX_* setting: its row of the table and its value in effect.");
  m.def("_simd", [] {
    py::dict d;
    d["targets"] = cpuKernelTargets();
    d["in_use"] = cpuKernelTargetInUse();
    return d;
  });
  m.def("_ucx", [] {
    const UcxInfo info = ucxInfo();
    py::dict d;
    d["version"] = info.version;
    d["library"] = info.library;
    d["transports"] = info.transports;
    d["error"] = info.error;
    return d;
  });
  m.def("_ucx_memory_events", []() -> py::object {
    const int on = ucxMemoryEvents();
    return on < 0 ? py::object(py::none()) : py::object(py::bool_(on == 1));
  });
  m.def("_host", [] {
    const HostCaps caps = hostCaps();
    py::dict d;
    d["shm"] = caps.shm;
    d["shm_detail"] = caps.shmDetail;
    d["cma"] = caps.cma;
    d["cma_detail"] = caps.cmaDetail;
    return d;
  });
}

}  // namespace ringx
