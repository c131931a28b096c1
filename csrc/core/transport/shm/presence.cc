#include "core/transport/shm/presence.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <random>

namespace ringx {

namespace {

constexpr size_t kPage = 4096;

void* mapFd(int fd, int prot) {
  void* p = ::mmap(nullptr, kPage, prot, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

PresenceMark::PresenceMark() {
  std::random_device rd;
  const std::string name = "/ringx-up-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return;
  if (::posix_fallocate(fd, 0, kPage) != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return;
  }
  void* p = mapFd(fd, PROT_READ | PROT_WRITE);
  if (!p) {
    ::shm_unlink(name.c_str());
    return;
  }
  flag_ = new (p) std::atomic<uint32_t>(1);
  name_ = name;
  linked_ = true;
}

PresenceMark::~PresenceMark() {
  leave();
  unlinkName();
  if (flag_) ::munmap(flag_, kPage);
}

void PresenceMark::unlinkName() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

void PresenceMark::leave() {
  if (flag_) flag_->store(0, std::memory_order_release);
}

PeerPresence::PeerPresence(const std::string& name) {
  if (name.empty()) return;
  int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return;
  flag_ = static_cast<const std::atomic<uint32_t>*>(mapFd(fd, PROT_READ));
}

PeerPresence::~PeerPresence() {
  if (flag_) ::munmap(const_cast<std::atomic<uint32_t>*>(flag_), kPage);
}

PeerPresence& PeerPresence::operator=(PeerPresence&& other) noexcept {
  if (this != &other) {
    if (flag_) ::munmap(const_cast<std::atomic<uint32_t>*>(flag_), kPage);
    flag_ = other.flag_;
    other.flag_ = nullptr;
  }
  return *this;
}

}  // namespace ringx
