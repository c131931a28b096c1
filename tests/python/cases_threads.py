"""Case bodies that look at the threads of a worker process."""

import os
import time

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


def _progress_threads():
    """{tid: context switches so far} of this process's ringx progress threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "ringx-progress":
                    continue
            with open(f"/proc/self/task/{tid}/status") as f:
                out[tid] = sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:  # the thread ended
            continue
    return out


def progress_thread_switches(iters):
    """The context switches of the group's progress thread over `iters` synchronous
    8-byte all_reduces, and the seconds they took."""
    t = torch.ones(2)
    dist.all_reduce(t)
    before = _progress_threads()
    start = time.monotonic()
    for _ in range(iters):
        dist.all_reduce(t)
    seconds = time.monotonic() - start
    after = _progress_threads()
    return {"threads": len(after), "seconds": seconds,
            "switches": sum(after[tid] - before.get(tid, 0) for tid in after)}
