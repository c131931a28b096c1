#include "core/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "core/common/settings.h"

namespace ringx {

namespace {

// -1 until first read. Kept here rather than read per line because RINGX_LOG
// guards lines on every op's path; reloadLogLevel() re-reads it.
std::atomic<int> gLevel{-1};

int readLevel() {
  const std::string v = settingEffective("RINGX_DEBUG");
  if (v == "TRACE") return int(LogLevel::Trace);
  if (v == "INFO") return int(LogLevel::Info);
  return int(LogLevel::Warn);
}

}  // namespace

LogLevel logLevel() {
  int level = gLevel.load(std::memory_order_relaxed);
  if (level < 0) {
    level = readLevel();
    gLevel.store(level, std::memory_order_relaxed);
  }
  return LogLevel(level);
}

void reloadLogLevel() { gLevel.store(readLevel(), std::memory_order_relaxed); }

void logLine(LogLevel level, const std::string& line) {
  static const char* names[] = {"WARN", "INFO", "TRACE"};
  std::fprintf(stderr, "[ringx %s pid %d] %s\n", names[int(level)], int(::getpid()), line.c_str());
}

}  // namespace ringx
