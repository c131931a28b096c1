"""A rank is SIGKILLed while the others wait in an all_reduce; each survivor records when
its call raised, and the lowest survivor when it sent the signal and when the victim's
exit was complete (its pidfd became readable), so that the launcher can tell how long
the death took to be noticed, and how much of that was the kernel's.

    detection.py VICTIM TIMEOUT_S DRIVER KILL_AT

DRIVER   wait: the survivors block in work.wait() (the caller drives the group);
         thread: they poll work.is_completed() every millisecond, so that only the
         progress thread drives it.
KILL_AT  random: 400-500 ms into the call, at a random point of the 100 ms between
         two of the survivors' pid checks (a fixed delay would kill at the same point
         of that period every time);
         after-check: 110 ms into the call, the survivors having been idle for 150 ms
         before it, so that a pid check runs at the call and the next one only 100 ms
         later: the pid poll's worst case.

The victim never calls the all_reduce: it sleeps until the lowest survivor, whose
main thread is blocked in the collective, kills it from a thread of its own. The kill
time is taken just before os.kill, with nothing written in between, so that the
interval measured is the kernel's and ringx's, not the disk's.
"""

import os
import random
import select
import signal
import sys
import threading
import time

import faultlib as common

VICTIM, TIMEOUT_S, DRIVER, KILL_AT = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]


def kill(pid, delay, seen):
    """Kills `pid` `delay` s from now; records in `seen` when, and when its exit was
    complete (None where pidfd_open is unavailable)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    time.sleep(delay)
    seen["killed"] = time.time()
    os.kill(pid, signal.SIGKILL)
    seen["exited"] = None
    if pidfd is not None:
        select.select([pidfd], [], [], 2 * TIMEOUT_S)
        seen["exited"] = time.time()
        os.close(pidfd)


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == n, t
    pids = [None] * n
    dist.all_gather_object(pids, os.getpid())
    survivors = [q for q in range(n) if q != VICTIM]

    if r == VICTIM:
        time.sleep(3600)
        raise SystemExit("the victim was never killed")

    if KILL_AT == "after-check":
        time.sleep(0.15)
        delay = 0.11
    else:
        delay = 0.4 + random.random() * 0.1
    seen = {}
    killer = threading.Thread(target=kill, args=(pids[VICTIM], delay, seen))
    if r == survivors[0]:
        killer.start()
    work = dist.all_reduce(torch.ones(1), async_op=True)
    if DRIVER == "thread":
        while not work.is_completed():
            time.sleep(0.001)
    common.attempt("pending", work.wait)
    if r == survivors[0]:
        killer.join()
        common.record("killed", at=seen["killed"], exited=seen["exited"])
    common.file_barrier("pending", survivors, timeout=4 * TIMEOUT_S)
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
