"""A rank dies; the others record what their pending and later operations raise.

    dead_peer.py MODE VICTIM TIMEOUT_S WHEN OP COUNT

MODE   how the victim dies: sigkill (SIGKILL to itself), exit (os._exit(7)),
       exception (an uncaught RuntimeError: the interpreter exits with status 1
       without destroying the group), stop (SIGSTOP to itself: it never returns;
       the launcher SIGCONTs and kills it at the end).
WHEN   pending: the survivors' operation is already pending when the victim dies;
       idle: the survivors wait for the death (the victim's pid is gone) and only
       then issue the operation.
OP     all_reduce | broadcast (root 0) | gather (root 0) | send_recv (rank 0 sends to the victim; any
       other survivor waits on a recv from the victim) | sparse_all_reduce (async_op=
       True; one op in the background: its nonzero counts, then its indices and values.
       pending: the victim too starts it and dies as soon as its call returns, its
       messages in flight; idle: the victim dies first).
COUNT  float32 elements in the operation (sparse_all_reduce: nonzero rows of 64 floats
       on each rank).

Labels recorded by survivors: "pending" (the first operation), then "later_all_reduce"
and "later_broadcast" (issued after the failure; they must fail at once).  Survivors
wait for each other (through files) after "pending", so that none exits while another
still waits on it.
"""

import os
import signal
import sys
import time

import faultlib as common

MODE, VICTIM, TIMEOUT_S, WHEN, OP, COUNT = (sys.argv[1], int(sys.argv[2]), float(sys.argv[3]),
                                            sys.argv[4], sys.argv[5], int(sys.argv[6]))
DEATH_DELAY_S = 1.0  # how long survivors sit in their pending operation before the death


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        # ProcessLookupError: the process went between the open and the read.
        return False


def sparse_all_reduce(torch, dist, r, n):
    """Starts a sparse all_reduce of COUNT distinct rows (of 64 floats) per rank, out of
    n * COUNT, and returns its Work."""
    rows = torch.arange(COUNT, dtype=torch.int64) * n + r
    sp = torch.sparse_coo_tensor(rows.unsqueeze(0), torch.ones(COUNT, 64), (n * COUNT, 64)).coalesce()
    return dist.all_reduce(sp, async_op=True)


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.ones(COUNT)
    dist.all_reduce(t)  # every rank is connected and in step
    assert torch.equal(t, torch.full((COUNT,), float(n))), t[:4]
    pids = [None] * n
    dist.all_gather_object(pids, os.getpid())
    common.record("warm")

    if r == VICTIM:
        if OP == "sparse_all_reduce" and WHEN == "pending":
            sparse_all_reduce(torch, dist, r, n)
        elif WHEN == "pending":
            time.sleep(DEATH_DELAY_S)
        common.record("dying", mode=MODE)
        if MODE == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif MODE == "exit":
            os._exit(7)
        elif MODE == "exception":
            raise RuntimeError("injected failure: this rank raises and exits")
        elif MODE == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(3600)
        raise SystemExit(f"unknown mode {MODE}")

    if WHEN == "idle":
        deadline = time.time() + 30
        while pid_alive(pids[VICTIM]) and time.time() < deadline:
            time.sleep(0.02)
        common.record("saw_death", dead=not pid_alive(pids[VICTIM]))

    x = torch.ones(COUNT)
    if OP == "all_reduce":
        start = lambda: dist.all_reduce(x, async_op=True)  # noqa: E731
    elif OP == "broadcast":
        start = lambda: dist.broadcast(x, src=0, async_op=True)  # noqa: E731
    elif OP == "gather":
        got = [torch.empty(COUNT) for _ in range(n)] if r == 0 else None
        start = lambda: dist.gather(x, got, dst=0, async_op=True)  # noqa: E731
    elif OP == "send_recv":
        start = lambda: dist.isend(x, dst=VICTIM) if r == 0 else dist.irecv(x, src=VICTIM)  # noqa: E731
    elif OP == "sparse_all_reduce":
        start = lambda: sparse_all_reduce(torch, dist, r, n)  # noqa: E731
    else:
        raise SystemExit(f"unknown op {OP}")
    # The call is attempted with its wait: no call should raise, but if one did, the
    # survivor would still report it.
    common.attempt("pending", lambda: start().wait())
    # Stay alive until every survivor has its own result: a survivor that exits early
    # would make the ones waiting on it fail with "connection to rank <survivor>
    # closed" (a cascade), which would hide what they see of the victim's death.
    common.file_barrier("pending", [q for q in range(n) if q != VICTIM], timeout=4 * TIMEOUT_S)

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    get_error = getattr(backend, "get_error", None)
    common.record("get_error", available=get_error is not None,
                  value=str(get_error()) if get_error is not None else None)

    y = torch.ones(COUNT)
    common.attempt("later_all_reduce", lambda: dist.all_reduce(y))
    common.attempt("later_broadcast", lambda: dist.broadcast(y, src=0))
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
