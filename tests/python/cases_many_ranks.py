"""Case bodies for a world with many more ranks than cores (test_many_ranks.py)."""

import os
import time

import torch
import torch.distributed as dist


def small_and_chunked_collectives(iters):
    """all_reduce (8 bytes and a size spanning several shared-memory chunks), broadcast
    from the first and the last rank, barrier; every result checked here. Returns the
    seconds the calls took and what the rank holds open."""
    r, n = dist.get_rank(), dist.get_world_size()
    start = time.monotonic()
    wrong = []
    for k in range(iters):
        t = torch.full((2,), float(r + k))
        dist.all_reduce(t)
        want = n * (n - 1) / 2 + n * k
        if t.tolist() != [want, want]:
            wrong.append(f"all_reduce 8 B call {k}: {t.tolist()} != {want}")
        for root in (0, n - 1):
            b = torch.full((3,), float(r))
            dist.broadcast(b, src=root)
            if b.tolist() != [float(root)] * 3:
                wrong.append(f"broadcast from {root} call {k}: {b.tolist()}")
        dist.barrier()
    # Small integers, so that every partial sum is exact in float32.
    pattern = torch.arange(300_000) % 1000
    big = (pattern + r).float()
    dist.all_reduce(big)
    want = (pattern * n + n * (n - 1) // 2).float()
    if not torch.equal(big, want):
        wrong.append("all_reduce of 1.2 MB differs from the closed form")
    return {"seconds": time.monotonic() - start, "wrong": wrong,
            "fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task"))}
