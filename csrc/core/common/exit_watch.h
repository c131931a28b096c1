// Hearing at once that a peer process on this host exited. Polling its pid
// (process_state.h) every 100 ms left a survivor blocked in a collective for
// up to that long after a SIGKILL; a pidfd (pidfd_open, Linux 5.3) becomes
// readable the moment its process has exited, zombie or reaped.
//
// One thread per process waits on the pidfds of every watched process and,
// at each exit, counts it and calls the listeners. A listener only wakes its
// sleepers (the doorbell futex and the event fds cannot wait on a pidfd
// themselves); they then look at their peers the usual way, by pid, which
// by then says "dead". The exit count tells a thread that did not sleep
// (spinning, or about to sleep) to look too.
//
// Nothing depends on it for correctness: where pidfd_open fails (ENOSYS
// before Linux 5.3, EPERM under a seccomp filter) the process goes
// unwatched, and the pid poll finds its death as before.
//
// The thread and its descriptors live while any process is watched. A forked
// child starts with nothing watched and no listener: what its parent's
// objects hold releases nothing there.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace ringx {

// Watches process `pid` while the returned token lives; null where no pidfd
// could be opened. Tokens for the same pid share one pidfd.
std::shared_ptr<void> watchExit(int pid);

// Calls `onExit` on the watching thread whenever a watched process exits,
// until the returned token is dropped (which waits for a call under way).
// `onExit` must be quick and must not watch or listen itself.
std::shared_ptr<void> listenForExits(std::function<void()> onExit);

// How many watched processes were seen to exit, ever. Counted before the
// listeners are called.
uint64_t exitsSeen();

}  // namespace ringx
