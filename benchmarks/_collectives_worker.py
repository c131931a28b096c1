"""One rank of benchmarks/collectives.py (started by it; not meant to be run by hand).

Every rank runs the same schedule: for each collective, for each size, for each
pattern, for each backend variant (ringx, then gloo as torchrun launches it, then
gloo over TCP with the shared-memory path off where this torch's gloo has one; or, in
a world started by mpiexec, MPI), on the SAME buffers:

    warm-up  ->  agree on the iteration count  ->  batches of timed iterations
    (each batch: fill the inputs, one small untimed collective so ranks start
    together, then one timed iteration per rotating buffer, then every output of
    the batch is checked)  ->  gather the per-iteration times over the gloo
    default group (all_reduce MAX, after the timed loop) and the ranks' CPU over
    the timed calls (all_reduce SUM)

Patterns (what the calling thread does between two timed calls):

    back-to-back    nothing: the next call starts when the previous returns
    compute-gap     a CPU loop of small matmuls for --gap-us, then the call
    interleaved     an 8-byte all_reduce on a second group (gloo, or ringx with
                    --inter-backend ringx), then the call

In the last two each call is timed alone (from its start to its return). Every
pattern's record also splits its calls at the last rank's arrival (arrival_phases).
After the patterns of a size, the torch world measures the single-copy bound on the same
buffers (_collectives_cma.py). Rank 0 prints each size's rows as soon as all variants
have run them (with the rows of an MPI world that ran before, read from its records)
and appends a JSON record per (collective, size, pattern, variant) to the file the
launcher named. Buffers, fills and checks: _collectives_cases.py.

With --device cuda the buffers live on cuda:LOCAL_RANK (modulo the GPUs), nccl may
be a variant beside ringx and gloo, each timed call ends when the caller's stream
has finished it, and the single-copy bound is not measured. The default gloo group
still carries the harness's own host-side traffic.
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

import _collectives_cma as cma
import _collectives_report as report
from _collectives_cases import DTYPES, REDUCING, SEGMENTED, Case


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


# ------------------------------------------------------------------ variants


class TorchVariant:
    """A torch.distributed backend as measured: its group and the LOCAL_WORLD_SIZE its calls see."""

    def __init__(self, label, group, local_world_size, device):
        self.label, self.group, self.lws, self.device = label, group, local_world_size, device
        self.broken = None  # error text once a call failed; later points are skipped
        self._sync = torch.zeros(1, dtype=torch.float32, device=device)

    def enter(self):
        if self.lws is None:
            os.environ.pop("LOCAL_WORLD_SIZE", None)
        else:
            os.environ["LOCAL_WORLD_SIZE"] = str(self.lws)

    def leave(self, n):
        os.environ["LOCAL_WORLD_SIZE"] = str(n)

    def sync(self):
        dist.all_reduce(self._sync, group=self.group)

    def call(self, case, i, t):
        case.op(self.group, i, t)
        if self.device.type == "cuda":
            # A CUDA collective returns once enqueued: time it to its completion.
            torch.cuda.current_stream(self.device).synchronize()


class Between:
    """What the calling thread does before each timed call of a pattern."""

    def __init__(self, gap_us, inter_group):
        self.gap_ns = int(gap_us * 1e3)
        self.inter_group = inter_group
        self.a = torch.rand(32, 32)
        self.b = torch.rand(32, 32)
        self.c = torch.empty(32, 32)
        self.tiny = torch.zeros(2, dtype=torch.float32)

    def compute(self):
        end = time.perf_counter_ns() + self.gap_ns
        while time.perf_counter_ns() < end:
            torch.mm(self.a, self.b, out=self.c)

    def interleave(self):
        dist.all_reduce(self.tiny, group=self.inter_group)

    def get(self, pattern):
        return {"back-to-back": None, "compute-gap": self.compute, "interleaved": self.interleave}[pattern]


def _agree_ok(ok: bool) -> bool:
    f = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(f, op=dist.ReduceOp.MIN)
    return bool(f.item())


def probe(var, coll, dtype, n, rank, root):
    """'ok', 'unsupported' or 'error: ...' for one collective on one variant (all agree)."""
    status = "ok"
    try:
        var.enter()
        case = Case(coll, n * 7, dtype, n, rank, 1, root, var.device)
        case.fill(0, 0)
        var.call(case, 0, 0)
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


def run_point(args, var, case, nbuf, size, tcount, n, between):
    """Warm-up, timed batches, checks; returns the record for this (coll, size, pattern, variant)."""
    wrong_iters = wrong_elems = 0
    t_counter = tcount[0]
    ns = time.perf_counter_ns
    cpu_ns = [0]  # this process's CPU (every thread) over the timed calls

    def batch(iters, walls=None, stamps_out=None):
        """Timed calls; `walls` (when given) gets each iteration's whole time, pattern included,
        and `stamps_out` each call's (entry, return) on the host's monotonic clock."""
        nonlocal wrong_iters, wrong_elems, t_counter
        times = []
        done = 0
        while done < iters:
            b = min(nbuf, iters - done)
            ts = list(range(t_counter, t_counter + b))
            for i in range(b):
                case.fill(i, ts[i])
            var.sync()  # untimed: ranks start together
            c0 = time.process_time_ns()
            if between is None:  # back to back: each call starts when the previous returned
                stamps = [ns()]
                for i in range(b):
                    var.call(case, i, ts[i])
                    stamps.append(ns())
                cpu_ns[0] += time.process_time_ns() - c0
                times += [(stamps[i + 1] - stamps[i]) / 1e3 for i in range(b)]
                if walls is not None:
                    walls += times[-b:]
                if stamps_out is not None:
                    stamps_out += [(stamps[i], stamps[i + 1]) for i in range(b)]
            else:
                between_ns = 0  # the calling thread's own CPU in the pattern's work, not the backend's
                for i in range(b):
                    w0 = ns()
                    b0 = time.thread_time_ns()
                    between()
                    between_ns += time.thread_time_ns() - b0
                    t0 = ns()
                    var.call(case, i, ts[i])
                    t1 = ns()
                    times.append((t1 - t0) / 1e3)
                    if walls is not None:
                        walls.append((t1 - w0) / 1e3)
                    if stamps_out is not None:
                        stamps_out.append((t0, t1))
                cpu_ns[0] += time.process_time_ns() - c0 - between_ns
            for i in range(b):
                w = case.check(i, ts[i])
                if w:
                    wrong_iters += 1
                    wrong_elems += w
            t_counter += b
            done += b
        return times

    var.enter()
    gc.disable()
    try:
        # Every rotating buffer is used at least once before timing, so per-buffer
        # first-use costs (page faults, memory registration caches) stay out of it.
        warm = max(nbuf, min(args.warmup, int(args.warmup_bytes // max(size, 1))))
        walls = []
        batch(warm, walls)  # the budget counts whole iterations: a pattern's gap is spent too
        ws = sorted(walls[1:] or walls)
        est = torch.tensor([ws[len(ws) // 2]], dtype=torch.float64)
        dist.all_reduce(est, op=dist.ReduceOp.MAX)  # side channel: gloo default group
        iters = int(min(args.max_iters, max(args.min_iters, round(args.budget * 1e6 / max(est.item(), 1e-3)))))
        warm_wrong = wrong_iters  # warm-up results are checked too, and kept apart
        wrong_iters = wrong_elems = 0
        cpu_ns[0] = 0
        stamps = []
        times = batch(iters, stamps_out=stamps)
    finally:
        gc.enable()
        var.leave(n)
        tcount[0] = t_counter
    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)  # per-iteration time of the slowest rank
    wr = torch.tensor([wrong_iters, wrong_elems, warm_wrong, cpu_ns[0]], dtype=torch.int64)
    dist.all_reduce(wr, op=dist.ReduceOp.SUM)
    q = torch.quantile(tt, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    return {"status": "ok", "iters": iters, "warmup": warm, "buffers": nbuf,
            "time_us": q[1], "p10_us": q[0], "p50_us": q[1], "p90_us": q[2],
            "min_us": float(tt.min()), "max_us": float(tt.max()),
            "wrong": int(wr[0]), "wrong_elems": int(wr[1]), "warmup_wrong": int(wr[2]),
            "cpu_us": cpu_per_call_us(int(wr[3]), iters),
            **arrival_phases(stamps)}


def cpu_per_call_us(cpu_ns_all_ranks: int, calls: int) -> float:
    """CPU per call, us: user + system time of every thread of every rank over the timed
    calls (CLOCK_PROCESS_CPUTIME_ID: the sum /proc/PID/stat's utime + stime counts in
    clock ticks, read at nanosecond resolution), summed over the ranks, over the calls.
    Waiting that spins shows here while the time column may not."""
    return cpu_ns_all_ranks / 1e3 / max(calls, 1)


def arrival_phases(stamps):
    """Splits each timed call at the moment the last rank entered it, on the host's
    monotonic clock (shared by the ranks of one host): `skew` is how long the first rank
    waited for the last to arrive (the pattern's doing, whatever the backend), `after_last`
    how long the slowest rank then took to return (the backend's doing). p50s, in us."""
    entries = torch.tensor([e for e, _ in stamps], dtype=torch.int64)
    returns = torch.tensor([r for _, r in stamps], dtype=torch.int64)
    last, first = entries.clone(), entries.clone()
    dist.all_reduce(last, op=dist.ReduceOp.MAX)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)
    after = returns - last
    dist.all_reduce(after, op=dist.ReduceOp.MAX)
    return {"skew_p50_us": float((last - first).double().median()) / 1e3,
            "after_last_p50_us": float(after.double().median()) / 1e3}


def _init(args):
    """(rank, n) of this process, in a torch world or one that mpiexec started."""
    if args._mpi:
        from mpi4py import MPI  # MPI_Init, before anything starts threads

        rank, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
                           "LOCAL_WORLD_SIZE": str(n)})
    else:
        rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, n


