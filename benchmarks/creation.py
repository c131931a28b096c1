#!/usr/bin/env python3
"""How long creating a process group takes, ringx against gloo, by world size.

    python benchmarks/creation.py                                  # worlds 8,16,32, 3 repeats
    python benchmarks/creation.py --worlds 32 --repeats 5 --json out.json
    python benchmarks/creation.py --builds new=.venv/bin/python,main=../main/.venv/bin/python

``--builds`` runs ringx from each listed interpreter (another build of ringx
installed in another venv) in turns with gloo, for an A/B of two builds in one run.

Each repeat launches the world afresh (all ranks on this host) for each backend, in
turns, and times two things on every rank:

  init       init_process_group + the first barrier, from the moment every rank has
             imported torch and reached the rendezvous store (a file barrier): the
             default group and its first collective. The store is up before the
             clock starts, as under torchrun, whose agent hosts it before the workers
             start. With env:// and the store in rank 0, its server took the
             clients' first requests about 5 s apart at world 32 on this machine (no
             client retried; 32 bare TCPStores do the same), a wait of the store's,
             not the backend's
  new_group  new_group(every rank) + a barrier on it, after a barrier on the default
             group: a group created by ranks already connected (what torchft's
             reconfigure and every subgroup pay)

A row's time is the slowest rank's. With ``RINGX_DEBUG=INFO`` a ringx group logs
where its creation time went; the slowest rank's phases of the new_group are kept
in the JSON (``phases_ms``).
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from _bench_out import print_table, spread, write_runs

BACKENDS = ["ringx", "gloo"]
PHASE = re.compile(r"rank \d+/\d+ up \(([^)]*)\)")


def rank_main(backend, out, world):
    rank = int(os.environ["RANK"])
    import torch  # noqa: F401
    import torch.distributed as dist

    if backend == "ringx":
        import ringx  # noqa: F401
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout, wait_for_workers=False)
    open(os.path.join(out, f"ready-{rank}"), "w").close()
    while not all(os.path.exists(os.path.join(out, f"ready-{r}")) for r in range(world)):
        time.sleep(0.005)
    t0 = time.perf_counter()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    dist.barrier()
    init_s = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    g = dist.new_group(list(range(world)))
    dist.barrier(group=g)
    new_group_s = time.perf_counter() - t0
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"init_s": init_s, "new_group_s": new_group_s}, f)
    dist.barrier()
    dist.destroy_process_group()


def launch(backend, world, port, python=sys.executable):
    with tempfile.TemporaryDirectory(prefix=f"ringx-creation-{backend}-") as out:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), RINGX_DEBUG="INFO")
        procs = [subprocess.Popen([python, __file__, "--rank-of", backend, out, str(world)],
                                  env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for r in range(world)]
        logs = [p.communicate(timeout=600)[1] for p in procs]
        bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise AssertionError(f"{backend} world {world}: ranks exited {bad}: {logs[bad[0][0]][-2000:]}")
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]
    init = max(x["init_s"] for x in ranks)
    new_group = max(x["new_group_s"] for x in ranks)
    slowest = max(range(world), key=lambda r: ranks[r]["new_group_s"])
    # The second "up" line of a rank is its new_group's (the first, the default group's).
    ups = PHASE.findall(logs[slowest])
    phases = {}
    if len(ups) >= 2:
        for part in ups[1].split(", "):
            name, ms = part.rsplit(" ", 2)[0], part.rsplit(" ", 2)[1]
            phases[name] = float(ms)
    return {"init_s": init, "new_group_s": new_group, "phases_ms": phases}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="8,16,32")
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--builds", default="",
                   help="LABEL=PYTHON,...: ringx from each interpreter in turn (default: this one)")
    p.add_argument("--json", default=None, help="output JSON (default bench-results/creation-<time>.json)")
    a = p.parse_args(argv)
    worlds = [int(w) for w in a.worlds.split(",")]
    builds = dict(b.split("=", 1) for b in a.builds.split(",") if b)
    backends = []
    for b in a.backends.split(","):
        if b == "ringx" and builds:
            backends += [f"ringx-{label}" for label in builds]
        elif b:
            backends.append(b)
    python_of = {f"ringx-{label}": os.path.abspath(py) for label, py in builds.items()}
    runs = {f"{b}/{w}": [] for w in worlds for b in backends}
    port = 29500 + os.getpid() % 2000
    for repeat in range(a.repeats):
        for w in worlds:
            for b in backends:  # in turns, so a busy patch of the machine hits both
                port += 1
                try:
                    r = launch(b.split("-")[0], w, port, python_of.get(b, sys.executable))
                    r["ok"] = True
                    r["load"] = os.getloadavg()[0]
                    print(f"repeat {repeat + 1} {b} world {w}: init {r['init_s']:.2f} s, new_group "
                          f"{r['new_group_s']:.3f} s" + (f" ({r['phases_ms']})" if r["phases_ms"] else ""),
                          flush=True)
                except (AssertionError, subprocess.TimeoutExpired) as err:
                    r = {"ok": False, "error": str(err)[-3000:]}
                    print(f"repeat {repeat + 1} {b} world {w}: failed: {str(err).splitlines()[0]}", flush=True)
                runs[f"{b}/{w}"].append(r)

    print_table(["backend", "world", "runs ok", "init s (min / median / max)", "new_group s (min / median / max)"],
                [((b, w), runs[f"{b}/{w}"]) for w in worlds for b in backends],
                [lambda ok: spread([r["init_s"] for r in ok]), lambda ok: spread([r["new_group_s"] for r in ok], 3)])
    write_runs("creation", a.json, runs)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-of":
        rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
