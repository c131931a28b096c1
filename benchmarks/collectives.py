#!/usr/bin/env python3
"""Collective benchmark: ringx against gloo and MPI, nccl-tests style, in one invocation.

    python benchmarks/collectives.py                       # world 2 and 4, 8 B .. 256 MiB
    python benchmarks/collectives.py --world 2 --max-bytes 4M --colls all_reduce
    python benchmarks/collectives.py --pattern back-to-back --backends ringx,mpi
    python benchmarks/collectives.py --plot                # also a PNG next to the JSON
    python benchmarks/collectives.py --summary FILE.json   # the targets of a saved run
    python benchmarks/collectives.py --device cuda --backends ringx,nccl   # CUDA buffers (needs a GPU)

The script spawns its own ranks (a torchrun-like environment: RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, OMP_NUM_THREADS=1) and bounds each
world with a timeout; the ranks die with it. In each world the default process group
is gloo and `dist.new_group(backend="ringx")` is ringx, so both backends run in the
same processes on the same buffers, size by size, interleaved. MPI (Open MPI as
`mpi`, MPICH as `mpich`) runs just before, in ranks that `mpiexec` from the
benchmark-only venv starts (`make bench-mpi-venv`), with the same worker, sizes,
patterns and statistics. See docs/benchmarks.md for what the columns mean, how the
bounds are computed and how to re-measure the cost model's constants.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import mmap
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(HERE, "..", "tests", "python"))

import _collectives_report as report  # noqa: E402
import _collectives_targets as targets  # noqa: E402
# tests/python/ports.py; floor.py and ddp.py take free_ports and free_port from here.
from ports import free_port, free_ports  # noqa: E402,F401

PATTERNS = ["back-to-back", "compute-gap", "interleaved"]

ALIASES = {"all_gather": "all_gather_into_tensor", "allgather": "all_gather_into_tensor",
           "reduce_scatter": "reduce_scatter_tensor", "reducescatter": "reduce_scatter_tensor",
           "all_to_all": "all_to_all_single", "alltoall": "all_to_all_single",
           "allreduce": "all_reduce", "bcast": "broadcast", "alltoallv": "all_to_allv"}
REPO = os.path.dirname(HERE)
MPI_VENVS = {"mpi": os.path.join(REPO, "build", "bench-mpi-venv"),
             "mpich": os.path.join(REPO, "build", "bench-mpich-venv")}
MPI_NAMES = {"mpi": "Open MPI", "mpich": "MPICH"}


def parse_bytes(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("KMG")) * mult)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", default="2,4", help="world sizes, comma-separated (default 2,4)")
    p.add_argument("--colls", default=",".join(report.COLLS),
                   help="collectives, comma-separated (short names all_gather, reduce_scatter, "
                        "all_to_all work too)")
    p.add_argument("--min-bytes", type=parse_bytes, default=8, help="smallest size (default 8)")
    p.add_argument("--max-bytes", type=parse_bytes, default=256 << 20, help="largest size (default 256M)")
    p.add_argument("--step-factor", type=int, default=2, help="size multiplier between rows (default 2)")
    p.add_argument("--sizes", default=None,
                   help="exact sizes, comma-separated (e.g. 8,1M,64M), in place of --min-bytes, --max-bytes "
                        "and --step-factor")
    p.add_argument("--dtype", default="float32",
                   choices=["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"])
    p.add_argument("--root", type=int, default=0,
                   help="broadcast root (default 0, as nccl-tests); -1 rotates it every iteration")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the buffers live: cpu, or cuda (rank r on cuda:r modulo the GPUs; each call "
                        "timed to its completion on the GPU; no MPI and no single-copy bound; nccl may be "
                        "listed in --backends, with one GPU per rank)")
    p.add_argument("--backends", default="ringx,gloo,mpi",
                   help="ringx, gloo, mpi (Open MPI), mpich (MPICH), nccl (--device cuda only), comma-separated "
                        "(default ringx,gloo,mpi)")
    p.add_argument("--pattern", default=",".join(PATTERNS),
                   help="back-to-back, compute-gap, interleaved, comma-separated (default all three)")
    p.add_argument("--pattern-max-bytes", type=parse_bytes, default=1 << 20,
                   help="largest size the compute-gap and interleaved patterns run (default 1M; "
                        "back to back runs every size)")
    p.add_argument("--gap-us", type=float, default=200,
                   help="compute-gap: microseconds of CPU work (small matmuls) before each call (default 200)")
    p.add_argument("--inter-backend", default="gloo", choices=["gloo", "ringx"],
                   help="interleaved: the backend of the second group whose 8-byte all_reduce runs between "
                        "calls (default gloo; its threads stay busy after its call returns)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the whole sweep this many times and report each point's worst/best p50")
    p.add_argument("--mpi-venv", default=MPI_VENVS["mpi"], help="venv with mpi4py and Open MPI (make bench-mpi-venv)")
    p.add_argument("--mpich-venv", default=MPI_VENVS["mpich"], help="venv with mpi4py and MPICH")
    p.add_argument("--mpi-bind", default="none", choices=["none", "core", "mpi-default"],
                   help="mpiexec's binding of the MPI ranks (default none, as the torch ranks float)")
    p.add_argument("--mpi-args", default="", help="more mpiexec options, one string")
    p.add_argument("--summary", default=None, metavar="JSON",
                   help="print the issue-12/16 targets and the repeat spread of a saved run, then exit")
    p.add_argument("--gloo-modes", default="auto", choices=["auto", "torchrun", "tcp", "both"],
                   help="gloo as torchrun launches it (LOCAL_WORLD_SIZE set), over TCP with the "
                        "shared-memory path off (LOCAL_WORLD_SIZE unset), or both; auto = both when "
                        "this torch's gloo has the shared-memory all_reduce, else torchrun only")
    p.add_argument("--pin", default="none", choices=["none", "cores"],
                   help="none: ranks float over the CPUs, as torchrun starts them (default); cores: rank r "
                        "and every thread it starts on the r-th allowed CPU (modulo their number)")
    p.add_argument("--rows", default="views", choices=["views", "separate"],
                   help="all_gather's outputs and gather's and scatter's rows: views of one tensor "
                        "(default; all_gather as all_gather_into_tensor) or separate tensors (the list "
                        "forms, all_gather as dist.all_gather); MPI always takes one buffer")
    p.add_argument("--budget", type=float, default=0.25,
                   help="seconds of timed iterations per (collective, size, pattern, backend), a pattern's "
                        "gap included (default 0.25)")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=5, help="warm-up iterations (fewer above 16 MiB; never fewer than one per rotating buffer)")
    p.add_argument("--warmup-bytes", type=parse_bytes, default=64 << 20,
                   help="warm-up iterations = max(buffers, min(--warmup, this / size))")
    p.add_argument("--max-buffers", type=int, default=64, help="most rotating buffers per size")
    p.add_argument("--rotate-mult", type=float, default=4.0,
                   help="rotating buffers span this many last-level caches (default 4)")
    p.add_argument("--bound-mib", type=int, default=128, help="buffer size of the rate measurements")
    p.add_argument("--bound-reps", type=int, default=5)
    p.add_argument("--no-bound", action="store_true",
                   help="skip the memcpy / a+b measurement and the single-copy bound")
    p.add_argument("--cma-min-bytes", type=parse_bytes, default=64 << 10,
                   help="smallest size whose single-copy bound is measured (default 64K)")
    p.add_argument("--cma-budget", type=float, default=0.05,
                   help="seconds of process_vm_readv iterations per (collective, size) (default 0.05)")
    p.add_argument("--pg-timeout", type=float, default=120, help="process-group timeout, seconds")
    p.add_argument("--timeout", type=float, default=3600,
                   help="wall-clock bound per world (and per MPI world), seconds (default 3600)")
    p.add_argument("--json", default=None, help="output JSON (default bench-results/collectives-<time>.json)")
    p.add_argument("--plot", nargs="?", const="", default=None,
                   help="write a PNG (default: the JSON path with .png)")
    p.add_argument("--fit", action="store_true",
                   help="print ringx's latency and bandwidth fits (to re-measure the cost model)")
    p.add_argument("--self-test", action="store_true",
                   help="check the result checker against emulated right and wrong results, then exit")
    p.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--_out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_gloo-modes", dest="_gloo_modes", default="torchrun", help=argparse.SUPPRESS)
    p.add_argument("--_mpi", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_peer", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--_repeat", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.worlds = [int(w) for w in a.world.split(",") if w.strip()]
    a.colls = [ALIASES.get(c.strip(), c.strip()) for c in a.colls.split(",") if c.strip()]
    bad = [c for c in a.colls if c not in report.COLLS]
    if bad:
        p.error(f"unknown collective(s) {bad}; choose from {report.COLLS}")
    a.backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    bad = [b for b in a.backends if b not in ("ringx", "gloo", "mpi", "mpich", "nccl")]
    if bad:
        p.error(f"unknown backend(s) {bad}; choose from ringx, gloo, mpi, mpich, nccl")
    if "nccl" in a.backends and a.device != "cuda":
        p.error("nccl runs on CUDA buffers only: add --device cuda")
    if a.device == "cuda":
        # MPI ranks and the single-copy bound work on host memory.
        host_only = [b for b in a.backends if b in ("mpi", "mpich")]
        if host_only and any(x == "--backends" or x.startswith("--backends=") for x in (sys.argv[1:] if argv is None else argv)):
            p.error(f"--device cuda: {', '.join(host_only)} work(s) on host buffers only; leave it out of --backends")
        a.backends = [b for b in a.backends if b not in host_only]
        a.no_bound = True
    a.patterns = [x.strip() for x in a.pattern.split(",") if x.strip()]
    bad = [x for x in a.patterns if x not in PATTERNS]
    if bad:
        p.error(f"unknown pattern(s) {bad}; choose from {PATTERNS}")
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    if a.step_factor < 2:
        p.error("--step-factor must be >= 2")
    if a.inter_backend == "ringx" and "interleaved" in a.patterns and {"mpi", "mpich"} & set(a.backends):
        p.error("--inter-backend ringx cannot run beside MPI: an MPI rank cannot load ringx (Open MPI's "
                "bundled UCX clashes with ringx's); leave mpi and mpich out of --backends")
    if a.sizes:
        a.sizes = sorted({parse_bytes(x) for x in a.sizes.split(",") if x.strip()})
        if not a.sizes or a.sizes[0] < 1:
            p.error("--sizes takes positive sizes, e.g. 8,1M,64M")
    else:
        a.sizes, s = [], max(1, a.min_bytes)
        while s <= a.max_bytes:
            a.sizes.append(s)
            s *= a.step_factor
    a._gloo_modes = a._gloo_modes.split(",")
    return a


# --------------------------------------------------------------- what we run on


def detect_gloo_shm() -> dict:
    """Does this torch's gloo have the shared-memory all_reduce (gloo/allreduce_shm.cc)?

    That path (gloo PR 458, 2025) is taken when LOCAL_WORLD_SIZE equals the group
    size; it reads the variable with getenv, so the string is in the binary. We look
    for it, and for the path's symbols, in torch's libraries without importing torch.
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"available": False, "evidence": "torch not found"}
    lib = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    needles = [b"LOCAL_WORLD_SIZE", b"is_intra_node", b"allreduce_shm", b"AllreduceSharedMemoryData"]
    found, scanned = {}, []
    for name in ("libtorch_cpu.so", "libtorch.so", "libtorch_python.so"):
        path = os.path.join(lib, name)
        if not os.path.exists(path):
            continue
        scanned.append(name)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            for nd in needles:
                if m.find(nd) >= 0:
                    found.setdefault(nd.decode(), []).append(name)
    avail = "LOCAL_WORLD_SIZE" in found and any(k != "LOCAL_WORLD_SIZE" for k in found)
    ev = (f"scanned {', '.join(scanned)} for {', '.join(n.decode() for n in needles)}: "
          + (", ".join(f"{k} in {'/'.join(v)}" for k, v in found.items()) if found else "none found"))
    return {"available": avail, "evidence": ev}


