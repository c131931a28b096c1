// A named POSIX shared-memory segment that other processes of this host map
// by its name: the simulated device's "IPC" buffers and the ipc path's
// mailboxes live in such segments, so that what a peer process writes is
// what this one reads, as with CUDA IPC between processes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace ringx {

class ShmSegment {
 public:
  // A new segment of `bytes`, every page claimed now (a full /dev/shm fails
  // here, not with a SIGBUS later). Throws Error(Internal) naming `what`.
  static std::unique_ptr<ShmSegment> create(size_t bytes, const std::string& what);
  // Maps the segment another process (or this one) created. Throws
  // Error(Internal) naming `what` when it does not exist or is smaller.
  static std::unique_ptr<ShmSegment> open(const std::string& name, size_t bytes, const std::string& what);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  // Removes the name (the memory stays while mapped): once every peer has
  // opened it, so that a crash leaves nothing in /dev/shm. The creator's
  // destructor removes it too.
  void unlinkName();

 private:
  ShmSegment(std::string name, std::byte* data, size_t bytes, bool owner)
      : name_(std::move(name)), data_(data), bytes_(bytes), linked_(owner) {}

  std::string name_;
  std::byte* data_;
  size_t bytes_;
  bool linked_;
};

}  // namespace ringx
