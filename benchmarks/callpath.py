#!/usr/bin/env python3
"""Instructions per call of a small collective on a world of 1, counted by valgrind's
callgrind: a measure of ringx's call path that the machine's speed does not move.

    python benchmarks/callpath.py                       # ringx, 8-byte all_reduce, 2000 calls
    python benchmarks/callpath.py --backends ringx,gloo --json out.json

On the shared 2-core VMs the same code's time per call moves by 2x from one minute to
the next (docs/benchmarks.md, "The floor under load"), so a change that saves a few
percent of the call path cannot be seen in timings. The number of instructions executed
per call can: valgrind counts them, whatever the CPU's speed. The script starts one
process of a world of 1 under `valgrind --tool=callgrind --instr-atstart=no`, lets it
import torch and warm up uninstrumented, counts `--calls` synchronous calls
(`dist.all_reduce` of `--bytes` bytes of float32, the default 8 B), and prints per call:

  total      every instruction of the process in that window (all threads): torch's
             Python wrapper, its dispatcher, the backend, the Work's wait and release
  ringx      (ringx only) the part inside ringx's entry points, each counted with all
             it calls: ringx::ProcessGroupRingx::allreduce, ringx::WorkRingx::wait and
             ringx::WorkRingx::~WorkRingx
  rest       total - ringx: what torch and Python cost around the backend

gloo runs each collective on a worker thread of its own, so only its total compares
(`--backends ringx,gloo`).

Instruction counts are not times (a cache miss costs more than an add), but on one
machine and build an A/B of the same loop moves by well under 1% between runs, where
the timings move by tens of percent. Needs valgrind (Debian's `valgrind`).
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from collectives import free_port, machine

# Functions whose inclusive cost is ringx's part of a call: the collective's entry
# point, the Work's wait and its destructor.
ENTRY_POINTS = {
    "ringx": (r"ringx::ProcessGroupRingx::allreduce\(", r"ringx::WorkRingx::wait\(",
              r"ringx::WorkRingx::~WorkRingx\(\)"),
    "gloo": (),
}

WORKER = r'''
import os, sys, time
import torch
import torch.distributed as dist
backend, nbytes, calls, ready, done = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
if backend == "ringx":
    import ringx  # noqa: F401
dist.init_process_group(backend, rank=0, world_size=1)
t = torch.zeros(max(1, nbytes // 4))
for _ in range(300):
    dist.all_reduce(t)
open(ready, "w").close()
while os.path.exists(ready):
    time.sleep(0.02)
for _ in range(calls):
    dist.all_reduce(t)
open(done, "w").close()
while os.path.exists(done):
    time.sleep(0.02)
dist.destroy_process_group()
'''


def parse_inclusive(annotate_out: str, patterns) -> dict:
    """From `callgrind_annotate --inclusive=yes` output: the program total and, per
    pattern, the largest inclusive count of a function whose name matches it (a
    function listed more than once, as recursion does, counts once)."""
    total = None
    found = {p: 0 for p in patterns}
    for line in annotate_out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(.*)$", line)
        if not m:
            continue
        count, rest = int(m.group(1).replace(",", "")), m.group(2)
        if "PROGRAM TOTALS" in rest:
            total = count
            continue
        for p in patterns:
            if re.search(p, rest):
                found[p] = max(found[p], count)
    if total is None:
        raise ValueError("no PROGRAM TOTALS line in callgrind_annotate's output")
    return {"total": total, "entry_points": found}


def count(backend: str, nbytes: int, calls: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="ringx-callpath-") as tmp:
        ready, done, out = (os.path.join(tmp, n) for n in ("ready", "done", "callgrind.out"))
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
                   # UCX's memory hooks and valgrind's malloc replacement do not mix.
                   UCX_MEM_MALLOC_HOOKS="no", UCX_MEM_MMAP_HOOK_MODE="none", UCX_MEM_EVENTS="no")
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
             sys.executable, "-c", WORKER, backend, str(nbytes), str(calls), ready, done],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout

        def wait_for(path):
            while not os.path.exists(path):
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"{backend} worker under valgrind {'ended' if proc.poll() is not None else 'timed out'}"
                                       f" before {os.path.basename(path)}:\n{proc.communicate()[0][-3000:]}")
                time.sleep(0.05)

        wait_for(ready)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        os.unlink(ready)
        wait_for(done)
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        os.unlink(done)
        log, _ = proc.communicate(timeout=max(10.0, deadline - time.monotonic()))
        if proc.returncode != 0:
            raise RuntimeError(f"{backend} worker under valgrind exited {proc.returncode}:\n{log[-3000:]}")
        ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                             check=True, capture_output=True, text=True).stdout
    return per_call(parse_inclusive(ann, ENTRY_POINTS[backend]), backend, nbytes, calls)


def per_call(parsed: dict, backend: str, nbytes: int, calls: int) -> dict:
    """The JSON row: counts per call; ringx's part and the rest only where the backend
    has entry points to count (None for gloo)."""
    split = bool(parsed["entry_points"])
    own = sum(parsed["entry_points"].values())
    return {
        "backend": backend, "bytes": nbytes, "calls": calls,
        "total_per_call": parsed["total"] / calls,
        "backend_per_call": own / calls if split else None,
        "rest_per_call": (parsed["total"] - own) / calls if split else None,
        "entry_points_per_call": {p: c / calls for p, c in parsed["entry_points"].items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="ringx", help="comma-separated: ringx, gloo")
    ap.add_argument("--bytes", type=int, default=8, help="bytes of the all_reduce (float32)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per counted run")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if not shutil.which(tool):
            print(f"callpath: {tool} not found; install valgrind (apt-get install valgrind)", file=sys.stderr)
            return 2
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in ENTRY_POINTS:
            ap.error(f"unknown backend {b!r}; choose from {', '.join(ENTRY_POINTS)}")
    m = machine()
    print(f"# {m.get('cpu', '?')}, {m['cpus']} cpus; torch {m['torch']}, ringx {m['ringx']} (repo at {m.get('git', '?')})")
    print(f"# instructions per synchronous all_reduce of {args.bytes} B on a world of 1, "
          f"{args.calls} calls counted by callgrind")
    print(f"# {'backend':>8} {'repeat':>6} {'total':>10} {'ringx':>10} {'rest':>10}")
    rows = []
    for rep in range(args.repeats):
        for b in backends:
            r = count(b, args.bytes, args.calls, args.timeout)
            r["repeat"] = rep
            rows.append(r)
            own = (f"{r['backend_per_call']:>10.0f} {r['rest_per_call']:>10.0f}" if ENTRY_POINTS[b]
                   else f"{'-':>10} {'-':>10}")
            print(f"  {b:>8} {rep:>6} {r['total_per_call']:>10.0f} {own}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"machine": m, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                                "argv": sys.argv[1:]}, "rows": rows}, f, indent=1)
        print(f"# JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
