#include "core/common/host_caps.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace ringx {

namespace {

std::string errnoText(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

bool probeShm(std::string& detail) {
  const std::string name = "/ringx-probe-" + std::to_string(::getpid());
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    detail = errnoText("shm_open");
    return false;
  }
  ::shm_unlink(name.c_str());
  const size_t bytes = 1 << 20;
  bool ok = ::ftruncate(fd, off_t(bytes)) == 0;
  if (!ok) detail = errnoText("ftruncate");
  void* p = ok ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (ok && p == MAP_FAILED) {
    ok = false;
    detail = errnoText("mmap");
  }
  if (p != MAP_FAILED) ::munmap(p, bytes);
  ::close(fd);
  if (ok) {
    struct statvfs fs{};
    detail = ::statvfs("/dev/shm", &fs) == 0
                 ? "/dev/shm, " +
                       std::to_string((unsigned long long)fs.f_bavail * fs.f_frsize >> 20) +
                       " MiB free"
                 : "/dev/shm";
  }
  return ok;
}

bool probeCma(std::string& detail) {
  char src[64] = "ringx cma probe", dst[64] = {};
  iovec local{dst, sizeof(dst)}, remote{src, sizeof(src)};
  const bool ok =
      ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == ssize_t(sizeof(src)) &&
      std::memcmp(src, dst, sizeof(src)) == 0;
  if (!ok) detail = errnoText("process_vm_readv");
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int level = -1;
  if (scope >> level) {
    static const char* meaning[] = {"any process of the same user",
                                    "descendants only (or PR_SET_PTRACER)", "CAP_SYS_PTRACE only",
                                    "no process"};
    const std::string policy =
        "yama ptrace_scope " + std::to_string(level) +
        (level >= 0 && level <= 3 ? std::string(": ") + meaning[level] + " may read a peer"
                                  : std::string());
    detail = detail.empty() ? policy : detail + "; " + policy;
  } else if (ok) {
    detail = "no yama ptrace policy: processes of the same user may read each other";
  }
  return ok;
}

}  // namespace

HostCaps hostCaps() {
  HostCaps caps;
  caps.shm = probeShm(caps.shmDetail);
  caps.cma = probeCma(caps.cmaDetail);
  return caps;
}

}  // namespace ringx
