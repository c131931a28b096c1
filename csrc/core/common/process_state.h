#pragma once

#include <string>

namespace ringx {

// Whether a process on this host can still take part: false once it has
// exited, is a zombie nobody reaped yet, or has begun to exit.
bool processAlive(int pid);

// The same verdict from a line of /proc/<pid>/stat.
bool aliveByStatLine(const std::string& stat);

}  // namespace ringx
