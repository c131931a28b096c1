"""Case bodies that look at the threads of a worker process."""

import os

import torch
import torch.distributed as dist


def pinned_threads():
    """After one all_reduce: {"cpus": the CPUs this process may use, "pinned": {tid: cpu}
    for its threads confined to one of them}."""
    t = torch.ones(4)
    dist.all_reduce(t)
    cpus = sorted(os.sched_getaffinity(0))
    pinned = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            mine = os.sched_getaffinity(int(tid))
        except OSError:  # the thread ended
            continue
        if len(mine) == 1 and len(cpus) > 1:
            pinned[int(tid)] = next(iter(mine))
    return {"cpus": cpus, "pinned": pinned, "sum": float(t[0])}
