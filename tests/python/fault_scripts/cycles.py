"""Repeated init_process_group -> all_reduce -> destroy_process_group in one process:
threads and file descriptors must not accumulate.

    cycles.py CYCLES WARMUP

The first WARMUP cycles may create lasting process-wide state (UCX's async thread,
torch's thread pools); the counts taken after them are the baseline, and the counts
after all CYCLES must equal it.  Every cycle uses a fresh TCPStore port, agreed
through a file in $FAULT_OUT (rank 0 writes cycle i's port before it needs it).
Records "baseline" {threads, fds}, "final" {threads, fds, seconds}, and, if a cycle
fails, the failure.  A thread is counted from /proc/self/task, a descriptor from
/proc/self/fd; "fd_kinds" and "thread_names" describe any difference.
"""

import os
import sys
import time

import faultlib as common

CYCLES, WARMUP = int(sys.argv[1]), int(sys.argv[2])


def port_for(cycle, out, r):
    path = os.path.join(out, f"port{cycle}")
    if r == 0:
        with open(path + ".tmp", "w") as f:
            f.write(str(common.free_port()))
        os.rename(path + ".tmp", path)
    else:
        deadline = time.time() + 60
        while not os.path.exists(path):
            if time.time() > deadline:
                raise TimeoutError(f"no port file for cycle {cycle}")
            time.sleep(0.01)
    with open(path) as f:
        return f.read().strip()


def body():
    import datetime

    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    import ringx  # noqa: F401

    r, n = common.rank(), common.world_size()
    out = os.environ["FAULT_OUT"]
    common.record("start")  # opens the record file, so that it is in the baseline
    t0 = None
    base = None
    for i in range(CYCLES):
        if i == WARMUP:
            base = common.snapshot()
            common.record("baseline", **base)
            t0 = time.time()
        stage = "port"
        try:
            os.environ["MASTER_PORT"] = port_for(i, out, r)
            stage = "init_process_group"
            dist.init_process_group("ringx", timeout=datetime.timedelta(seconds=30))
            stage = "all_reduce"
            x = torch.full((64,), float(r + 1))
            dist.all_reduce(x)
            if not torch.equal(x, torch.full((64,), float(n * (n + 1) // 2))):
                raise AssertionError(f"cycle {i}: wrong all_reduce result {x[:4]}")
            stage = "destroy_process_group"
            dist.destroy_process_group()
        except BaseException as e:
            common.record("cycle_failed", cycle=i, stage=stage, port=os.environ.get("MASTER_PORT"),
                          **common.describe(e))
            raise
    final = common.snapshot()
    common.record("final", seconds=time.time() - t0, cycles=CYCLES - WARMUP, **final)
    common.record("done")


if __name__ == "__main__":
    common.main(body)
