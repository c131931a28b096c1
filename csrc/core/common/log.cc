#include "core/common/log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <strings.h>

namespace ringx {

LogLevel logLevel() {
  static const LogLevel level = [] {
    const char* v = std::getenv("RINGX_DEBUG");
    if (!v) return LogLevel::Warn;
    if (strcasecmp(v, "TRACE") == 0) return LogLevel::Trace;
    if (strcasecmp(v, "INFO") == 0) return LogLevel::Info;
    return LogLevel::Warn;
  }();
  return level;
}

void logLine(LogLevel level, const std::string& line) {
  static const char* names[] = {"WARN", "INFO", "TRACE"};
  std::fprintf(stderr, "[ringx %s pid %d] %s\n", names[int(level)], int(::getpid()), line.c_str());
}

}  // namespace ringx