def _load_peers(paths):
    """{(coll, size, pattern): {label: record}} of the MPI worlds that ran before (rank 0 prints them)."""
    peers, labels = {}, []
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    if r.get("kind") == "point" and r.get("backend") not in (None, "*"):
                        if r["backend"] not in labels:
                            labels.append(r["backend"])
                        peers.setdefault((r["coll"], r["size"], r.get("pattern")), {})[r["backend"]] = r
                    elif r.get("kind") == "error" and r.get("backend") not in labels:
                        labels.append(r["backend"])
        except OSError:
            pass
    return peers, labels


def main(args):
    _set_pdeathsig()
    cma.allow_peers()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    rank, n = _init(args)
    if args.pin == "cores" and not args._mpi:  # mpiexec binds its ranks itself
        # Before the process groups start their threads: they inherit it.
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.pg_timeout)
    dist.init_process_group("gloo", timeout=timeout)
    if args.inter_backend == "ringx":
        import ringx  # noqa: F401  (registers the backend)
    inter_group = dist.new_group(backend=args.inter_backend, timeout=timeout)
    between = Between(args.gap_us, inter_group)
    out = open(args._out, "a") if rank == 0 else None
    rep = {"repeat": args._repeat}

    def emit(rec):
        if out:
            out.write(json.dumps({**rec, **rep}) + "\n")
            out.flush()

    def say(line):
        if rank == 0:
            print(line, flush=True)

    variants = []
    if args._mpi:
        import _collectives_mpi

        variants.append(_collectives_mpi.MpiVariant(args._mpi))
        emit({"kind": "library", "world": n, "backend": args._mpi, "library": _collectives_mpi.library()})
    for name in ("ringx", "nccl"):
        if name not in args.backends or args._mpi:
            continue
        err = None
        try:
            if name == "ringx":
                import ringx  # noqa: F401  (registers the backend)

            variants.append(TorchVariant(name, dist.new_group(backend=name, timeout=timeout), n, device))
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}".splitlines()[0]
        if not _agree_ok(err is None):
            variants = [v for v in variants if v.label != name]
            say(f"# {name} unavailable: {err or 'failed on another rank'}")
            emit({"kind": "error", "world": n, "backend": name, "error": err or "another rank"})
    if "gloo" in args.backends and not args._mpi:
        world = dist.group.WORLD
        modes = args._gloo_modes
        if "torchrun" in modes:
            variants.append(TorchVariant(report.GLOO_LABELS["torchrun"], world, n, device))
        if "tcp" in modes:
            variants.append(TorchVariant(report.GLOO_LABELS["tcp"], world, None, device))
    peers, peer_labels = _load_peers(args._peer) if rank == 0 else ({}, [])

    bound = measure_bound(args, n, rank) if not (args.no_bound or args._mpi) else None
    if bound:
        emit({"kind": "bound", "world": n, **bound})
        for line in report.bound_lines(bound, n):
            say(line)

    dtype = DTYPES[args.dtype]
    el = torch.tensor([], dtype=dtype).element_size()
    llc = _llc_bytes()
    tcount = [0]
    labels = [v.label for v in variants] + peer_labels
    for coll in args.colls:
        status = {v.label: probe(v, coll, dtype, n, rank, args.root) for v in variants}
        for lb in peer_labels:
            st = [r.get("status", "-") for (c, _, _), p in peers.items() if c == coll for b, r in p.items()
                  if b == lb]
            status[lb] = "unsupported" if st and all(x == "unsupported" for x in st) else "ok"
        say("")
        for line in report.table_header(coll, n, args.dtype, labels, status, args.patterns, args.gap_us,
                                        not (args.no_bound or args._mpi), args.inter_backend):
            say(line)
        for v in variants:
            v.broken = None
        sizeless = coll in report.SIZELESS
        for size in [0] if sizeless else args.sizes:
            count = size // el
            if coll in SEGMENTED:
                count = count // n * n
            if count == 0 and not sizeless:
                continue
            nbytes = count * el
            per_rank = {"all_to_all_single": 2 * nbytes, "all_to_allv": 3 * nbytes,
                        "all_gather_into_tensor": nbytes + nbytes // n, "gather": nbytes + nbytes // n,
                        "scatter": nbytes + nbytes // n,
                        "reduce_scatter_tensor": nbytes + nbytes // n}.get(coll, nbytes)
            nbuf = max(1, min(args.max_buffers, math.ceil(args.rotate_mult * llc / max(per_rank, 1))))
            case = None
            need = (nbuf + 2) * per_rank  # rotating buffers, the pattern and the check base
            free = _mem_available() if device.type == "cpu" else torch.cuda.mem_get_info(device)[0]
            if need * n < 0.6 * free:
                try:
                    case = Case(coll, count, dtype, n, rank, nbuf, args.root, device,
                                separate=args.rows == "separate" and not args._mpi)
                except RuntimeError:  # allocation failed: skip this size for everyone
                    pass
            if not _agree_ok(case is not None):
                say(f"  {nbytes:>10} {count:>10}  skipped: needs ~{need >> 20} MiB per rank, "
                    f"more than this machine has free")
                emit({"kind": "point", "world": n, "coll": coll, "size": nbytes, "count": count,
                      "dtype": args.dtype, "backend": "*", "status": "skipped (memory)"})
                case = None
                continue
            rows = {}
            patterns = [p for p in args.patterns if p == "back-to-back" or nbytes <= args.pattern_max_bytes]
            for pattern in patterns:
                row = rows[pattern] = dict(peers.get((coll, nbytes, pattern), {}))
                for v in variants:
                    base = {"kind": "point", "world": n, "coll": coll, "backend": v.label,
                            "dtype": args.dtype, "size": nbytes, "count": count, "pattern": pattern,
                            "redop": "sum" if coll in REDUCING else "none"}
                    if pattern == "compute-gap":
                        base["gap_us"] = args.gap_us
                    if status[v.label] != "ok" or v.broken:
                        row[v.label] = {"status": status[v.label] if status[v.label] != "ok"
                                        else "skipped (earlier error)"}
                        emit({**base, **row[v.label]})
                        continue
                    try:
                        rec = run_point(args, v, case, nbuf, nbytes, tcount, n, between.get(pattern))
                        err = None
                    except Exception as e:  # noqa: BLE001
                        err = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                        traceback.print_exc()
                        rec = {"status": "error: " + err}
                    if not _agree_ok(err is None):
                        rec = {"status": rec["status"] if err else "error: failed on another rank"}
                        v.broken = rec["status"]
                    if rec["status"] == "ok" and not sizeless:
                        algbw = nbytes / rec["time_us"] / 1e3  # GB/s
                        rec["algbw_GBps"] = algbw
                        rec["busbw_GBps"] = algbw * report.bus_factor(coll, n)
                    rec["rss_MiB"] = _rss_mib()
                    row[v.label] = rec
                    emit({**base, **rec})
            single = None
            if not (args.no_bound or args._mpi or sizeless) and nbytes >= args.cma_min_bytes:
                add = bound["add_concurrent_Bps"] if bound else 0.0
                single = cma.measure(case, nbuf, args.cma_budget, args.min_iters, args.max_iters, add)
                single.update({"kind": "cma", "world": n, "coll": coll, "size": nbytes,
                               "dtype": args.dtype, "root": case.root(0) if args.root >= 0 else 0})
                emit(single)
            for j, pattern in enumerate(patterns):
                say(report.table_row(coll, n, nbytes, count, args.dtype, labels, rows[pattern], bound,
                                     pattern, single if j == 0 else None))
            del case
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