def machine() -> dict:
    info = {"host": platform.node(), "kernel": platform.release(), "python": platform.python_version(),
            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_GiB"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    import importlib.metadata as md

    for mod in ("torch", "ringx", "libucx-cu13"):
        try:
            info[mod] = md.version(mod)
        except md.PackageNotFoundError:
            info[mod] = "not installed"
    try:
        info["git"] = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    info["python_loop_s"] = python_loop_seconds()
    return info


def python_loop_seconds() -> float:
    """The time of a 10M-iteration CPython loop (the best of 3 runs of 2M, scaled): an index of
    the CPU's speed at the time of the run. The 2-core VM's speed varies from day to day: on
    2026-11-26 this read 0.5-0.9 s while ringx's 8 B all_reduce at world 2 took 31-38 us,
    with the same code as on days when it took 5 us."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        acc = 0
        for i in range(2_000_000):
            acc += i
        best = min(best, time.perf_counter() - start)
    return round(best * 5, 2)


def cuda_unavailable(args) -> str | None:
    """Why --device cuda cannot run here, or None."""
    import torch

    if not torch.version.cuda:
        return f"torch {torch.__version__} is a CPU build; install a CUDA build of torch"
    if not torch.cuda.is_available():
        return (f"no CUDA GPU here (torch {torch.__version__}, CUDA {torch.version.cuda}: "
                f"torch.cuda.is_available() is False)")
    gpus = torch.cuda.device_count()
    if "nccl" in args.backends and max(args.worlds) > gpus:
        return f"nccl needs one GPU per rank: world {max(args.worlds)} on {gpus} GPU(s)"
    return None


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


# ------------------------------------------------------------------ launching


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.time() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_world(n, args, gloo_modes, logdir, repeat=0, peers=()) -> tuple[list, str | None]:
    """Spawn n ranks, wait (bounded), return (records, error or None)."""
    out = os.path.join(logdir, f"world{n}-r{repeat}.jsonl")
    port = free_port()
    argv = [a for a in sys.argv[1:]] + ["--_repeat", str(repeat)] + [x for p in peers for x in ("--_peer", p)]
    procs, logs = [], []
    try:
        for r in range(n):
            env = dict(os.environ)
            env.update({"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n),
                        "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "ROLE_RANK": str(r),
                        "ROLE_WORLD_SIZE": str(n), "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "TORCHELASTIC_RUN_ID": f"bench-{os.getpid()}", "TORCHELASTIC_RESTART_COUNT": "0",
                        "TORCHELASTIC_MAX_RESTARTS": "0", "OMP_NUM_THREADS": "1",
                        "PYTHONUNBUFFERED": "1"})
            log = os.path.join(logdir, f"world{n}-r{repeat}-rank{r}.log")
            logs.append(log)
            lf = open(log, "w")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), *argv, "--_worker", "--_out", out,
                 "--_gloo-modes", ",".join(gloo_modes)],
                env=env, stdin=subprocess.DEVNULL, stdout=None if r == 0 else lf, stderr=lf))
            lf.close()
        deadline = time.time() + args.timeout
        err, done_at, failed_at = None, None, None
        while any(p.poll() is None for p in procs):
            now = time.time()
            if done_at is None and _done(out):
                done_at = now
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now
            if now > deadline:
                err = f"world {n}: timed out after {args.timeout:.0f} s (--timeout); ranks killed"
                break
            if done_at and now - done_at > 30:
                break  # results are complete; a rank stuck in shutdown is killed below
            if failed_at and now - failed_at > 15:
                break
            time.sleep(0.2)
        codes = [p.poll() for p in procs]
        if err is None and not _done(out):
            err = f"world {n}: ranks exited {codes} before finishing"
    finally:
        _stop(procs)
    if err:
        for log in logs:
            try:
                with open(log) as f:
                    tail = f.read()[-2500:]
            except OSError:
                tail = ""
            if tail.strip():
                print(f"---- {log} (tail) ----\n{tail}", file=sys.stderr)
    records = []
    if os.path.exists(out):
        with open(out) as f:
            records = [json.loads(line) for line in f if line.strip()]
    return records, err


def mpiexec_argv(label, n, args) -> list[str]:
    """mpiexec and its options: shared-memory transports only, every rank on this host."""
    venv = args.mpi_venv if label == "mpi" else args.mpich_venv
    exe = os.path.join(venv, "bin", "mpiexec")
    if label == "mpi":
        # ob1 with the self and sm BTLs: shared memory, single copy through CMA as it
        # chooses by default; no UCX, no TCP. More ranks than cores needs OVERSUBSCRIBE.
        opts = ["--map-by", ":OVERSUBSCRIBE", "--mca", "pml", "ob1", "--mca", "btl", "self,sm"]
        if args.mpi_bind != "mpi-default":
            opts += ["--bind-to", args.mpi_bind]
    else:
        opts = [] if args.mpi_bind == "mpi-default" else ["-bind-to", args.mpi_bind]
    return [exe, "-n", str(n), *opts, *args.mpi_args.split()]


def run_mpi_world(label, n, args, logdir, repeat=0) -> tuple[list, str | None, str]:
    """The MPI ranks of one world under mpiexec (bounded); (records, error, records file)."""
    out = os.path.join(logdir, f"world{n}-r{repeat}-{label}.jsonl")
    venv = args.mpi_venv if label == "mpi" else args.mpich_venv
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py) or not os.path.exists(os.path.join(venv, "bin", "mpiexec")):
        return [], (f"world {n}: {label} skipped: no {venv} (make bench-mpi-venv sets it up)"), out
    env = dict(os.environ)
    # No ringx in MPI ranks: torch's autoload of it would load the UCX wheel's libraries
    # into a process where the MPI wheel has its own UCS (undefined-symbol errors).
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1", "TORCHELASTIC_RUN_ID": f"bench-{os.getpid()}",
                "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    if os.geteuid() == 0:
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    cmd = mpiexec_argv(label, n, args) + [py, os.path.abspath(__file__), *sys.argv[1:], "--_worker",
                                          "--_mpi", label, "--_out", out, "--_repeat", str(repeat)]
    log = os.path.join(logdir, f"world{n}-r{repeat}-{label}.log")
    err = None
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline, done_at = time.time() + args.timeout, None
        while proc.poll() is None:
            if done_at is None and _done(out):
                done_at = time.time()
            if time.time() > deadline:
                err = f"world {n}: {label} timed out after {args.timeout:.0f} s (--timeout); ranks killed"
                break
            if done_at and time.time() - done_at > 30:
                break
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if err is None and not _done(out):
        err = f"world {n}: {label} exited {proc.returncode} before finishing (command: {' '.join(cmd[:12])} ...)"
    if err:
        with open(log) as f:
            print(f"---- {log} (tail) ----\n{f.read()[-2500:]}", file=sys.stderr)
    records = []
    if os.path.exists(out):
        with open(out) as f:
            records = [json.loads(line) for line in f if line.strip()]
    return records, err, out


def _done(path) -> bool:
    try:
        with open(path) as f:
            return any('"kind": "done"' in line for line in f)
    except OSError:
        return False


def print_summary(records, meta, args_backends) -> dict:
    """The closing tables (also what --summary prints from a saved JSON); returns the rows."""
    gloo_labels, mpi_labels = meta.get("gloo_labels", []), meta.get("mpi_labels", [])
    worlds, colls = meta["worlds"], meta["colls"]
    print()
    for line in report.key_numbers(records, worlds, gloo_labels + mpi_labels):
        print(line)
    print()
    if "ringx" in args_backends:
        others = gloo_labels + mpi_labels
        if others:
            for line in report.ratio_tables(records, worlds, colls, others):
                print(line)
        if gloo_labels:
            for line in report.targets(records, meta):
                print(line)
            print()
        rows = targets.summary(records, meta)
        loads = [float(v.split()[0]) for la in meta.get("load_average", {}).values() for v in la.values()
                 if v and v != "?"]
        cpus = meta.get("machine_info", {}).get("cpus") or 1
        if loads and max(loads) > cpus:
            print(f"# WARNING: load average up to {max(loads):.1f} on {cpus} CPUs during this run: other work "
                  f"shared the cores, MPI's busy-polling ranks suffer most, and the verdicts below say more "
                  f"about that work than about the backends")
        for line in targets.format_rows("issue 12 targets (latency as training sees it)", rows["issue12"]):
            print(line)
        print()
        for line in targets.format_rows("issue 16 targets (single-copy intra-host collectives)", rows["issue16"]):
            print(line)
        print()
        for line in targets.format_rows("issue 44 targets (many ranks, busy cores: time and CPU per call)",
                                        rows["issue44"]):
            print(line)
    else:
        rows = {}
    spread = targets.spread_table(records, ["ringx"] + gloo_labels + mpi_labels)
    if spread:
        print()
        for line in spread:
            print(line)
    return rows


def main():
    args = parse_args()
    if args._worker:
        import _collectives_worker

        _collectives_worker.main(args)
        return 0
    if args.self_test:
        import _collectives_cases

        return 1 if _collectives_cases.self_test() else 0
    if args.summary:
        with open(args.summary) as f:
            saved = json.load(f)
        print_summary(saved["records"], saved["meta"], ["ringx"])
        return 0
    if args.device == "cuda":
        why = cuda_unavailable(args)
        if why:
            print(f"collectives.py: --device cuda: {why}", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    json_path = args.json or os.path.join(os.getcwd(), "bench-results", f"collectives-{stamp}.json")
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)

    shm = detect_gloo_shm()
    if args.gloo_modes == "auto":
        modes = ["torchrun", "tcp"] if shm["available"] else ["torchrun"]
    else:
        modes = {"torchrun": ["torchrun"], "tcp": ["tcp"], "both": ["torchrun", "tcp"]}[args.gloo_modes]
    gloo_labels = [report.GLOO_LABELS[m] for m in modes] if "gloo" in args.backends else []
    mpi_labels = [b for b in args.backends if b in report.MPI_LABELS]
    chosen = any(x == "--backends" or x.startswith("--backends=") for x in sys.argv[1:])
    for lb in list(mpi_labels):
        venv = args.mpi_venv if lb == "mpi" else args.mpich_venv
        if not os.path.exists(os.path.join(venv, "bin", "mpiexec")):
            why = f"{lb}: no {venv} (`make bench-{'mpi' if lb == 'mpi' else 'mpich'}-venv` sets it up)"
            if chosen:
                print(f"# ERROR: {why}", file=sys.stderr)
                return 2
            print(f"# {why}: running without it")
            mpi_labels.remove(lb)
            args.backends.remove(lb)
    mach = machine()
    meta = {"machine": f"{mach.get('cpu', '?')}, {mach.get('cpus')} cpus, {mach.get('mem_GiB', '?')} GiB; "
                       f"torch {mach.get('torch')}, ringx {mach.get('ringx')} (repo at {mach.get('git', '?')})",
            "machine_info": mach, "date": stamp, "dtype": args.dtype, "worlds": args.worlds,
            "colls": args.colls, "sizes": args.sizes, "gloo_shm": shm, "gloo_modes": modes,
            "gloo_labels": gloo_labels, "mpi_labels": mpi_labels, "patterns": args.patterns,
            "gap_us": args.gap_us, "inter_backend": args.inter_backend, "repeats": args.repeats,
            "argv": sys.argv[1:], "pin": args.pin, "rows": args.rows,
            "mpi_bind": args.mpi_bind,
            "mpiexec": {lb: mpiexec_argv(lb, "N", args) for lb in mpi_labels},
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("RINGX_", "UCX_"))}}
    print(f"# {meta['machine']}")
    print(f"# machine check: a 10M-iteration CPython loop takes {mach['python_loop_s']} s here "
          "(compare runs only at similar values)")
    print(f"# gloo shared-memory all_reduce in this torch: {'YES' if shm['available'] else 'no'} "
          f"({shm['evidence']})")
    if "gloo" in args.backends:
        desc = {"gloo": "gloo with LOCAL_WORLD_SIZE set, as torchrun launches it"
                        + ("" if shm["available"] else " (= gloo over TCP: no shm path here)"),
                "gloo-tcp": "gloo with LOCAL_WORLD_SIZE unset (shared-memory path off: TCP)"}
        for lb in gloo_labels:
            print(f"#   {lb:8s} = {desc[lb]}")
    for lb in mpi_labels:
        print(f"#   {lb:8s} = {MPI_NAMES[lb]} through mpi4py, separate ranks run just before each world: "
              + " ".join(os.path.relpath(x) if os.path.isabs(x) else x for x in meta["mpiexec"][lb][:1])
              + " " + " ".join(meta["mpiexec"][lb][1:]))
    if args.pin == "cores":
        print("# ranks pinned: rank r and its threads on the r-th allowed CPU (--pin cores)")
    if args.rows == "separate":
        print("# --rows separate: all_gather into a list of separate tensors (dist.all_gather), gather "
              "and scatter with separate row tensors; MPI takes one buffer")
    if meta["env"]:
        print("# environment: " + " ".join(f"{k}={v}" for k, v in meta["env"].items()))
    print("# time = median (p50) over iterations of the slowest rank's time; p90 of the same; "
          "algbw = size/time; busbw = algbw * nccl-tests factor; GB = 1e9 B")

    records, errors = [], []
    libraries = meta.setdefault("mpi_library", {})
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="ringx-bench-") as logdir:
        for rep in range(args.repeats):
            if args.repeats > 1:
                print(f"\n################ repeat {rep + 1} of {args.repeats} ################", flush=True)
            for n in args.worlds:
                print(f"\n######## world {n} ########   (load average {_loadavg()})", flush=True)
                t0 = time.time()
                load = {"start": _loadavg()}
                peers = []
                for lb in mpi_labels:
                    t1 = time.time()
                    recs, err, path = run_mpi_world(lb, n, args, logdir, rep)
                    records += recs
                    peers.append(path)
                    for r in recs:
                        if r.get("kind") == "library":
                            libraries[lb] = r["library"]
                    if err:
                        errors.append(err)
                        print(f"# ERROR: {err}", flush=True)
                    else:
                        print(f"# world {n}: {lb} ({libraries.get(lb, '?')}) measured in {time.time() - t1:.0f} s "
                              f"by its own ranks; its columns below", flush=True)
                recs, err = run_world(n, args, modes, logdir, rep, peers)
                load["end"] = _loadavg()
                meta.setdefault("load_average", {})[f"{n}" if rep == 0 else f"{n}/r{rep}"] = load
                records += recs
                if err:
                    errors.append(err)
                    print(f"# ERROR: {err}", flush=True)
                print(f"# world {n}: {time.time() - t0:.0f} s (load average now {load['end']}: "
                      f"other work on this machine inflates times and spreads)", flush=True)
    meta["wall_s"] = round(time.time() - t_start)
    rows = print_summary(records, meta, args.backends)
    if args.fit:
        print()
        for line in report.fits(records, args.worlds):
            print(line)
    meta["errors"] = errors
    with open(json_path, "w") as f:
        json.dump({"meta": meta, "records": records, "summary": rows}, f, indent=1)
    print(f"\n# whole run: {meta['wall_s']} s")
    print(f"# JSON: {json_path}")
    if args.plot is not None:
        png = args.plot or os.path.splitext(json_path)[0] + ".png"
        why = report.plot(records, meta, png)
        print(f"# plot: {png}" if why is None else f"# plot not written: {why}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
