// Whether spinning pays while a rank waits for the network alone: it does
// where the peers' data usually comes within the spin budget (a fast link,
// peers already there), and only burns a core where it comes later (a slow
// link, a busy peer, hosts whose cores are shared). On the namespace test bed
// (8 hosts sharing 2 cores, one-way latency 100-150 us) the 50 us spin on the
// network made a 4 KiB all_to_all, scatter and broadcast take 1.2-1.5x as long:
// its yields and progress calls took the CPU the peers' TCP stacks needed.
//
// Every network-only wait is scored the same way whether the rank spun or
// slept through it, by how long it lasted, so a rank that stopped spinning
// starts again once waits become short. Waits on peers on this host are not
// scored: a rank that yields there keeps its share of the core.
//
// Used by RINGX_SPIN_US=auto only (CommOptions::gaugeNetworkSpin): against the
// fixed spin it won on the test bed's 8 x 1 and lost the 2 x 2 broadcast of
// 4 KiB by 0-15% (docs/many-hosts.md), so it is not the default.
#pragma once

#include <chrono>

namespace ringx {

class SpinGauge {
 public:
  explicit SpinGauge(std::chrono::microseconds budget) : budget_(budget) {}

  bool worthSpinning() const { return budget_.count() > 0 && shortShare_ >= kEnough; }

  // A network-only wait that ended after `waited` (spun or slept through).
  void record(std::chrono::nanoseconds waited) {
    const double won = waited <= budget_ ? 1.0 : 0.0;
    shortShare_ += (won - shortShare_) * kWeight;
  }

  double shortShare() const { return shortShare_; }

 private:
  // The share of recent waits that ended within the budget, each new wait
  // weighing 1/8 (a moving average): a rank whose waits were all short stops
  // spinning after 6 long ones in a row, and spins again once the short ones
  // are half of the average.
  static constexpr double kWeight = 1.0 / 8;
  static constexpr double kEnough = 0.5;
  std::chrono::microseconds budget_;
  double shortShare_ = 1.0;
};

}  // namespace ringx
