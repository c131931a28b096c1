"""One rank of benchmarks/collectives.py (started by it; not meant to be run by hand).

Every rank runs the same schedule: for each collective, for each size, for each
backend variant (ringx, then gloo as torchrun launches it, then gloo over TCP with
the shared-memory path off where this torch's gloo has one), on the SAME buffers:

    warm-up  ->  agree on the iteration count  ->  batches of timed iterations
    (each batch: fill the inputs, one small untimed collective so ranks start
    together, then one timed iteration per rotating buffer back to back, then
    every output of the batch is checked)  ->  gather the per-iteration times
    over the gloo default group (all_reduce MAX, after the timed loop)

Rank 0 prints each size's row as soon as all variants have run it and appends a
JSON record per (collective, size, variant) to the file the launcher named.

Data (exact in every dtype we offer: all values are small integers): P[j] = j % 7,
t the iteration number, c(r, t) = (r + t) % 5 + 1, S(t) = sum over ranks of c.

    all_reduce      in-place; rank r holds c(r,t) + P;      expect S(t) + n*P
    broadcast       root t % n holds c(root,t) + P, others -1; expect c(root,t) + P
    all_gather      rank r sends c(r,t) + P;                 expect segment k = c(k,t) + P
    reduce_scatter  rank r's row k is c(r,t) + k + P;        expect S(t) + n*r + n*P
    all_to_all      rank r's row k is g(r,k,t) + P, g(r,k,t) = (r*n + k + t) % 11 + 1;
                                                             expect row k = g(k,r,t) + P

A check subtracts the expected per-segment constant in place and compares with a
per-size base (n*P or P), so a stale buffer, a wrong sum and a misplaced segment all
show, and the check costs two passes over the output (untimed).
"""

from __future__ import annotations

import datetime
import gc
import json
import math
import os
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

import _collectives_report as report

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
    "int8": torch.int8, "uint8": torch.uint8,
}
REDUCING = {"all_reduce", "reduce_scatter_tensor"}
SEGMENTED = {"all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"}


def _set_pdeathsig():
    """Die with the launcher, whatever killed it (Linux prctl; elsewhere a no-op)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _rss_mib() -> float:
    """This rank's resident memory now (MiB), recorded with each point."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError):
        return -1.0


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 1 << 62


def _llc_bytes() -> int:
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in os.listdir(base):
            try:
                with open(os.path.join(base, d, "size")) as f:
                    s = f.read().strip()
                mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
                best = max(best, int(s.rstrip("KMG")) * mult)
            except (OSError, ValueError):
                pass
    except OSError:
        pass
    return best or (32 << 20)


# ----------------------------------------------------------------------- bound


