#!/usr/bin/env python3
"""How long training stops when a rank dies (issue 43): dist.shrink_group on ringx,
a torchrun restart from a checkpoint, and torchft on ringx against torchft on gloo,
in one run, in turns.

    python benchmarks/recovery.py                       # 3 repeats of each mode
    python benchmarks/recovery.py --modes shrink,ringx --repeats 5 --json out.json

``shrink``: examples/elastic_ddp.py, 4 ranks of DDP under the example's own launcher;
global rank 2 SIGKILLs itself in step 10, the survivors shrink the default group and
train to step 20 on 3 ranks.

``restart``: examples/resume_after_restart.py, 4 ranks of DDP under torchrun
``--max-restarts 1``, a checkpoint after every step (restart's best case: no step is
redone); global rank 2 SIGKILLs itself in step 10, torchrun's agent stops the others
and starts all four again, which load the checkpoint of step 9 and train to step 20.

The torchft modes are tools/torchft_replicas.py's run: three replica processes (DDP
on a small model, torchft's Manager, a lighthouse with a 1 s heartbeat timeout),
replica 2 SIGKILLed after its 4th committed step, the other two training on without
it, a replacement that heals from them, all three to step 14 with equal final states.

  recovery   from the kill to the survivors' first completed step after it
             (torchft: the first step after the victim's last, without it)
  step       the survivors' median time per step before the kill (torchft: 0.05 s of
             it is the replicas' stand-in for compute, and each step runs a quorum)

torchft modes: ``ringx`` (ringx.torchft.ProcessGroupRingx), ``gloo`` (torchft 0.2's own
ProcessGroupGloo: when a peer dies mid-allreduce, gloo's wait() raises and torchft's
DDP hook then fails an assertion, so the survivors crash; the run records that),
``gloo-reporting`` (torchft's gloo with ringx.torchft.AbortOnFailure, whose wait()
aborts the group and reports through errored() instead: gloo's own recovery time).

``--phases`` (torchft modes) splits each recovery, as the survivor that was back first
saw it (tools/torchft_replicas.py's recovery_phases): the kill to its collective
failing (error, when it had one) and to the quorum without the victim (quorum), the
process group's configure() (of which create_pg, the new group, and configure_rest: the
old group's abort and the store's client), the new group's first allreduce, from it to
the step committed (to_commit: 50 ms of stand-in compute, then the commit), from the
quorum to that step (from_quorum: the
process group's share; the quorum itself waits on the lighthouse's join timeout and
ticks, 0.5-0.6 s whatever the group), and the kill to that step (recovery).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import torchft_replicas  # noqa: E402
from _bench_out import print_table, spread, write_runs  # noqa: E402

MODES = ["shrink", "restart"] + torchft_replicas.BACKENDS
KILL_STEP = 10


def run_shrink(out):
    """kill -> the survivors' next step, through examples/elastic_ddp.py."""
    progress = os.path.join(out, "progress.txt")
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples", "elastic_ddp.py"), "--nproc", "4",
                        "--steps", "20", "--kill", f"2@{KILL_STEP}", "--progress", progress],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"elastic_ddp.py exited with {r.returncode}: {(r.stdout + r.stderr)[-2000:]}")
    lines = [line.split() for line in open(progress)]
    killed = next(float(x[2]) for x in lines if x[1] == "dying")
    # Step 10 done is written as "step 11"; a slower rank may still write
    # "step 10" after the victim, ahead of it, died.
    after = [float(x[3]) for x in lines if x[1] == "step" and x[2] == str(KILL_STEP + 1)]
    before = sorted(float(x[3]) for x in lines if x[1] == "step" and x[0] == "1" and int(x[2]) <= KILL_STEP)
    return torchft_replicas.Run(min(after) - killed, statistics.median(b - a for a, b in zip(before, before[1:])),
                                [], [])


