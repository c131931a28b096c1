"""Faults of the single-copy (CMA) path; every rank records what its calls raised.

    cma_faults.py SCENARIO TIMEOUT_S [ARG]

dies_reading COUNT [COLL]
                    every rank but the last issues a CMA all_gather (or COLL:
                    all_reduce, reduce_scatter; all_to_all_from, where the last rank
                    sends every other COUNT elements and gets 1 from each, so it
                    writes tails into them while they read it; all_to_all_to, the
                    reverse) of COUNT float32 elements; the last
                    issues it too, a few milliseconds later, and SIGKILLs itself while
                    the others copy its memory. Survivors record "pending" (must raise
                    naming the victim, "closed") and wait for each other before they
                    exit.
dies_before         the last rank dies without issuing the all_gather the others wait in.
refused MODE        every rank makes itself unreadable by its siblings (not dumpable,
                    CAP_SYS_PTRACE dropped) before init_process_group with RINGX_CMA=MODE;
                    records "init", and with a group, "fallback": an all_gather and an
                    all_to_all with split sizes forced to cma, checked against the
                    expected values (the slot and UCX algorithms must serve them).
"""

import ctypes
import os
import signal
import sys
import time

import faultlib as common

SCENARIO, TIMEOUT_S = sys.argv[1], float(sys.argv[2])
ARG = sys.argv[3] if len(sys.argv) > 3 else ""
COLL = sys.argv[4] if len(sys.argv) > 4 else "all_gather"

PR_SET_DUMPABLE = 4
CAP_SYS_PTRACE = 19


def make_unreadable():
    """Siblings of the same uid may read a process's memory unless it is not dumpable and
    they lack CAP_SYS_PTRACE; as root, drop that capability too."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for field in ("effective", "permitted"):
        setattr(data[0], field, getattr(data[0], field) & ~(1 << CAP_SYS_PTRACE))
    if libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def dies(before):
    import torch

    dist = common.setup(TIMEOUT_S)
    r, n = dist.get_rank(), dist.get_world_size()
    victim = n - 1
    count = int(ARG) if ARG else 1000

    def lopsided(big_from_victim):
        def sends(src, dst):
            big = src == victim if big_from_victim else dst == victim
            return count if big and src != dst else 1
        ins = [sends(r, q) for q in range(n)]
        outs = [sends(q, r) for q in range(n)]
        inp, got = torch.ones(sum(ins)), torch.zeros(sum(outs))
        return lambda: dist.all_to_all_single(got, inp, outs, ins, async_op=True)

    # Only the chosen call's buffers are allocated: each is up to hundreds of MiB.
    if COLL.startswith("all_to_all_"):
        call = lopsided({"all_to_all_from": True, "all_to_all_to": False}[COLL])
    else:
        x = torch.full((count,), float(r))
        out = torch.zeros(n * count)
        call = {
            "all_gather": lambda: dist.all_gather_into_tensor(out, x, async_op=True),
            "all_reduce": lambda: dist.all_reduce(out, async_op=True),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(x, out, async_op=True),
        }[COLL]
    # Hundreds of MiB take seconds to fault in on a loaded machine, longer than the
    # short timeout these scenarios run with: every rank has its buffers first.
    common.file_barrier("allocated", range(n), timeout=60)
    call().wait()  # everyone connected, the path warm
    common.record("warm")
    if r == victim:
        time.sleep(0.5)
        if not before:
            call()
            time.sleep(0.002)
        common.record("dying")
        os.kill(os.getpid(), signal.SIGKILL)
    work = call()
    common.attempt("pending", work.wait)
    common.file_barrier("pending", range(n - 1), timeout=4 * TIMEOUT_S)
    common.finish(dist, destroy=False)


def refused():
    import torch

    make_unreadable()
    os.environ["RINGX_CMA"] = ARG
    dist = None

    def init():
        nonlocal dist
        dist = common.setup(TIMEOUT_S)

    if common.attempt("init", init) is not None:
        common.finish()
        return
    r, n = dist.get_rank(), dist.get_world_size()

    def fallback():
        x = torch.arange(1000, dtype=torch.float32) + 1000 * r
        out = torch.empty(n * 1000)
        dist.all_gather_into_tensor(out, x)
        assert torch.equal(out, torch.arange(n * 1000, dtype=torch.float32)), out
        sends = [r + q + 1 for q in range(n)]
        recvs = [q + r + 1 for q in range(n)]
        inp = torch.cat([torch.full((sends[q],), float(10 * r + q)) for q in range(n)])
        got = torch.empty(sum(recvs))
        dist.all_to_all_single(got, inp, recvs, sends)
        want = torch.cat([torch.full((recvs[q],), float(10 * q + r)) for q in range(n)])
        assert torch.equal(got, want), got

    common.attempt("fallback", fallback)
    common.finish(dist)


if __name__ == "__main__":
    if SCENARIO in ("dies_reading", "dies_before"):
        common.main(lambda: dies(SCENARIO == "dies_before"))
    elif SCENARIO == "refused":
        common.main(refused)
    else:
        raise SystemExit(f"unknown scenario {SCENARIO}")
