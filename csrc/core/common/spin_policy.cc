#include "core/common/spin_policy.h"

#include <sched.h>
#include <strings.h>

#include <algorithm>
#include <cstdlib>

#include "core/common/error.h"
#include "core/common/settings.h"

namespace ringx {

std::optional<std::chrono::microseconds> spinSetting() {
  const std::string v = settingText("RINGX_SPIN_US");
  if (::strcasecmp(v.c_str(), "auto") == 0) return std::nullopt;
  char* end = nullptr;
  const unsigned long long us = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v.front() == '-' || end == v.c_str() || *end) {
    throw Error(ErrorKind::InvalidArgument,
                "ringx: RINGX_SPIN_US='" + v + "' is not " + settingSpec("RINGX_SPIN_US").values);
  }
  return std::chrono::microseconds(us);
}

SpinDecision decideSpin(std::optional<std::chrono::microseconds> setting, int cpus,
                        int ranksOnHost) {
  const std::string counts = std::to_string(ranksOnHost) + " ranks on this host, " +
                             std::to_string(cpus) + " CPUs to run them";
  if (setting) {
    return {*setting, false,
            "spins " + std::to_string(setting->count()) + " us before sleeping (RINGX_SPIN_US; " +
                counts + ")"};
  }
  if (cpus >= ranksOnHost) {
    return {kSpinWithOwnCore, true,
            "spins " + std::to_string(kSpinWithOwnCore.count()) +
                " us before sleeping (RINGX_SPIN_US=auto: " + counts +
                ", a core each), on the network alone only while such waits mostly end within it"};
  }
  return {std::chrono::microseconds(0), true,
          "sleeps at once when it waits (RINGX_SPIN_US=auto: " + counts +
              ", so a spin would take a core "
              "from a rank that could move)"};
}

int cpusAvailable() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace ringx
