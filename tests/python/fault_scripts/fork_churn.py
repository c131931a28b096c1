"""Forks while another thread makes and destroys ringx groups, one process, no launcher.

    fork_churn.py FORKS CHILD_LIMIT_S

A thread makes a group of one on a store of its own, all_reduces on it and destroys
it, over and over: most of its time is spent making the process's UCX worker, under
ringx's locks. Meanwhile the main thread forks FORKS times, a few milliseconds apart;
each child makes a world of its own on a new store and all_reduces on it. A child
that has not exited CHILD_LIMIT_S after its fork is killed and counted as hung.
Prints one JSON line: {"forks", "hung", "failed": [exit codes], "cycles"}.
"""

import datetime
import json
import os
import random
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from ringx import _C

FORKS, CHILD_LIMIT_S = int(sys.argv[1]), float(sys.argv[2])
LIMIT = datetime.timedelta(seconds=10)
torch.set_num_threads(1)


def world_all_reduce():
    group = _C.ProcessGroupRingx(dist.HashStore(), 0, 1, LIMIT)
    t = torch.ones(4)
    group.allreduce([t]).wait()
    return t.tolist() == [1.0] * 4


stop = threading.Event()
cycles = [0]


def churn():
    while not stop.is_set():
        world_all_reduce()
        cycles[0] += 1


thread = threading.Thread(target=churn, daemon=True)
thread.start()
while cycles[0] == 0:
    time.sleep(0.01)

hung, failed = 0, []
for _ in range(FORKS):
    time.sleep(random.uniform(0, 0.05))
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if world_all_reduce() else 3)
        except BaseException:  # noqa: BLE001
            os._exit(4)
    deadline = time.monotonic() + CHILD_LIMIT_S
    done, status = os.waitpid(pid, os.WNOHANG)
    while done == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
        done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        hung += 1
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    elif status != 0:
        failed.append(os.waitstatus_to_exitcode(status))

stop.set()
thread.join(timeout=30)
print(json.dumps({"forks": FORKS, "hung": hung, "failed": failed, "cycles": cycles[0]}), flush=True)
os._exit(0)
