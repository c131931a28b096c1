#include "core/common/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "core/common/error.h"

namespace ringx {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& call) {
  throw Error(ErrorKind::Internal, "ringx: " + what + ": " + call + " failed: " + std::strerror(errno));
}

std::byte* mapFd(int fd, size_t bytes, const std::string& what) {
  void* m = ::mmap(nullptr, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail(what, "mmap");
  return static_cast<std::byte*>(m);
}

}  // namespace

std::unique_ptr<ShmSegment> ShmSegment::create(size_t bytes, const std::string& what) {
  static std::atomic<uint64_t> made{0};
  std::random_device rd;
  const std::string name = "/ringx-seg-" + std::to_string(::getpid()) + "-" + std::to_string(rd()) + "-" +
                           std::to_string(made++);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail(what, "shm_open " + name);
  int err = ::ftruncate(fd, off_t(bytes ? bytes : 1)) == 0 ? 0 : errno;
  while (!err && (err = ::posix_fallocate(fd, 0, off_t(bytes ? bytes : 1))) == EINTR) {
  }
  if (err) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    errno = err;
    fail(what, "reserving " + std::to_string(bytes) + " bytes in /dev/shm");
  }
  std::byte* data = nullptr;
  try {
    data = mapFd(fd, bytes, what);
  } catch (...) {
    ::shm_unlink(name.c_str());
    throw;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, data, bytes, true));
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, size_t bytes, const std::string& what) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail(what, "shm_open " + name);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || size_t(st.st_size) < bytes) {
    ::close(fd);
    throw Error(ErrorKind::Internal, "ringx: " + what + ": segment " + name + " holds " +
                                         std::to_string(st.st_size) + " bytes, not the " + std::to_string(bytes) +
                                         " expected; are all ranks running the same ringx build?");
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, mapFd(fd, bytes, what), bytes, false));
}

void ShmSegment::unlinkName() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

ShmSegment::~ShmSegment() {
  unlinkName();
  ::munmap(data_, bytes_ ? bytes_ : 1);
}

}  // namespace ringx
