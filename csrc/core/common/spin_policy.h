// How long a thread that progresses ringx polls before it sleeps
// (RINGX_SPIN_US). Polling answers a peer sooner only while the poller has a
// core to itself; with more ranks on a host than CPUs to run them, every
// microsecond one rank polls is taken from a rank that could move, so `auto`
// sleeps at once there.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace ringx {

// The spin that `auto` gives a rank with a core to itself.
inline constexpr std::chrono::microseconds kSpinWithOwnCore{50};

// RINGX_SPIN_US: microseconds (0: never spin), or nullopt for `auto`.
// Throws Error(InvalidArgument) on anything else.
std::optional<std::chrono::microseconds> spinSetting();

struct SpinDecision {
  std::chrono::microseconds spin{0};
  // `auto`: a wait for the network alone spins only while such waits mostly
  // end within the spin (CommOptions::gaugeNetworkSpin).
  bool gaugeNetwork = false;
  std::string why;  // for the INFO log
};

// `cpus`: the CPUs this process may run on; `ranksOnHost`: the ranks that
// share them.
SpinDecision decideSpin(std::optional<std::chrono::microseconds> setting, int cpus,
                        int ranksOnHost);

// The CPUs in this process's affinity mask (at least 1).
int cpusAvailable();

}  // namespace ringx
