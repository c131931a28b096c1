"""Timeouts: the group timeout, a subgroup's own timeout, and Work.wait(timeout).

    timeouts.py SCENARIO TIMEOUT_S

group     rank 1 (the "late" rank) skips an all_reduce that every other rank issues;
          the others must raise "Timed out" after about TIMEOUT_S (label "skipped"),
          naming rank 1 or the neighbour they wait on; a later all_reduce fails at once
          ("later").  Rank 1 records nothing but its exit.
subgroup  the world group has a long timeout (10 x TIMEOUT_S); new_group(ranks=[0, 1],
          timeout=TIMEOUT_S): rank 1 skips a subgroup all_reduce; rank 0's raises after
          the subgroup's timeout ("sub_skipped"); the world group still works afterwards
          ("world_after": a world all_reduce every rank issues).
wait      rank 0 waits on an async all_reduce with Work.wait(timeout=TIMEOUT_S/4) while
          rank 1 joins only after TIMEOUT_S/2: the wait raises "Timed out ... in
          Work.wait(timeout)" ("short_wait"); a second wait() without a timeout then
          returns the right answer ("second_wait"), and the group still works ("after").
"""

import sys
import time

import faultlib as common

SCENARIO, TIMEOUT_S = sys.argv[1], float(sys.argv[2])


def body():
    import datetime

    import torch

    dist = common.setup(TIMEOUT_S if SCENARIO != "subgroup" else 10 * TIMEOUT_S)
    r, n = dist.get_rank(), dist.get_world_size()
    x = torch.ones(5)
    dist.all_reduce(x)
    common.record("warm")

    if SCENARIO == "group":
        if r != 1:
            common.attempt("skipped", lambda: dist.all_reduce(torch.ones(5)))
            common.attempt("later", lambda: dist.all_reduce(torch.ones(5)))
        else:
            time.sleep(TIMEOUT_S * 1.5)
        common.finish(dist)
    elif SCENARIO == "subgroup":
        sub = dist.new_group(ranks=[0, 1], timeout=datetime.timedelta(seconds=TIMEOUT_S))
        if r == 0:
            common.attempt("sub_skipped", lambda: dist.all_reduce(torch.ones(5), group=sub))
        elif r == 1:
            time.sleep(TIMEOUT_S * 1.5)
        y = torch.ones(3)

        def world_after():
            dist.all_reduce(y)
            assert torch.equal(y, torch.full((3,), float(n))), y

        common.attempt("world_after", world_after)
        common.finish(dist)
    elif SCENARIO == "wait":
        y = torch.full((7,), float(r + 1))
        if r == 1:
            time.sleep(TIMEOUT_S / 2)
        work = dist.all_reduce(y, async_op=True)
        if r == 0:
            common.attempt("short_wait", lambda: work.wait(timeout=datetime.timedelta(seconds=TIMEOUT_S / 4)))

            def second_wait():
                work.wait()
                want = float(n * (n + 1) // 2)
                assert torch.equal(y, torch.full((7,), want)), y

            common.attempt("second_wait", second_wait)
        else:
            work.wait()

        def after():
            z = torch.ones(2)
            dist.all_reduce(z)
            assert torch.equal(z, torch.full((2,), float(n))), z

        common.attempt("after", after)
        common.finish(dist)
    else:
        raise SystemExit(f"unknown scenario {SCENARIO}")


if __name__ == "__main__":
    common.main(body)
