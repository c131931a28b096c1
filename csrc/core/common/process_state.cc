#include "core/common/process_state.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace ringx {

bool processAlive(int pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(file, stat);
  if (stat.empty()) return ::kill(pid, 0) == 0 || errno == EPERM;
  return aliveByStatLine(stat);
}

// A killed process drops its memory (and with it the shared-memory segments a
// peer is reading) before it turns zombie, so a peer's transfer fails in that
// window and must still be told it was the process's death: the kernel sets
// PF_EXITING before it releases the memory.
bool aliveByStatLine(const std::string& stat) {
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  std::istringstream fields(stat.substr(close + 2));
  char state = 0;
  long ppid = 0, pgrp = 0, session = 0, tty = 0, tpgid = 0;
  unsigned long flags = 0;
  fields >> state >> ppid >> pgrp >> session >> tty >> tpgid >> flags;
  constexpr unsigned long kPfExiting = 0x4;
  if (fields && (flags & kPfExiting)) return false;
  return state != 'Z' && state != 'X';
}

}  // namespace ringx
