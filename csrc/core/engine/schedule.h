// A schedule is what an algorithm emits: a DAG of small steps (send a segment
// to a peer, receive one into a buffer, reduce one buffer into another, copy,
// scale) that the engine drives without blocking. Pipelining, flow control
// (a receive slot is reused only after the reduce that drained it) and every
// error path live in the dependencies and in the engine, not in algorithms.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/common/types.h"
#include "core/device/device.h"
#include "core/reduce/reduce.h"

namespace ringx {

using StepId = uint32_t;
inline constexpr StepId kNoStep = ~StepId{0};

// Poll steps run a non-blocking predicate until it returns true: intra-host
// algorithms wait on peers' counters in shared memory with them. A predicate
// that finds the ranks disagree throws ringx::Error, which fails the op; its
// `waitingOn` lists the ranks it still waits for, for timeout messages, each
// of which must move before it can return true: a thread asleep on the
// doorbell registers for one of them only (communicator_progress.cc).
enum class StepKind : uint8_t { Send, Recv, Reduce, Copy, Scale, Poll };

// A predicate that is not ready yet but moved its work forward (copied a
// piece) says so, on the thread that runs it, so that the engine does not
// take the pass for idle and sleep on the doorbell that no peer will ring.
inline thread_local bool pollProgressed = false;
inline void notePollProgress() { pollProgressed = true; }

// The buffer and length of a Send or Recv that are known only once earlier
// steps of its op have run (a sparse all_reduce's receives, sized by the
// nonzero counts its first messages carry): a step of the op that the
// transfer depends on fills it in, and the engine reads it when it posts
// the transfer.
struct LateExtent {
  void* data = nullptr;
  size_t bytes = 0;
};

struct Step {
  StepKind kind;
  int peer = -1;              // Send/Recv; Poll: index of its predicate
  uint64_t tag = 0;           // Send/Recv, caller bits only
  void* dst = nullptr;        // Recv target; Reduce/Copy/Scale destination
  const void* src = nullptr;  // Send source; Reduce/Copy source
  size_t bytes = 0;           // Send/Recv/Copy length; Reduce/Scale: bytes of dst
  bool device = false;        // its buffers are device memory (the schedule's DeviceQueue)
  const LateExtent* late = nullptr;  // Send/Recv: set, the transfer's buffer and length

  const void* sendData() const { return late ? late->data : src; }
  void* recvData() const { return late ? late->data : dst; }
  size_t transferBytes() const { return late ? late->bytes : bytes; }
};

// A schedule on device buffers (`device` set) marks its steps: the engine
// enqueues their reduce, copy and scale on the device's stream, each done
// when its event has fired, and their transfers name the device's memory.
// Its scratch is device memory. Appended to a host schedule (the identity
// check), its steps stay device steps and the host's stay host steps.
class Schedule {
 public:
  Schedule(DType dtype, ReduceOp op, DeviceQueue device = {}) : dtype_(dtype), op_(op), device_(device) {}

  // Adds a step that may start once every listed step is done; kNoStep
  // entries are ignored so builders can pass optional dependencies.
  StepId add(const Step& step, std::initializer_list<StepId> deps = {}) {
    return add(step, std::span<const StepId>(deps.begin(), deps.size()));
  }
  StepId add(const Step& step, std::span<const StepId> deps) {
    StepId id = StepId(steps_.size());
    steps_.push_back(step);
    steps_.back().device = bool(device_) && step.kind != StepKind::Poll;
    dependents_.emplace_back();
    uint32_t n = 0;
    for (StepId d : deps) {
      if (d == kNoStep) continue;
      dependents_[d].push_back(id);
      ++n;
    }
    depCount_.push_back(n);
    return id;
  }

  // Makes an existing step also wait for `before`; only while the schedule
  // is being built.
  void addDependency(StepId before, StepId step) {
    dependents_[before].push_back(step);
    ++depCount_[step];
  }

  StepId send(int peer, uint64_t tag, const void* src, size_t bytes, std::initializer_list<StepId> deps = {}) {
    return add({StepKind::Send, peer, tag, nullptr, src, bytes}, deps);
  }
  StepId recv(int peer, uint64_t tag, void* dst, size_t bytes, std::initializer_list<StepId> deps = {}) {
    return add({StepKind::Recv, peer, tag, dst, nullptr, bytes}, deps);
  }
  // Transfers whose buffer and length are read from `extent` when they are
  // posted; `extent` must outlive the op (its schedule's polls may own it).
  StepId sendLate(int peer, uint64_t tag, const LateExtent* extent, std::initializer_list<StepId> deps = {}) {
    return add({StepKind::Send, peer, tag, nullptr, nullptr, 0, false, extent}, deps);
  }
  StepId recvLate(int peer, uint64_t tag, const LateExtent* extent, std::initializer_list<StepId> deps = {}) {
    return add({StepKind::Recv, peer, tag, nullptr, nullptr, 0, false, extent}, deps);
  }
  StepId reduce(void* dst, const void* src, size_t bytes, std::initializer_list<StepId> deps = {}) {
    return add({StepKind::Reduce, -1, 0, dst, src, bytes}, deps);
  }
  StepId copy(void* dst, const void* src, size_t bytes, std::initializer_list<StepId> deps = {}) {
    return add({StepKind::Copy, -1, 0, dst, src, bytes}, deps);
  }
  StepId scale(void* buf, size_t bytes, std::initializer_list<StepId> deps = {}) {
    return add({StepKind::Scale, -1, 0, buf, nullptr, bytes}, deps);
  }

