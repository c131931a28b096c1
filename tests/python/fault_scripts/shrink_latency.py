"""How long dist.shrink_group takes, to the first collective done on the shrunk group.

    shrink_latency.py TIMEOUT_S REPEATS        (any world size)

The last rank is excluded (alive: it just stays out).  REPEATS times, the others shrink
a fresh group of every rank and all_reduce on the result; then they shrink the default
group the same way (torch then aborts every other group too).  Each survivor records
the seconds from its shrink_group call to its all_reduce's return.
"""

import sys
import time

import faultlib as common

TIMEOUT_S, REPEATS = float(sys.argv[1]), int(sys.argv[2])


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    r, n = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group(list(range(n))) for _ in range(REPEATS)]
    for g in groups:
        dist.all_reduce(torch.ones(1), group=g)  # connected, and warm
    dist.barrier()
    if r == n - 1:
        common.finish(dist)
        return

    def timed(label, group):
        t0 = time.perf_counter()
        shrunk = dist.shrink_group([n - 1], group=group)
        t = torch.ones(1)
        dist.all_reduce(t, group=shrunk)
        common.record("latency", label=label, seconds=time.perf_counter() - t0)
        assert t.item() == n - 1, t

    for i, g in enumerate(groups):
        timed(f"group_{i}", g)
    timed("default", None)
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
