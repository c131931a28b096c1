// processAlive decides whether a failed same-host transfer was a peer's death:
// it must say "dead" from the moment the peer begins to exit, because the
// peer's shared memory is gone before it turns zombie.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "core/common/process_state.h"

using ringx::aliveByStatLine;
using ringx::processAlive;

TEST_CASE("processAlive: a running process is alive, and dead once it exited, zombie or reaped") {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::pause();
    ::_exit(0);
  }
  CHECK(processAlive(pid));
  ::kill(pid, SIGKILL);
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, pid, &info, WEXITED | WNOWAIT) == 0);
  CHECK_FALSE(processAlive(pid));
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK_FALSE(processAlive(pid));
}

TEST_CASE("aliveByStatLine: a process marked exiting (PF_EXITING) is dead before it turns zombie") {
  // Fields after the name: state ppid pgrp session tty_nr tpgid flags ...
  // 0x400040 is a running process's usual flags, 0x400044 the same exiting.
  CHECK(aliveByStatLine("4242 (python3) S 1 4242 4242 0 -1 4194368 900 0 0 0 12 3"));
  CHECK_FALSE(aliveByStatLine("4242 (python3) R 1 4242 4242 0 -1 4194372 900 0 0 0 12 3"));
  CHECK_FALSE(aliveByStatLine("4242 (python3) D 1 4242 4242 0 -1 4194372 900 0 0 0 12 3"));
  CHECK_FALSE(aliveByStatLine("4242 (python3) Z 1 4242 4242 0 -1 4194368 900 0 0 0 12 3"));
  CHECK_FALSE(aliveByStatLine("4242 (python3) X 1 4242 4242 0 -1 4194368 900 0 0 0 12 3"));
}

TEST_CASE("aliveByStatLine: a name with spaces and parentheses does not shift the fields") {
  CHECK(aliveByStatLine("4242 (pt_main (x) R 4) S 1 4242 4242 0 -1 4194368 900 0 0 0 12 3"));
  CHECK_FALSE(aliveByStatLine("4242 (pt_main (x) R 4) S 1 4242 4242 0 -1 4194372 900 0 0 0 12 3"));
}

TEST_CASE("aliveByStatLine: a line it cannot read counts as alive, so a live peer is never failed") {
  CHECK(aliveByStatLine("4242 (python3"));
  CHECK(aliveByStatLine("4242 (python3) S"));
}