  using PollFn = std::function<bool()>;
  using WaitingOnFn = std::function<std::vector<int>()>;
  StepId poll(PollFn ready, WaitingOnFn waitingOn, std::initializer_list<StepId> deps = {}) {
    polls_.push_back({std::move(ready), std::move(waitingOn)});
    return add({StepKind::Poll, int(polls_.size() - 1), 0, nullptr, nullptr, 0}, deps);
  }
  // A step that does nothing but wait for `deps`: where a later phase of an
  // op starts once every last step of the earlier one is done.
  StepId join(std::span<const StepId> deps) {
    polls_.push_back({[] { return true; }, nullptr});
    return add({StepKind::Poll, int(polls_.size() - 1), 0, nullptr, nullptr, 0}, deps);
  }
  // A poll on an event of `device`: no peer rings the doorbell when it
  // fires, so the engine keeps looking instead of sleeping on the bell.
  // `waitingOn`, when the device waits on peers, names them (timeouts, dead
  // peers) as a poll's does.
  StepId pollDevice(Device* device, PollFn ready, std::span<const StepId> deps = {}, WaitingOnFn waitingOn = nullptr) {
    polls_.push_back({std::move(ready), std::move(waitingOn), device});
    return add({StepKind::Poll, int(polls_.size() - 1), 0, nullptr, nullptr, 0}, deps);
  }
  bool runPoll(const Step& step) const { return polls_[size_t(step.peer)].ready(); }
  bool pollOnDevice(const Step& step) const { return polls_[size_t(step.peer)].device != nullptr; }
  std::vector<int> pollWaitingOn(const Step& step) const {
    const auto& fn = polls_[size_t(step.peer)].waitingOn;
    return fn ? fn() : std::vector<int>{};
  }

  // Run when the engine ends the op before its steps do (a timeout, an
  // abort, another op's failure), before the caller gets its buffers back:
  // what a step exposed to peers is withdrawn here. `why` is the op's error.
  void onAbandon(std::function<void(const std::string& why)> fn) { abandon_.push_back(std::move(fn)); }
  void abandon(const std::string& why) {
    for (auto& fn : std::exchange(abandon_, {})) fn(why);
  }

  // Scratch memory owned by the schedule (receive slots, staging copies).
  std::byte* scratch(size_t bytes) {
    if (device_) {
      OnDevice on(device_.device);
      deviceScratch_.push_back(device_.device->allocDevice(bytes));
      return deviceScratch_.back().get();
    }
    scratch_.push_back(std::make_unique_for_overwrite<std::byte[]>(bytes ? bytes : 1));
    return scratch_.back().get();
  }

  // Whether any step reduces or scales, i.e. uses dtype(), op() and
  // scaleFactor().
  bool reduces() const {
    for (const Step& s : steps_) {
      if (s.kind == StepKind::Reduce || s.kind == StepKind::Scale) return true;
    }
    return false;
  }

  // Takes over `other`'s steps, polls and scratch, none of them depending on
  // this schedule's, so both run as they would as two ops submitted together
  // (how a coalesced batch becomes one op). Reduce and Scale steps use one
  // dtype, op and scale factor per schedule: when both reduce, the caller
  // must have checked that those agree.
  void append(Schedule&& other) {
    if (!device_) device_ = other.device_;
    if (!reduces()) {
      dtype_ = other.dtype_;
      op_ = other.op_;
      scaleFactor_ = other.scaleFactor_;
    }
    const StepId base = StepId(steps_.size());
    const int pollBase = int(polls_.size());
    for (size_t i = 0; i < other.steps_.size(); ++i) {
      Step step = other.steps_[i];
      if (step.kind == StepKind::Poll) step.peer += pollBase;
      steps_.push_back(step);
      std::vector<StepId> after = std::move(other.dependents_[i]);
      for (StepId& d : after) d += base;
      dependents_.push_back(std::move(after));
      depCount_.push_back(other.depCount_[i]);
    }
    for (auto& p : other.polls_) polls_.push_back(std::move(p));
    for (auto& b : other.scratch_) scratch_.push_back(std::move(b));
    for (auto& b : other.deviceScratch_) deviceScratch_.push_back(std::move(b));
    for (auto& fn : other.abandon_) abandon_.push_back(std::move(fn));
    algorithm_ += (algorithm_.empty() ? "" : "+") + other.algorithm_;
    other = Schedule(other.dtype_, other.op_);
  }