def measure_rates(dtype, nbytes, reps):
    """One-core memcpy and a+b rates in bytes/s on buffers of `nbytes` (best of reps).

    memcpy: bytes copied per second (dst.copy_(src)); add: bytes of output per second
    (torch.add(a, b, out=c)). Both with torch's 1 intra-op thread.
    """
    el = torch.tensor([], dtype=dtype).element_size()
    n = max(1, nbytes // el)
    a = torch.ones(n, dtype=dtype)
    b = torch.ones(n, dtype=dtype)
    c = torch.zeros(n, dtype=dtype)  # pages touched before timing
    cp, add = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        c.copy_(a)
        t1 = time.perf_counter()
        torch.add(a, b, out=c)
        t2 = time.perf_counter()
        cp.append(t1 - t0)
        add.append(t2 - t1)
    del a, b, c
    return n * el / min(cp), n * el / min(add)


def measure_bound(args, n, rank):
    """Solo rates (rank 0 alone, the others parked in a gloo barrier) and concurrent
    rates (every rank at once, the slowest rank's rate)."""
    nbytes = args.bound_mib << 20
    dtype = DTYPES[args.dtype]
    solo = torch.zeros(2, dtype=torch.float64)
    if rank == 0:
        solo[:] = torch.tensor(measure_rates(dtype, nbytes, args.bound_reps))
    dist.broadcast(solo, src=0)
    dist.barrier()
    conc = torch.tensor(measure_rates(dtype, nbytes, args.bound_reps), dtype=torch.float64)
    dist.all_reduce(conc, op=dist.ReduceOp.MIN)
    return {
        "buffer_bytes": nbytes, "dtype": args.dtype, "reps": args.bound_reps,
        "memcpy_Bps": float(solo[0]), "add_Bps": float(solo[1]),
        "memcpy_concurrent_Bps": float(conc[0]), "add_concurrent_Bps": float(conc[1]),
    }


# ------------------------------------------------------------------ collectives


class Case:
    """Buffers, fill and check for one (collective, size) on this rank."""

    def __init__(self, coll, count, dtype, n, rank, nbuf, root=0):
        self.coll, self.n, self.rank, self.dtype = coll, n, rank, dtype
        self.root_arg = root  # broadcast root; -1: t % n, rotating
        seg = count // n if coll in SEGMENTED else count
        self.seg = seg
        rep = (seg + 6) // 7
        self.P = torch.arange(7, dtype=dtype).repeat(rep)[:seg].contiguous()
        in_count = {"all_gather_into_tensor": seg, "reduce_scatter_tensor": n * seg,
                    "all_to_all_single": n * seg}.get(coll, seg)
        out_count = {"all_gather_into_tensor": n * seg, "reduce_scatter_tensor": seg,
                     "all_to_all_single": n * seg}.get(coll, 0)
        self.ins = [torch.zeros(in_count, dtype=dtype) for _ in range(nbuf)]
        self.outs = [torch.zeros(out_count, dtype=dtype) for _ in range(nbuf)] if out_count else None
        if coll in ("all_reduce", "reduce_scatter_tensor"):
            self.base = self.P * n  # expected minus the constant
            self.nseg = 1
        elif coll == "broadcast":
            self.base = self.P
            self.nseg = 1
        else:  # all_gather, all_to_all: every output segment is a constant + P
            self.base = self.P.expand(n, seg)
            self.nseg = n
        self.bytes_in = in_count * self.P.element_size()

    def root(self, t):
        return t % self.n if self.root_arg < 0 else self.root_arg % self.n

    def c(self, r, t):
        return (r + t) % 5 + 1

    def g(self, r, k, t):
        return (r * self.n + k + t) % 11 + 1

    def fill(self, i, t):
        n, r, inp = self.n, self.rank, self.ins[i]
        if self.coll == "all_reduce" or self.coll == "all_gather_into_tensor":
            torch.add(self.P, self.c(r, t), out=inp)
        elif self.coll == "broadcast":
            if r == self.root(t):
                torch.add(self.P, self.c(r, t), out=inp)
            else:
                inp.fill_(-1 if self.dtype != torch.uint8 else 255)
        else:
            rows = inp.view(n, self.seg)
            rows.copy_(self.P.expand(n, self.seg))
            if self.coll == "reduce_scatter_tensor":
                add = [self.c(r, t) + k for k in range(n)]
            else:
                add = [self.g(r, k, t) for k in range(n)]
            rows.add_(torch.tensor(add, dtype=self.dtype).view(n, 1))

    def expected_consts(self, t):
        n, r = self.n, self.rank
        if self.coll == "all_reduce":
            return [sum(self.c(k, t) for k in range(n))]
        if self.coll == "broadcast":
            return [self.c(self.root(t), t)]
        if self.coll == "reduce_scatter_tensor":
            return [sum(self.c(k, t) for k in range(n)) + n * r]
        if self.coll == "all_gather_into_tensor":
            return [self.c(k, t) for k in range(n)]
        return [self.g(k, r, t) for k in range(n)]

    def result(self, i):
        return self.outs[i] if self.outs is not None else self.ins[i]

    def check(self, i, t):
        """Number of wrong elements in buffer i's result for iteration t (0 = right)."""
        out = self.result(i)
        k = self.expected_consts(t)
        view = out.view(self.nseg, -1)
        view.sub_(torch.tensor(k, dtype=self.dtype).view(self.nseg, 1))
        if torch.equal(view, self.base.view(self.nseg, -1)):
            return 0
        return int((view != self.base.view(self.nseg, -1)).sum())

    def op(self, group, i, t):
        """The collective on buffer i, through the public torch.distributed API."""
        inp = self.ins[i]
        c = self.coll
        if c == "all_reduce":
            dist.all_reduce(inp, group=group)
        elif c == "broadcast":
            dist.broadcast(inp, group=group, group_src=self.root(t))
        elif c == "all_gather_into_tensor":
            _ALL_GATHER(self.outs[i], inp, group=group)
        elif c == "reduce_scatter_tensor":
            _REDUCE_SCATTER(self.outs[i], inp, group=group)
        else:
            dist.all_to_all_single(self.outs[i], inp, group=group)


# torch 2.13 renamed the *_into_tensor / *_tensor forms to *_single (same backend call).
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Variant:
    """A backend as measured: its group and the LOCAL_WORLD_SIZE its calls see."""

    def __init__(self, label, group, local_world_size):
        self.label, self.group, self.lws = label, group, local_world_size
        self.broken = None  # error text once a call failed; later points are skipped

    def enter(self):
        if self.lws is None:
            os.environ.pop("LOCAL_WORLD_SIZE", None)
        else:
            os.environ["LOCAL_WORLD_SIZE"] = str(self.lws)

    def leave(self, n):
        os.environ["LOCAL_WORLD_SIZE"] = str(n)


def _agree_ok(ok: bool) -> bool:
    f = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(f, op=dist.ReduceOp.MIN)
    return bool(f.item())


def probe(var, coll, dtype, n, rank, root):
    """'ok', 'unsupported' or 'error: ...' for one collective on one variant (all agree)."""
    status = "ok"
    try:
        var.enter()
        case = Case(coll, n * 7, dtype, n, rank, 1, root)
        case.fill(0, 0)
        case.op(var.group, 0, 0)
    except Exception as e:  # noqa: BLE001 - reported as data
        msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        status = "unsupported" if ("not support" in msg or "NotImplemented" in msg) else "error: " + msg
    finally:
        var.leave(n)
    flag = torch.tensor([0 if status == "ok" else 1 if status == "unsupported" else 2], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    agreed = int(flag.item())
    if agreed == 0:
        return "ok"
    if agreed == 1:
        return "unsupported"
    return status if status.startswith("error") else "error: failed on another rank"


def run_point(args, var, case, nbuf, size, tcount, n):
    """Warm-up, timed batches, checks; returns the record for this (coll, size, variant)."""
    sync = torch.zeros(1, dtype=torch.float32)
    wrong_iters = wrong_elems = 0
    t_counter = tcount[0]

    def batch(iters):
        nonlocal wrong_iters, wrong_elems, t_counter
        times = []
        done = 0
        while done < iters:
            b = min(nbuf, iters - done)
            ts = list(range(t_counter, t_counter + b))
            for i in range(b):
                case.fill(i, ts[i])
            dist.all_reduce(sync, group=var.group)  # untimed: ranks start together
            stamps = [time.perf_counter_ns()]
            for i in range(b):
                case.op(var.group, i, ts[i])
                stamps.append(time.perf_counter_ns())
            for i in range(b):
                w = case.check(i, ts[i])
                if w:
                    wrong_iters += 1
                    wrong_elems += w
            times += [(stamps[i + 1] - stamps[i]) / 1e3 for i in range(b)]
            t_counter += b
            done += b
        return times

    var.enter()
    gc.disable()
    try:
        # Every rotating buffer is used at least once before timing, so per-buffer
        # first-use costs (page faults, memory registration caches) stay out of it.
        warm = max(nbuf, min(args.warmup, int(args.warmup_bytes // max(size, 1))))
        wt = batch(warm)
        est = torch.tensor([sorted(wt[1:] or wt)[len(wt[1:] or wt) // 2]], dtype=torch.float64)
        dist.all_reduce(est, op=dist.ReduceOp.MAX)  # side channel: gloo default group
        iters = int(min(args.max_iters, max(args.min_iters, round(args.budget * 1e6 / max(est.item(), 1e-3)))))
        warm_wrong = wrong_iters  # warm-up results are checked too, and kept apart
        wrong_iters = wrong_elems = 0
        times = batch(iters)
    finally:
        gc.enable()
        var.leave(n)
        tcount[0] = t_counter
    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)  # per-iteration time of the slowest rank
    wr = torch.tensor([wrong_iters, wrong_elems, warm_wrong], dtype=torch.int64)
    dist.all_reduce(wr, op=dist.ReduceOp.SUM)
    q = torch.quantile(tt, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    return {"status": "ok", "iters": iters, "warmup": warm, "buffers": nbuf,
            "time_us": q[1], "p10_us": q[0], "p90_us": q[2],
            "min_us": float(tt.min()), "max_us": float(tt.max()),
            "wrong": int(wr[0]), "wrong_elems": int(wr[1]), "warmup_wrong": int(wr[2])}


def main(args):
    _set_pdeathsig()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.pin == "cores":
        # Before the process groups start their threads: they inherit it.
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    timeout = datetime.timedelta(seconds=args.pg_timeout)
    dist.init_process_group("gloo", timeout=timeout)
    out = open(args._out, "a") if rank == 0 else None

    def emit(rec):
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    def say(line):
        if rank == 0:
            print(line, flush=True)

    variants = []
    ringx_err = None
    if "ringx" in args.backends:
        try:
            import ringx  # noqa: F401  (registers the backend)

            variants.append(Variant("ringx", dist.new_group(backend="ringx", timeout=timeout), n))
        except Exception as e:  # noqa: BLE001
            ringx_err = f"{type(e).__name__}: {e}".splitlines()[0]
        ok = _agree_ok(ringx_err is None)
        if not ok:
            variants = []
            say(f"# ringx unavailable: {ringx_err or 'failed on another rank'}")
            emit({"kind": "error", "world": n, "backend": "ringx", "error": ringx_err or "another rank"})
    if "gloo" in args.backends:
        world = dist.group.WORLD
        modes = args._gloo_modes
        if "torchrun" in modes:
            variants.append(Variant(report.GLOO_LABELS["torchrun"], world, n))
        if "tcp" in modes:
            variants.append(Variant(report.GLOO_LABELS["tcp"], world, None))

    bound = measure_bound(args, n, rank) if not args.no_bound else None
    if bound:
        emit({"kind": "bound", "world": n, **bound})
        for line in report.bound_lines(bound, n):
            say(line)

    dtype = DTYPES[args.dtype]
    el = torch.tensor([], dtype=dtype).element_size()
    llc = _llc_bytes()
    tcount = [0]
    labels = [v.label for v in variants]
    for coll in args.colls:
        status = {v.label: probe(v, coll, dtype, n, rank, args.root) for v in variants}
        say("")
        for line in report.table_header(coll, n, args.dtype, labels, status):
            say(line)
        for v in variants:
            v.broken = None
        for size in args.sizes:
            count = size // el
            if coll in SEGMENTED:
                count = count // n * n
            if count == 0:
                continue
            nbytes = count * el
            per_rank = {"all_to_all_single": 2 * nbytes, "all_gather_into_tensor": nbytes + nbytes // n,
                        "reduce_scatter_tensor": nbytes + nbytes // n}.get(coll, nbytes)
            nbuf = max(1, min(args.max_buffers, math.ceil(args.rotate_mult * llc / max(per_rank, 1))))
            row = {}
            case = None
            need = (nbuf + 2) * per_rank  # rotating buffers, the pattern and the check base
            if need * n < 0.6 * _mem_available():
                try:
                    case = Case(coll, count, dtype, n, rank, nbuf, args.root)
                except RuntimeError:  # allocation failed: skip this size for everyone
                    pass
            if not _agree_ok(case is not None):
                say(f"  {nbytes:>10} {count:>10}  skipped: needs ~{need >> 20} MiB per rank, "
                    f"more than this machine has free")
                emit({"kind": "point", "world": n, "coll": coll, "size": nbytes, "count": count,
                      "dtype": args.dtype, "backend": "*", "status": "skipped (memory)"})
                case = None
                continue
            for v in variants:
                base = {"kind": "point", "world": n, "coll": coll, "backend": v.label,
                        "dtype": args.dtype, "size": nbytes, "count": count,
                        "redop": "sum" if coll in REDUCING else "none"}
                if status[v.label] != "ok" or v.broken:
                    row[v.label] = {"status": status[v.label] if status[v.label] != "ok"
                                    else "skipped (earlier error)"}
                    emit({**base, **row[v.label]})
                    continue
                try:
                    rec = run_point(args, v, case, nbuf, nbytes, tcount, n)
                    err = None
                except Exception as e:  # noqa: BLE001
                    err = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                    traceback.print_exc()
                    rec = {"status": "error: " + err}
                if not _agree_ok(err is None):
                    rec = {"status": rec["status"] if err else "error: failed on another rank"}
                    v.broken = rec["status"]
                if rec["status"] == "ok":
                    algbw = nbytes / rec["time_us"] / 1e3  # GB/s
                    rec["algbw_GBps"] = algbw
                    rec["busbw_GBps"] = algbw * report.bus_factor(coll, n)
                rec["rss_MiB"] = _rss_mib()
                row[v.label] = rec
                emit({**base, **rec})
            del case
            say(report.table_row(coll, n, nbytes, count, args.dtype, labels, row, bound))
    say("")
    if out:
        out.write(json.dumps({"kind": "done", "world": n}) + "\n")
        out.close()
    sys.stdout.flush()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    os._exit(0)


# ------------------------------------------------------------------- self-test


def _emulate(coll, n, count, dtype, t, fault, root=-1):
    """Every rank's check() result after an emulated call (torch arithmetic on all
    inputs), optionally with a fault: 'elem' (one wrong element on rank 1), 'noop'
    (the call did nothing), 'swap' (rank 0 got two segments swapped)."""
    cases = [Case(coll, count, dtype, n, r, 1, root) for r in range(n)]
    for c in cases:
        c.fill(0, t)
    ins = [c.ins[0].to(torch.float64) for c in cases]
    seg = cases[0].seg
    total = sum(ins)
    for r, c in enumerate(cases):
        if coll == "all_reduce":
            res = total
        elif coll == "broadcast":
            res = ins[cases[0].root(t)]
        elif coll == "all_gather_into_tensor":
            res = torch.cat(ins)
        elif coll == "reduce_scatter_tensor":
            res = total[r * seg:(r + 1) * seg]
        else:
            res = torch.cat([ins[k][r * seg:(r + 1) * seg] for k in range(n)])
        res = res.to(dtype).clone()
        if fault == "elem" and r == 1:
            res[-1] += 1
        if fault == "swap" and r == 0:
            res[:2 * seg] = torch.cat([res[seg:2 * seg], res[:seg]])
        if fault != "noop":
            c.result(0).copy_(res)
    return [c.check(0, t) for c in cases]


def self_test() -> int:
    """The checker against emulated right and wrong results; returns the failures."""
    failures = 0
    for name, dt in DTYPES.items():
        for coll in ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
                     "all_to_all_single"):
            for n in (2, 3, 4):
                for t in range(6):
                    cnt = 7 * n * 3
                    faults = ["ok", "elem", "noop"] + (
                        ["swap"] if coll in ("all_gather_into_tensor", "all_to_all_single") else [])
                    root = -1 if t % 2 else 1  # rotating and fixed roots (broadcast)
                    for f in faults:
                        got = _emulate(coll, n, cnt, dt, t, f, root)
                        broot = t % n if root < 0 else root % n
                        if f == "ok":
                            good = all(w == 0 for w in got)
                        elif f == "elem":
                            good = got[1] > 0
                        elif f == "swap":
                            good = got[0] > 0
                        else:  # the root of a broadcast already holds its answer
                            good = all(w > 0 for r, w in enumerate(got)
                                       if not (coll == "broadcast" and r == broot))
                        if not good:
                            failures += 1
                            print(f"self-test: {coll} {name} n={n} t={t} {f}: wrong elems {got}")
    print(f"self-test: checker {'ok' if not failures else 'FAILED'} "
          f"({len(DTYPES)} dtypes x 5 collectives x worlds 2-4, right and faulty results)")
    return failures
