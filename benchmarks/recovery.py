#!/usr/bin/env python3
"""How long training stops when a replica dies (issue 43): torchft on ringx against
torchft on gloo, in one run.

    python benchmarks/recovery.py                       # 3 repeats of each backend
    python benchmarks/recovery.py --backends ringx --repeats 5 --json out.json

Each repeat is tools/torchft_replicas.py's run: three replica processes (DDP on a
small model, torchft's Manager, a lighthouse with a 1 s heartbeat timeout), replica 2
SIGKILLed after its 4th committed step, the other two training on without it, a
replacement that heals from them, all three to step 14 with equal final states.

  recovery   from the kill to the survivors' first committed step after it
  step       the survivors' median time per committed step before the kill (0.05 s
             of it is the replicas' stand-in for compute)

Backends: ``ringx`` (ringx.torchft.ProcessGroupRingx), ``gloo`` (torchft 0.2's own
ProcessGroupGloo: when a peer dies mid-allreduce, gloo's wait() raises and torchft's
DDP hook then fails an assertion, so the survivors crash; the run records that),
``gloo-reporting`` (torchft's gloo with ringx.torchft.AbortOnFailure, whose wait()
aborts the group and reports through errored() instead: gloo's own recovery time).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import torchft_replicas  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="ringx,gloo-reporting,gloo",
                   help=f"comma-separated, from {', '.join(torchft_replicas.BACKENDS)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="output JSON (default bench-results/recovery-<time>.json)")
    a = p.parse_args(argv)
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in torchft_replicas.BACKENDS]
    if bad:
        p.error(f"unknown backend(s) {bad}")

    runs = {b: [] for b in backends}
    for repeat in range(a.repeats):
        for b in backends:  # in turns, so a slow patch of the machine hits every backend
            with tempfile.TemporaryDirectory(prefix=f"ringx-recovery-{b}-") as out:
                try:
                    r = torchft_replicas.run_kill_and_heal(out, b)
                    runs[b].append({"ok": True, "recovery_s": r.recovery_s, "step_s": r.step_s})
                except AssertionError as err:
                    runs[b].append({"ok": False, "error": str(err).splitlines()[0]})
            last = runs[b][-1]
            print(f"repeat {repeat + 1} {b}: " + (f"recovery {last['recovery_s']:.2f} s, step "
                                                 f"{last['step_s'] * 1e3:.0f} ms" if last["ok"] else
                                                 f"failed: {last['error']}"), flush=True)

    print("\n| backend | runs ok | recovery s (min / median / max) | step ms (median of runs) |")
    print("|---|---|---|---|")
    for b in backends:
        ok = [r for r in runs[b] if r["ok"]]
        if ok:
            rec = sorted(r["recovery_s"] for r in ok)
            step = statistics.median(r["step_s"] for r in ok) * 1e3
            print(f"| {b} | {len(ok)}/{len(runs[b])} | {rec[0]:.2f} / {statistics.median(rec):.2f} / "
                  f"{rec[-1]:.2f} | {step:.0f} |")
        else:
            print(f"| {b} | 0/{len(runs[b])} | - | - |")

    path = a.json or os.path.join("bench-results", f"recovery-{datetime.datetime.now():%Y-%m-%d-%H%M%S}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"argv": sys.argv[1:], "runs": runs}, f, indent=1)
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