def run_restart(out):
    """kill -> the restarted ranks' first completed step, under torchrun."""
    progress = os.path.join(out, "progress")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                        "--max-restarts", "1", "--monitor-interval", "0.1",
                        os.path.join(REPO, "examples", "resume_after_restart.py"), "--ckpt-dir",
                        os.path.join(out, "ckpt"), "--steps", "20", "--ckpt-every", "1", "--die-at",
                        f"2@{KILL_STEP}", "--progress", progress],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"torchrun exited with {r.returncode}: {(r.stdout + r.stderr)[-2000:]}")
    lines = [json.loads(line) for rank in range(4) for line in open(f"{progress}.rank{rank}")]
    killed = next(x["t"] for x in lines if "dying" in x)
    after = [x["t"] for x in lines if x.get("attempt") == 1 and x.get("step") == KILL_STEP]
    before = sorted(x["t"] for x in lines if x["rank"] == 1 and x["attempt"] == 0 and "step" in x)
    if not after:
        raise AssertionError(f"no rank completed step {KILL_STEP} after the restart: {(r.stdout + r.stderr)[-2000:]}")
    return torchft_replicas.Run(min(after) - killed, statistics.median(b - a for a, b in zip(before, before[1:])),
                                [], [])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="output JSON (default bench-results/recovery-<time>.json)")
    p.add_argument("--phases", action="store_true", help="torchft modes: time each phase of a recovery")
    p.add_argument("--hidden", type=int, default=32,
                   help="torchft modes: the model's hidden width (gradients of about 84 bytes a unit)")
    p.add_argument("--step-sleep", type=float, default=0.05, help="torchft modes: seconds of stand-in compute a step")
    a = p.parse_args(argv)
    if a.phases:
        os.environ["RINGX_RECOVERY_PHASES"] = "1"  # the replicas inherit it
    modes = [b.strip() for b in a.modes.split(",") if b.strip()]
    bad = [b for b in modes if b not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}")

    runs = {b: [] for b in modes}
    for repeat in range(a.repeats):
        for b in modes:  # in turns, so a slow patch of the machine hits every mode
            with tempfile.TemporaryDirectory(prefix=f"ringx-recovery-{b}-") as out:
                try:
                    if b == "shrink":
                        r = run_shrink(out)
                    elif b == "restart":
                        r = run_restart(out)
                    else:
                        r = torchft_replicas.run_kill_and_heal(out, b, hidden=a.hidden, step_sleep=a.step_sleep)
                    runs[b].append({"ok": True, "recovery_s": r.recovery_s, "step_s": r.step_s})
                    if r.phases:
                        runs[b][-1]["phases_s"] = r.phases
                except (AssertionError, statistics.StatisticsError) as err:
                    # A run too short to time (no two steps before the kill) fails as one.
                    # The first line says what failed; the replicas' log tails follow, for the JSON.
                    runs[b].append({"ok": False, "error": str(err).splitlines()[0], "logs": str(err)[-6000:]})
            last = runs[b][-1]
            print(f"repeat {repeat + 1} {b}: " + (f"recovery {last['recovery_s']:.2f} s, step "
                                                 f"{last['step_s'] * 1e3:.0f} ms" if last["ok"] else
                                                 f"failed: {last['error']}"), flush=True)

    print_table(["mode", "runs ok", "recovery s (min / median / max)", "step ms (median of runs)"],
                [((b,), runs[b]) for b in modes],
                [lambda ok: spread([r["recovery_s"] for r in ok]),
                 lambda ok: f"{statistics.median(r['step_s'] for r in ok) * 1e3:.0f}"])

    timed = [b for b in modes if any("phases_s" in r for r in runs[b])]
    if timed:
        print_phases(timed, runs)

    write_runs("recovery", a.json, runs)


def print_phases(modes, runs):
    """A row per phase, a column per mode: ms, min / median / max over its runs."""
    print("\n| phase, ms | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for name in torchft_replicas.PHASES:
        cells = []
        for b in modes:
            xs = [r["phases_s"][name] * 1e3 for r in runs[b] if r.get("phases_s") and r["phases_s"][name] is not None]
            cells.append(f"{spread(xs, 0)} ({len(xs)})" if xs else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
