// A rank's sign of life to the ranks of its group on the same host, beside its
// pid. A process that destroyed or aborted its group but lives on (a torchft
// replica dropping its group to reconfigure, a rank excluded by shrink_group,
// ranks that are threads of one process) has left the group although its pid
// is alive: peers waiting on it must hear "closed" at once, as they do when
// its process exits, instead of waiting out the timeout.
//
// Each rank owns a one-page POSIX shared-memory object holding a flag; peers
// map it when they connect. Its name is removed once every peer has mapped it,
// so a crash leaves nothing in /dev/shm.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace ringx {

class PresenceMark {
 public:
  // Marks this rank present. Where /dev/shm refuses the page, name() is
  // empty and peers fall back to the pid alone.
  PresenceMark();
  ~PresenceMark();
  PresenceMark(const PresenceMark&) = delete;
  PresenceMark& operator=(const PresenceMark&) = delete;

  const std::string& name() const { return name_; }
  // Once every peer has mapped the page.
  void unlinkName();
  // This rank has left the group: peers that check see it gone.
  void leave();

 private:
  std::string name_;
  std::atomic<uint32_t>* flag_ = nullptr;
  bool linked_ = false;
};

class PeerPresence {
 public:
  PeerPresence() = default;
  // Maps a peer's mark by name; an empty name or one that cannot be opened
  // gives a view that never reports the peer gone.
  explicit PeerPresence(const std::string& name);
  ~PeerPresence();
  PeerPresence(PeerPresence&& other) noexcept : flag_(other.flag_) { other.flag_ = nullptr; }
  PeerPresence& operator=(PeerPresence&& other) noexcept;
  PeerPresence(const PeerPresence&) = delete;
  PeerPresence& operator=(const PeerPresence&) = delete;

  bool gone() const { return flag_ && flag_->load(std::memory_order_acquire) == 0; }

 private:
  const std::atomic<uint32_t>* flag_ = nullptr;
};

}  // namespace ringx
