"""Ranks pass different element counts to one collective: a clear error where a rank can
see it, never a crash and never a write outside the tensor.

    size_mismatch.py OP BASE DELTA TIMEOUT_S

Rank r passes BASE + r * DELTA float32 elements to OP (all_reduce, broadcast from
rank 0, reduce to rank 0, or send_recv: rank 0 sends, rank 1 receives).  Each
tensor is a slice of a larger buffer whose guard regions (GUARD elements before and
after) hold a sentinel; after the call the guards must be intact ("guards_ok").
Label "mismatch" holds what the call raised (or that it returned).  Then every rank
calls destroy_process_group.
"""

import sys

import faultlib as common

OP, BASE, DELTA, TIMEOUT_S = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
GUARD = 4096
SENTINEL = -12345.0


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    r = dist.get_rank()
    dist.all_reduce(torch.ones(3))
    common.record("warm")

    count = BASE + r * DELTA
    storage = torch.full((GUARD + count + GUARD,), SENTINEL)
    t = storage[GUARD:GUARD + count]
    t.fill_(float(r + 1))
    if OP == "all_reduce":
        fn = lambda: dist.all_reduce(t)  # noqa: E731
    elif OP == "broadcast":
        fn = lambda: dist.broadcast(t, src=0)  # noqa: E731
    elif OP == "reduce":
        fn = lambda: dist.reduce(t, dst=0)  # noqa: E731
    elif OP == "send_recv":
        if r == 0:
            fn = lambda: dist.send(t, dst=1)  # noqa: E731
        elif r == 1:
            fn = lambda: dist.recv(t, src=0)  # noqa: E731
        else:
            fn = lambda: None  # noqa: E731
    else:
        raise SystemExit(f"unknown op {OP}")
    common.attempt("mismatch", fn, count=count)
    head = storage[:GUARD]
    tail = storage[GUARD + count:]
    common.record("guards", ok=bool((head == SENTINEL).all() and (tail == SENTINEL).all()),
                  head_bad=int((head != SENTINEL).sum()), tail_bad=int((tail != SENTINEL).sum()))
    # No rank leaves before all have a result: an early exit would fail the others with
    # "connection to rank R closed" instead of what they see of the mismatch itself.
    common.file_barrier("result", range(dist.get_world_size()), timeout=4 * TIMEOUT_S)
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
