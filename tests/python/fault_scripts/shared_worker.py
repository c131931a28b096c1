"""Several ringx groups over the same processes at once, all on each process's one
UCX worker.

    shared_worker.py HOW TIMEOUT_S [CYCLES WARMUP]

HOW    groups (3 ranks): the world, new_group([0, 1, 2]) and new_group([0, 1]) run
             asynchronous all_reduces interleaved, each with values of its own
             ("interleaved"); the three-rank subgroup is destroyed and the other two
             still work ("after_destroy"); a new group over [1, 2] then works
             ("new_after_destroy").
       kill (3 ranks): the world, A = new_group([0, 1]) and B = new_group([1, 2]);
             rank 2 exits; on ranks 0 and 1 an all_reduce on the world fails
             ("world"), rank 1's on B fails ("b"), and an all_reduce on A still works
             on both ("a", after the failures).
       cycles (2 ranks): CYCLES x (new_group -> all_reduce -> destroy it) beside the
             world group; after WARMUP cycles the thread and fd counts are the
             baseline, and they must not move ("baseline", "final").
"""

import os
import sys
import time

import faultlib as common

HOW, TIMEOUT_S = sys.argv[1], float(sys.argv[2])


def check(x, want, what):
    import torch

    if not torch.equal(x, torch.full_like(x, float(want))):
        raise AssertionError(f"{what}: got {x[:4].tolist()}, want {want}")


def groups(dist, r):
    import torch

    trio = dist.new_group([0, 1, 2])
    pair = dist.new_group([0, 1])

    def interleaved():
        for round_ in range(20):
            works, checks = [], []
            for g, ranks, scale in ((None, [0, 1, 2], 1), (trio, [0, 1, 2], 100), (pair, [0, 1], 10000)):
                if r not in ranks:
                    continue
                x = torch.full((round_ * 37 + 1,), float(scale * (r + 1)))
                works.append(dist.all_reduce(x, group=g, async_op=True))
                checks.append((x, scale * sum(p + 1 for p in ranks), f"round {round_} scale {scale}"))
            for w in works:
                w.wait()
            for x, want, what in checks:
                check(x, want, what)

    common.attempt("interleaved", interleaved)
    dist.destroy_process_group(trio)

    def after_destroy():
        x = torch.full((5,), float(r + 1))
        dist.all_reduce(x)
        check(x, 6, "world")
        if r < 2:
            y = torch.full((7,), float(r + 1))
            dist.all_reduce(y, group=pair)
            check(y, 3, "pair")

    common.attempt("after_destroy", after_destroy)
    late = dist.new_group([1, 2])

    def new_after_destroy():
        if r > 0:
            z = torch.full((9,), float(r))
            dist.all_reduce(z, group=late)
            check(z, 3, "late")

    common.attempt("new_after_destroy", new_after_destroy)
    # Rank 0 is no member of `late` but serves the store its creation uses: it must
    # not destroy the world (and stop the store) before ranks 1 and 2 are past it.
    common.file_barrier("late", range(3), timeout=2 * TIMEOUT_S)
    common.finish(dist)


def kill(dist, r):
    import torch

    a = dist.new_group([0, 1])
    b = dist.new_group([1, 2])
    dist.barrier()
    if r == 2:
        common.record("exiting")
        os._exit(0)
    time.sleep(0.5)
    common.attempt("world", lambda: dist.all_reduce(torch.ones(4)))
    if r == 1:
        common.attempt("b", lambda: dist.all_reduce(torch.ones(4), group=b))

    def on_a():
        x = torch.full((6,), float(r + 1))
        dist.all_reduce(x, group=a)
        check(x, 3, "a")

    common.attempt("a", on_a)
    common.finish(dist, destroy=False)
    os._exit(0)


def cycles(dist, r, n, warmup):
    import torch

    base, t0 = None, None
    for i in range(n):
        if i == warmup:
            base = common.snapshot()
            common.record("baseline", **base)
            t0 = time.time()
        g = dist.new_group([0, 1])
        x = torch.full((16,), float(r + 1))
        dist.all_reduce(x, group=g)
        check(x, 3, f"cycle {i}")
        dist.destroy_process_group(g)
    common.record("final", seconds=time.time() - t0, cycles=n - warmup, **common.snapshot())
    common.finish(dist)


def body():
    dist = common.setup(TIMEOUT_S)
    r = dist.get_rank()
    if HOW == "groups":
        groups(dist, r)
    elif HOW == "kill":
        kill(dist, r)
    else:
        cycles(dist, r, int(sys.argv[3]), int(sys.argv[4]))


if __name__ == "__main__":
    common.main(body)