  // Takes over `other` as a later phase of this op: its steps that depend on
  // nothing wait for `after` instead. Returns the steps of `other` that no
  // step depends on (its last ones), for what must wait for it in turn. Same
  // rule on dtype, op and scale factor as append().
  std::vector<StepId> appendAfter(Schedule&& other, StepId after) {
    const StepId base = StepId(steps_.size());
    append(std::move(other));
    std::vector<StepId> last;
    for (StepId id = base; id < steps_.size(); ++id) {
      if (depCount_[id] == 0 && after != kNoStep) addDependency(after, id);
      if (dependents_[id].empty()) last.push_back(id);
    }
    return last;
  }

  // Renames the peers of every Send and Recv: `groupRank[p]` for peer p. A
  // schedule built for a subset of the group's ranks (numbered 0..k-1) then
  // talks to the group ranks they stand for.
  void mapPeers(const std::vector<int>& groupRank) {
    for (Step& st : steps_) {
      if ((st.kind == StepKind::Send || st.kind == StepKind::Recv) && st.peer >= 0) {
        st.peer = groupRank[size_t(st.peer)];
      }
    }
  }

  // Rewrites the tag of every Send and Recv as `retag(tag)`: several
  // sub-schedules of one op, each numbering its messages from 0, then keep
  // apart on the wire.
  template <typename Retag>
  void mapTags(Retag retag) {
    for (Step& st : steps_) {
      if (st.kind == StepKind::Send || st.kind == StepKind::Recv) st.tag = retag(st.tag);
    }
  }

  void setScaleFactor(double f) { scaleFactor_ = f; }
  void setAlgorithm(std::string name) { algorithm_ = std::move(name); }
  // A receive whose peer closed its connection does not end the op at once:
  // the op goes on waiting for its other receives (to the deadline), then
  // fails naming every peer that closed or never sent, as gloo's
  // monitored_barrier does with wait_all_ranks.
  void setWaitOutClosedPeers() { waitOutClosedPeers_ = true; }
  bool waitsOutClosedPeers() const { return waitOutClosedPeers_; }

  DType dtype() const { return dtype_; }
  const DeviceQueue& device() const { return device_; }
  // The device that releasing this schedule (its staging polls' state, its
  // device scratch, its events) may call into; null when none.
  Device* touchedDevice() const {
    if (device_) return device_.device;
    for (const PollStep& p : polls_) {
      if (p.device) return p.device;
    }
    return nullptr;
  }
  // One event per step that runs on the device, made by the thread that
  // issues the op: on a GPU, making or destroying an event can wait for a
  // driver lock that a thread blocked in a synchronous copy holds until this
  // very op ends, so the thread that progresses the op must do neither. The
  // kernels are loaded here too, for the same reason: a lazy load at the
  // first launch, on the progressing thread, takes the driver's locks.
  void makeStepEvents() {
    if (!device_) return;
    OnDevice on(device_.device);
    device_.device->loadKernels();
    stepEvents_.resize(steps_.size());
    for (size_t i = 0; i < steps_.size(); ++i) {
      if (steps_[i].device && !stepEvents_[i]) stepEvents_[i] = device_.device->newEvent();
    }
  }
  DeviceEvent& stepEvent(StepId id) const { return *stepEvents_.at(id); }
  ReduceOp op() const { return op_; }
  double scaleFactor() const { return scaleFactor_; }
  const std::string& algorithm() const { return algorithm_; }
  const std::vector<Step>& steps() const { return steps_; }
  const std::vector<std::vector<StepId>>& dependents() const { return dependents_; }
  const std::vector<uint32_t>& depCounts() const { return depCount_; }

 private:
  DType dtype_;
  ReduceOp op_;
  double scaleFactor_ = 1.0;
  bool waitOutClosedPeers_ = false;
  DeviceQueue device_;
  std::string algorithm_;
  std::vector<Step> steps_;
  std::vector<std::vector<StepId>> dependents_;
  std::vector<uint32_t> depCount_;
  std::vector<std::unique_ptr<std::byte[]>> scratch_;
  std::vector<std::shared_ptr<std::byte>> deviceScratch_;
  std::vector<std::unique_ptr<DeviceEvent>> stepEvents_;
  struct PollStep {
    PollFn ready;
    WaitingOnFn waitingOn;
    Device* device = nullptr;
  };
  std::vector<PollStep> polls_;
  std::vector<std::function<void(const std::string&)>> abandon_;
};

}  // namespace ringx
