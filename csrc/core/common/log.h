// Diagnostics on stderr, filtered by RINGX_DEBUG=WARN|INFO|TRACE (default WARN).
#pragma once

#include <sstream>
#include <string>

namespace ringx {

enum class LogLevel { Warn = 0, Info = 1, Trace = 2 };

// RINGX_DEBUG as of the first log line or the last reloadLogLevel() (each
// process group calls it when it is built).
LogLevel logLevel();
void reloadLogLevel();
void logLine(LogLevel level, const std::string& line);

}  // namespace ringx

#define RINGX_LOG(level, expr)                                        \
  do {                                                                \
    if (::ringx::logLevel() >= ::ringx::LogLevel::level) {            \
      std::ostringstream ringx_log_os_;                               \
      ringx_log_os_ << expr;                                          \
      ::ringx::logLine(::ringx::LogLevel::level, ringx_log_os_.str()); \
    }                                                                 \
  } while (0)
