#!/usr/bin/env python3
"""How soon the survivors on one host hear of a peer's death (issue 43): one rank is
SIGKILLed while the others wait in a small all_reduce, and each survivor's exception is
timed from the kill (tests/python/fault_scripts/detection.py, one launch per trial).

    python benchmarks/detection.py                          # worlds 2 and 4, 10 trials each
    python benchmarks/detection.py --worlds 2 --trials 20 --driver thread --json out.json

  detect   the kill to a survivor's exception (one value per survivor and trial)
  exit     the kill to the victim's exit being complete, when its pidfd became
           readable: the kernel's share, which no watch can beat
  lag      detect - exit: ringx's share

``--driver wait`` blocks the survivors in work.wait() (the caller drives the group),
``thread`` polls work.is_completed() so that the progress thread does. ``--kill-at
random`` kills at a random point of the 100 ms between the survivors' pid checks,
``after-check`` just after one (the pid poll's worst case).
"""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python", "fault_scripts"))

import faultlib  # noqa: E402
from _bench_out import print_table, spread, write_runs  # noqa: E402


def trial(ws, driver, kill_at):
    """One launch: {"ok", "detect_ms": [per survivor], "exit_ms", "why"}."""
    victim = ws - 1
    out = faultlib.launch("detection.py", ws, [victim, 4.0, driver, kill_at], timeout=120)
    killed = out[0].event("killed")
    if not killed:
        return {"ok": False, "why": out.report()[-2000:]}
    detect = []
    for r in range(ws):
        if r == victim:
            continue
        res = [x for x in out[r].records if x["event"] == "result" and x["label"] == "pending"]
        if not res or res[0]["ok"]:
            return {"ok": False, "why": f"rank {r}: {res}"}
        detect.append((res[0]["end"] - killed["at"]) * 1000)
    exit_ms = None if killed["exited"] is None else (killed["exited"] - killed["at"]) * 1000
    return {"ok": True, "detect_ms": detect, "exit_ms": exit_ms}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--driver", choices=["wait", "thread"], default="wait")
    ap.add_argument("--kill-at", choices=["random", "after-check"], default="random")
    ap.add_argument("--json", help="where to write the runs (default bench-results/detection-<time>.json)")
    args = ap.parse_args()
    print(f"load average: {os.getloadavg()}")
    runs, rows = {}, []
    for ws in [int(w) for w in args.worlds.split(",")]:
        key = f"world {ws}"
        runs[key] = [trial(ws, args.driver, args.kill_at) for _ in range(args.trials)]
        for r in runs[key]:
            if not r["ok"]:
                print(f"{key}: a trial failed: {r['why']}", file=sys.stderr)
        rows.append(([ws, args.driver, args.kill_at], runs[key]))
    print(f"load average: {os.getloadavg()}")

    def column(field):
        def cell(ok):
            xs = [x for r in ok for x in (r[field] if field == "detect_ms" else [r[field]]) if x is not None]
            return spread(xs, 1) if xs else "-"
        return cell

    def lag(ok):
        xs = [d - r["exit_ms"] for r in ok if r["exit_ms"] is not None for d in r["detect_ms"]]
        return spread(xs, 1) if xs else "-"

    print_table(["world", "driver", "kill at", "runs ok", "detect ms (min / median / max)", "exit ms", "lag ms"],
                rows, [column("detect_ms"), column("exit_ms"), lag])
    write_runs("detection", args.json, runs)


if __name__ == "__main__":
    main()
