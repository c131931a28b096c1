#!/usr/bin/env python3
"""Where an 8-byte all_reduce's time goes on this machine: the call path alone, the call
path while the other cores run the same loop, and the collective (issue 12's floor).

    python benchmarks/floor.py                      # world 2, 3 repeats of 3 s per case
    python benchmarks/floor.py --world 4 --repeats 5 --json out.json

Issue 12 states its targets against a floor: ringx on a world of 1, where a call goes
through torch's Python and dispatcher and ringx's submit and completion but exchanges
nothing. Measured in a process alone, that floor leaves out what the other ranks cost
the caller when they run at the same time on the other cores (on the 2-core VM of
2026-11-27 one of two copies of the same world-1 loop, run at once, sometimes took twice
as long as the other: docs/benchmarks.md).
So each repeat times, in turns, with the same loop (`dist.all_reduce` of 2 float32 on a
synchronous call, each call timed):

  torch op alone      `t.add_(1)` in one process: the machine's speed for torch code
  torch op x N        N processes doing the same at once
  world 1 alone       ringx all_reduce, a group of 1: issue 12's floor
  world 1 x N         N processes, each its own group of 1, at once: the floor under
                      the load a world-N collective puts on the machine
  fake x N            N processes, each calling torch's FakeProcessGroup (a backend
                      that does nothing) at once: torch's own path under that load
  fake x N yield      (--switch) N processes, each calling torch's FakeProcessGroup (a
                      backend that does nothing) and yielding its core after every call
  world 1 x N yield   (--switch) the same with ringx's world 1: with more ranks than
                      cores, every call of a collective follows the other ranks' turns on
                      the core, and these two say what torch's path and ringx's cost then
  world N             ringx all_reduce across N ranks (the collective itself)
  world N gloo        the same on gloo (with --gloo)

The concurrent processes start their timed loop at the same instant and run for
--seconds; the ranks of a collective make half the calls the loaded floor made in that
time (they must all make the same number). Each process of the process-group cases
also times the torch op just before and after its loop (p50 of 20,000 calls): a CPU that
runs slower than usual during the loop shows there.
The table gives, per repeat, p10/p50/p90 of each case and its CPU per call (the
process's CPU time over its calls); for N processes, those of the process with the
highest p50, whose pace a collective would follow, with every process's p50 beside them;
what the collective adds to the loaded floor: world N p50 - world 1 x N p50; and what
ringx costs above torch's own path: world N p50 - fake x N p50.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

from collectives import free_ports, machine

CASES = ("op-alone", "op-xN", "w1-alone", "w1-xN", "fake-xN", "fake-xN-yield", "w1-xN-yield", "wN", "wN-gloo")
SWITCH_CASES = ("fake-xN-yield", "w1-xN-yield")


def op_p50(t, calls: int = 20000) -> float:
    """p50 in us of `t.add_(1)`: how fast this process's CPU runs torch code just now."""
    clock = time.perf_counter_ns
    times = []
    for _ in range(calls):
        a = clock()
        t.add_(1)
        times.append(clock() - a)
    times.sort()
    return times[calls // 2] / 1e3


def worker(case: str, start_at: float, seconds: float, calls: int, out: str) -> None:
    import torch

    t = torch.zeros(2)
    if case.startswith("op"):
        call = lambda: t.add_(1)  # noqa: E731
    else:
        import torch.distributed as dist

        import ringx  # noqa: F401  (registers the backend)

        if case.startswith("fake"):
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
        else:
            dist.init_process_group("gloo" if case == "wN-gloo" else "ringx")
        call = lambda: dist.all_reduce(t)  # noqa: E731
        for _ in range(500):
            call()
    while time.time() < start_at:
        time.sleep(0.001)
    # The processes that call torch's op alone are that measure; the others take it
    # just before and after their loop, so that a CPU that is slow during the loop
    # shows beside the loop's times.
    speed = [] if case.startswith("op") else [op_p50(torch.zeros(2))]
    # A collective's ranks must make the same number of calls: they get a count, the
    # processes that exchange nothing a time.
    # The -yield cases hand the core on after every call, untimed, as a rank of a
    # collective with more ranks than cores does while it waits: each call then starts
    # after the other processes ran, its caches cold.
    switch = os.sched_yield if case.endswith("-yield") else (lambda: None)
    times = []
    end = time.perf_counter() + seconds
    clock = time.perf_counter_ns
    cpu0 = time.process_time()
    while len(times) < calls if calls else clock() * 1e-9 < end:
        a = clock()
        call()
        times.append(clock() - a)
        switch()
    cpu = time.process_time() - cpu0
    if not case.startswith("op"):
        speed.append(op_p50(torch.zeros(2)))
        dist.destroy_process_group()
    times.sort()
    n = len(times)
    with open(out, "w") as f:
        json.dump({"calls": n, "p10": times[n // 10] / 1e3, "p50": times[n // 2] / 1e3,
                   "p90": times[9 * n // 10] / 1e3, "op_p50": speed,
                   "cpu_per_call": cpu / n * 1e6}, f)


def run_case(case: str, world: int, seconds: float, calls: int, tmp: str, settle: float) -> dict:
    """Start the case's processes, return the slowest process's percentiles (a collective
    goes at the pace of its slowest rank)."""
    together = 1 if case.endswith("alone") else world
    one_group = case in ("wN", "wN-gloo")
    start_at = time.time() + (1.0 if case.startswith("op") else settle)
    ports = free_ports(together)
    procs, outs = [], []
    for r in range(together):
        env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(ports[0] if one_group else ports[r]),
                   RANK=str(r if one_group else 0), LOCAL_RANK=str(r if one_group else 0),
                   WORLD_SIZE=str(world if one_group else 1),
                   LOCAL_WORLD_SIZE=str(world if one_group else 1))
        out = os.path.join(tmp, f"{case}-{r}.json")
        outs.append(out)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_worker", case,
                                       "--_start", repr(start_at), "--seconds", str(seconds), "--_out", out,
                                       "--_calls", str(calls if one_group else 0)],
                                      env=env, stdin=subprocess.DEVNULL))
    codes = [p.wait(timeout=seconds + 120) for p in procs]
    if any(codes):
        raise RuntimeError(f"{case}: processes exited {codes}")
    res = [json.load(open(o)) for o in outs]
    slowest = max(res, key=lambda r: r["p50"])
    return dict(slowest, each_p50=[r["p50"] for r in res], each_op_p50=[r["op_p50"] for r in res])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="timed loop per case (default 3)")
    ap.add_argument("--settle", type=float, default=6.0,
                    help="seconds from starting a ringx case's processes to their timed loops, which "
                         "start together once every process has imported torch and warmed up (default 6)")
    ap.add_argument("--gloo", action="store_true", help="also time the collective on gloo")
    ap.add_argument("--switch", action="store_true",
                    help="also time the loaded floor with a context switch after every call, for torch's own "
                         "path (FakeProcessGroup) and ringx's world 1: what a call costs when more ranks "
                         "than cores take turns")
    ap.add_argument("--json", help="where to write the results (default bench-results/floor-<date>.json)")
    ap.add_argument("--_worker")
    ap.add_argument("--_start", type=float)
    ap.add_argument("--_out")
    ap.add_argument("--_calls", type=int, default=0)
    args = ap.parse_args()
    if args._worker:
        worker(args._worker, args._start, args.seconds, args._calls, args._out)
        return 0
    cases = [c for c in CASES if (args.gloo or c != "wN-gloo") and (args.switch or c not in SWITCH_CASES)]
    n = args.world
    label = {c: c.replace("xN", f"x{n}").replace("wN", f"w{n}") for c in cases}
    mach = machine()
    print(f"# {mach.get('cpu', '?')}, {mach['cpus']} cpus, kernel {mach['kernel']}; torch {mach.get('torch')}, "
          f"ringx at {mach.get('git', '?')}; 8 B all_reduce (2 float32), synchronous calls, "
          f"{args.seconds:g} s per case; times in us")
    print(f"# {'repeat':>6} {'case':>13} {'p10':>7} {'p50':>7} {'p90':>7} {'calls':>8} {'cpu/call':>8}  "
          "each process's p50")
    runs = []
    with tempfile.TemporaryDirectory(prefix="ringx-floor-") as tmp:
        for rep in range(args.repeats):
            row = {}
            for c in cases:
                # The collective runs half the calls the loaded floor made in --seconds.
                calls = int(row["w1-xN"]["calls"] // 2) if "w1-xN" in row else 0
                row[c] = run_case(c, n, args.seconds, calls, tmp, args.settle)
                s = row[c]
                print(f"  {rep + 1:>6} {label[c]:>13} {s['p10']:7.1f} {s['p50']:7.1f} {s['p90']:7.1f} "
                      f"{int(s['calls']):>8} {s['cpu_per_call']:8.1f}  " + " ".join(f"{x:.1f}" for x in s["each_p50"])
                      + ("" if c.startswith("op") else "   torch op before/after: "
                         + ", ".join("/".join(f"{v:.1f}" for v in x) for x in s["each_op_p50"])),
                      flush=True)
            row["added"] = row["wN"]["p50"] - row["w1-xN"]["p50"]
            row["above_torch"] = row["wN"]["p50"] - row["fake-xN"]["p50"]
            row["load"] = row["w1-xN"]["p50"] / row["w1-alone"]["p50"]
            print(f"  {rep + 1:>6} w{n} adds {row['added']:.1f} us to the loaded floor and costs "
                  f"{row['above_torch']:.1f} us above torch's path; {n} processes at once "
                  f"make the floor {row['load']:.2f}x", flush=True)
            runs.append(row)
    print(f"\n# over {args.repeats} repeats (min-max of p50):")
    for c in cases:
        v = [r[c]["p50"] for r in runs]
        print(f"#   {label[c]:>13}  {min(v):6.1f} - {max(v):6.1f} us")
    added = [r["added"] for r in runs]
    print(f"#   w{n} - w1x{n}    {min(added):6.1f} - {max(added):6.1f} us  (what the collective adds)")
    above = [r["above_torch"] for r in runs]
    print(f"#   w{n} - fakex{n}  {min(above):6.1f} - {max(above):6.1f} us  (ringx's cost above torch's path)")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.json or os.path.join(os.getcwd(), "bench-results", f"floor-{stamp}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": {"machine_info": mach, "world": n, "seconds": args.seconds,
                            "repeats": args.repeats, "date": stamp, "argv": sys.argv[1:]},
                   "runs": runs}, f, indent=1)
    print(f"# JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
