"""The single-copy bound of benchmarks/collectives.py (issue 16): the bytes a
single-copy algorithm must move, moved by process_vm_readv (Linux CMA) between the
same ranks, on the same buffers, with no synchronisation.

Each rank publishes its pid and the addresses of its rotating input buffers; then
every rank, at once, runs its part of the collective's minimal copy schedule (below)
iteration after iteration, the rotating buffer advancing as in the timed loop. The
per-iteration time of the slowest rank (MAX over ranks, per iteration) gives a median
`cma_us`; `cma_GBps` is the bytes one rank reads / cma_us. For the reducing
collectives the reduction is added at the a+b rate measured with every rank at once:
`bound_us = cma_us + reduced bytes / a+b`. N is the point's size, S = N / n:

    all_reduce      rank r reads slice r of each peer (n-1)S, reduces it, then reads the
                    other n-1 reduced slices (n-1)S:      2(n-1)S read, (n-1)S reduced
    reduce_scatter  rank r reads slice r of each peer:    (n-1)S read, (n-1)S reduced
    all_gather      every rank reads every input (its own too): N
    all_to_all(v)   rank r reads row r of every rank's input (its own too): N (its rows)
    broadcast       every non-root reads the root's N:   N
    gather          the root reads every input (its own too): N; the others nothing
    scatter         every rank reads its row of the root's input: S
"""

from __future__ import annotations

import ctypes
import os
import time

import torch
import torch.distributed as dist

_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1).value


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_readv = _libc.process_vm_readv
_readv.restype = ctypes.c_ssize_t
_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                   ctypes.c_ulong, ctypes.c_ulong]


def allow_peers() -> None:
    """Let sibling processes read this one (needed under Yama ptrace_scope=1, as MPI does)."""
    try:
        _libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY), 0, 0, 0)
    except Exception:  # noqa: BLE001 - no Yama: nothing to allow
        pass


class Read:
    """One process_vm_readv of `length` bytes from (pid, remote) into local, prebuilt."""

    def __init__(self, pid, remote, local, length):
        self.pid, self.length = pid, length
        self.liov = _IoVec(local, length)
        self.riov = _IoVec(remote, length)

    def __call__(self):
        got = _readv(self.pid, ctypes.byref(self.liov), 1, ctypes.byref(self.riov), 1, 0)
        if got == self.length:
            return
        if got < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"process_vm_readv from pid {self.pid}: {os.strerror(e)}")
        done = got  # a short read: go on from where it stopped
        while done < self.length:
            li = _IoVec(self.liov.base + done, self.length - done)
            ri = _IoVec(self.riov.base + done, self.length - done)
            got = _readv(self.pid, ctypes.byref(li), 1, ctypes.byref(ri), 1, 0)
            if got <= 0:
                e = ctypes.get_errno()
                raise OSError(e, f"process_vm_readv from pid {self.pid}: {os.strerror(e)}")
            done += got


def reads_for(case, i, peers, scratch):
    """This rank's reads for rotating buffer i: [(Read, bytes)]. `peers[k]` is
    (pid, [address of input buffer j]) of rank k; `scratch` takes the reduced slices."""
    n, r, el, coll, seg = case.n, case.rank, case.el, case.coll, case.seg
    out = []

    def rd(k, src_off, dst_ptr, length):
        if length > 0:
            pid, addrs = peers[k]
            out.append(Read(pid, addrs[i] + src_off, dst_ptr, length))

    S = seg * el
    root = case.root(0) if case.root_arg >= 0 else 0
    inp = case.ins[i].data_ptr()
    if coll == "all_reduce":
        S = (case.in_count // n) * el
        for k in range(n):
            if k != r:
                rd(k, r * S, scratch.data_ptr(), S)
        for k in range(n):
            if k != r:
                rd(k, k * S, inp + k * S, S)
    elif coll == "reduce_scatter_tensor":
        for k in range(n):
            if k != r:
                rd(k, r * S, scratch.data_ptr(), S)
    elif coll in ("all_gather_into_tensor", "gather"):
        if coll == "all_gather_into_tensor" or r == root:
            dst = case.outs[i].data_ptr()
            for k in range(n):
                rd(k, 0, dst + k * S, S)
    elif coll == "all_to_all_single":
        dst = case.outs[i].data_ptr()
        for k in range(n):
            rd(k, r * S, dst + k * S, S)
    elif coll == "all_to_allv":
        dst, off_out = case.outs[i].data_ptr(), 0
        for k in range(n):
            off_in = sum(case.lens[k][:r]) * el
            length = case.lens[k][r] * el
            rd(k, off_in, dst + off_out, length)
            off_out += length
    elif coll == "broadcast":
        if r != root:
            rd(root, 0, inp, case.in_count * el)
    elif coll == "scatter":
        rd(root, r * S, case.outs[i].data_ptr(), S)
    return out


def reduced_bytes(coll, n, nbytes) -> float:
    """Bytes of a+b output the reducing collectives need per rank (0 for the others)."""
    if coll in ("all_reduce", "reduce_scatter_tensor"):
        return (n - 1) * nbytes / n
    return 0.0


def measure(case, nbuf, budget_s, min_reps, max_reps, add_Bps):
    """Median over iterations of the slowest rank's time for this rank's reads; every
    rank calls it at the same point (it uses the gloo default group as a side channel)."""
    n, rank = case.n, case.rank
    me = torch.tensor([os.getpid()] + [case.ins[j].data_ptr() for j in range(nbuf)], dtype=torch.int64)
    allv = [torch.zeros_like(me) for _ in range(n)]
    dist.all_gather(allv, me)
    peers = [(int(v[0]), [int(a) for a in v[1:]]) for v in allv]
    scratch = torch.empty(max(1, case.in_count // n), dtype=case.dtype)
    plans = [reads_for(case, i, peers, scratch) for i in range(nbuf)]
    nbytes = sum(rd.length for rd in plans[0])

    def run(reps):
        ts = []
        for it in range(reps):
            plan = plans[it % nbuf]
            t0 = time.perf_counter_ns()
            for rd in plan:
                rd()
            ts.append((time.perf_counter_ns() - t0) / 1e3)
        return ts

    err = None
    try:
        warm = run(nbuf)
    except OSError as e:
        err, warm = str(e), [1.0]
    ok = torch.tensor([0 if err else 1], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if not ok.item():
        return {"status": "error: " + (err or "process_vm_readv failed on another rank")}
    est = torch.tensor([sorted(warm)[len(warm) // 2]], dtype=torch.float64)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    reps = int(min(max_reps, max(min_reps, round(budget_s * 1e6 / max(est.item(), 1e-3)))))
    dist.barrier()
    tt = torch.tensor(run(reps), dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    mine = torch.tensor([nbytes], dtype=torch.int64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    cma_us = float(tt.median())
    red = reduced_bytes(case.coll, n, case.in_count * case.el)
    bound_us = cma_us + (red / add_Bps * 1e6 if add_Bps else 0.0)
    return {"status": "ok", "reps": reps, "cma_bytes": int(mine.item()), "cma_us": cma_us,
            "cma_p90_us": float(torch.quantile(tt, 0.9)),
            "cma_GBps": int(mine.item()) / cma_us / 1e3 if cma_us > 0 else 0.0,
            "reduced_bytes": red, "bound_us": bound_us}
