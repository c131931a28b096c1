"""Case bodies that exercise the harness itself (hangs, crashes, errors, environment)."""

import os
import sys

import torch
import torch.distributed as dist

import refs


def only_rank0_allreduce():
    """Deliberately hangs: rank 0 waits in a collective nobody else joins."""
    if dist.get_rank() == 0:
        t = torch.ones(4)
        dist.all_reduce(t)
    return dist.get_rank()


def rank1_exits(code):
    if dist.get_rank() == 1:
        print("rank 1 about to exit on purpose", flush=True)
        os._exit(code)
    return dist.get_rank()


def rank1_raises(marker):
    if dist.get_rank() == 1:
        raise ValueError(f"boom {marker}")
    return dist.get_rank()


def environment(seed, dtype, count):
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "OMP_NUM_THREADS", "RINGX_TEST_BACKEND")
    t = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(t)
    return {
        "env": {k: os.environ.get(k) for k in keys},
        "threads": torch.get_num_threads(),
        "rank": dist.get_rank(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sum_of_ranks": int(t.item()),
        "ringx_imported": "ringx" in sys.modules,
        "input": refs.make_input(seed, dist.get_rank(), dtype, count),
    }
