// Whether this process is a fork of the one that made an object, without a
// system call: getpid() is one, and the fork check sits on every submit and
// wait.
#pragma once

namespace ringx {

// 0 in the process that loaded ringx; each fork's child counts one more than
// its parent.
int forkGeneration();
// getpid(), remembered: renewed in each forked child.
int processId();

}  // namespace ringx
