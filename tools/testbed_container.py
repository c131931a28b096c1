"""Runs one command as a container of a test-bed host would run it (tools/testbed.py,
layout "containers"): in a pid namespace of its own, with its own /proc, but in the
host's network namespace and with the host's /dev/shm.

    python tools/testbed_container.py COMMAND [ARG...]

The test bed starts one of these per rank, around that rank's torchrun. The command is
PID 1 of its namespace, as an application is in a container without an init: it
ignores signals it has no handler for, so this launcher, outside the namespace, turns a
SIGTERM or SIGINT into a SIGKILL of the command (which ends every process of the
namespace), and the command is SIGKILLed when this launcher dies (as `unshare
--kill-child` does; unshare itself ignores SIGTERM while it waits). Needs root.
"""

import ctypes
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_REC, MS_PRIVATE = 0x4000, 0x40000
PR_SET_PDEATHSIG = 1

libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"testbed_container: {what}: {os.strerror(err)}")


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    _check(libc.unshare(CLONE_NEWPID | CLONE_NEWNS), "unshare")
    child = os.fork()
    if child == 0:
        try:
            _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
            # Mounts made here stay here; /dev/shm is still the host's.
            _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
            _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mounting /proc")
            os.execvp(sys.argv[1], sys.argv[1:])
        except BaseException as e:  # noqa: BLE001 - the child must not return into the launcher
            print(e, file=sys.stderr)
        os._exit(127)

    def stop(signum, frame):
        os.kill(child, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
