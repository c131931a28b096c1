"""torchft replica groups that lose one replica and heal a replacement, for
tests/python/test_torchft.py and benchmarks/recovery.py.

Launcher side: ``run_kill_and_heal(out, backend)`` starts a lighthouse and three
replica processes (this file run as a script), SIGKILLs replica 2 mid-training,
lets the other two train on without it, starts a replacement that heals from them,
and returns what it measured (``Run``). The final states are in out/replica<i>.pt.

Replica side (``python torchft_replicas.py --replica-id I --lighthouse ADDR ...``):
one replica group of one rank training a small model with torchft's DDP. Its
Manager's process group is ringx's (ringx.torchft.ProcessGroupRingx) or torchft's
gloo one (``gloo``; ``gloo-reporting`` is gloo with ringx.torchft's AbortOnFailure,
whose wait() aborts the group and reports through ``errored()`` instead of raising:
with torchft 0.2's own gloo group a survivor's DDP hook fails on an assertion when a
peer dies mid-allreduce).
Gradients are averaged over the quorum's members; a replica that (re)joins late
heals: it loads the model and optimizer from a peer. After each committed step it
appends `step <n> <time.time()> participants <k>` to out/progress<i>.txt; at the end
it saves its state to out/replica<i>.pt. Batches are drawn from (replica id, step),
so a run is reproducible whatever the quorums were.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

BACKENDS = ["ringx", "gloo", "gloo-reporting"]


# ----------------------------------------------------------------------------- replica side


def _process_group(backend, timeout):
    from torchft.process_group import ProcessGroupGloo

    from ringx.torchft import AbortOnFailure, ProcessGroupRingx

    if backend == "ringx":
        return ProcessGroupRingx(timeout=timeout)
    if backend == "gloo":
        return ProcessGroupGloo(timeout=timeout)

    class ReportingGloo(AbortOnFailure, ProcessGroupGloo):
        pass

    return ReportingGloo(timeout=timeout)


class _TimedClient:
    """The Manager's client with its quorum call timed (the rest passes through:
    torchft's client is a Rust object whose methods cannot be replaced)."""

    def __init__(self, client, record):
        self._client = client
        self._quorum = _timed(client._quorum, "quorum", record)

    def __getattr__(self, name):
        return getattr(self._client, name)


def _timed(fn, name, record):
    def call(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            record(name, start, time.time())

    return call


def _record_phases(manager, pg, record):
    """RINGX_RECOVERY_PHASES=1 (benchmarks/recovery.py --phases): each call on the
    way from a kill to the next committed step, as `phase <name> <start> <end>`,
    so that the launcher can split a recovery into detection, abort, quorum,
    configure and the first collective."""
    for name in ("configure", "_create_pg"):
        setattr(pg, name, _timed(getattr(pg, name), name.lstrip("_"), record))
    fail = getattr(pg, "_fail", None)
    if fail is not None:  # AbortOnFailure's: a collective's wait() failed

        def failed(*args):
            record("error", time.time(), time.time())
            fail(*args)

        pg._fail = failed
    allreduce = pg.allreduce

    def timed_allreduce(*args, **kwargs):
        start = time.time()
        work = allreduce(*args, **kwargs)
        work.get_future().add_done_callback(lambda _: record("allreduce", start, time.time()))
        return work

    pg.allreduce = timed_allreduce
    for name in ("wait_quorum", "should_commit", "report_error"):
        setattr(manager, name, _timed(getattr(manager, name), name, record))
    manager._client = _TimedClient(manager._client, record)


def _wait_for_file(path, limit):
    end = time.monotonic() + limit
    while path and not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)


def replica_main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--replica-id", type=int, required=True)
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--backend", default="ringx", choices=BACKENDS)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--step-sleep", type=float, default=0.05, help="seconds of 'compute' per step")
    p.add_argument("--hidden", type=int, default=32,
                   help="the model's hidden width: its gradients are about 84 bytes a unit")
    p.add_argument("--hold-at", type=int, default=-1,
                   help="before this step, wait (at most 60 s) until --hold-file exists: the launcher lets a "
                        "replacement start up before the others train on without it")
    p.add_argument("--hold-file", default="")
    p.add_argument("--start-file", default="",
                   help="wait (at most 120 s) until this file exists before the first step: the launcher starts "
                        "the replicas together once all have imported torch, so that none joins late by healing")
    p.add_argument("--die-at", type=int, default=-1,
                   help="SIGKILL this replica right after it committed this step or, if it healed past it, the "
                        "first step it commits after (the launcher's victim)")
    a = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn, optim
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    torch.manual_seed(42)
    model = nn.Sequential(nn.Linear(16, a.hidden), nn.ReLU(), nn.Linear(a.hidden, 4))
    inner = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    timeout = timedelta(seconds=a.timeout)
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=_process_group(a.backend, timeout), load_state_dict=load_state_dict,
                      state_dict=state_dict, min_replica_size=2, replica_id=f"replica{a.replica_id}",
                      store_addr="localhost", store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=a.lighthouse, timeout=timeout, quorum_timeout=timedelta(seconds=60),
                      connect_timeout=timedelta(seconds=30))
    ddp = DistributedDataParallel(manager, model)
    opt = OptimizerWrapper(manager, inner)
    progress = open(os.path.join(a.out, f"progress{a.replica_id}.txt"), "a", buffering=1)
    if os.environ.get("RINGX_RECOVERY_PHASES") == "1":
        _record_phases(manager, manager._pg, lambda name, start, end: progress.write(
            f"phase {name} {start} {end}\n"))
    progress.write(f"ready {time.time()}\n")
    _wait_for_file(a.start_file, 120)
    while manager.current_step() < a.steps:
        if manager.current_step() == a.hold_at:
            _wait_for_file(a.hold_file, 60)
        g = torch.Generator().manual_seed(1000 * a.replica_id + manager.current_step())
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        time.sleep(a.step_sleep)
        before = manager.current_step()
        opt.step()
        if manager.current_step() > before:
            progress.write(f"step {manager.current_step()} {time.time()} "
                           f"participants {manager.num_participants()}\n")
            if 0 <= a.die_at <= manager.current_step():
                progress.write(f"dying {time.time()} {manager.current_step()}\n")
                os.kill(os.getpid(), signal.SIGKILL)
    torch.save(state_dict(), os.path.join(a.out, f"replica{a.replica_id}.pt"))
    progress.write(f"done {time.time()}\n")
    manager.shutdown(wait=False)


# ----------------------------------------------------------------------------- launcher side


@dataclass
class Run:
    recovery_s: float  # from the kill to the survivors' first committed step after it
    step_s: float  # median time per committed step before the kill (the replica with the most)
    steps_after_kill: list  # (step, time, participants) of replica 0 without replica 2
    rejoined: list  # (step, time, participants) of the replacement
    phases: dict = None  # RINGX_RECOVERY_PHASES=1: recovery_phases() of the survivor that recovered first


# recovery_phases()'s keys, in the order they happen.
PHASES = ["error", "quorum", "configure", "create_pg", "configure_rest", "allreduce", "to_commit", "from_quorum",
          "recovery"]


def recovery_phases(out, replica, killed, kill_at):
    """Where a survivor's recovery went (replica_main's phase lines), in seconds:
    error: from the kill to its collective failing (None when none did: the
    victim had not joined the next quorum); quorum: from the kill to the quorum
    that drops the victim; configure: the process group's reconfiguration, of
    which create_pg (the new group) and configure_rest (the rest: the old
    group's abort, the store's client); allreduce: the new group's first; to_commit: from it to the step committed (0.05 s of it
    is the step's stand-in for compute); from_quorum: from the quorum to that
    step (the process group's share: the quorum waits on the lighthouse, whose
    ticks make it vary by up to 0.1 s from run to run); recovery: from the kill
    to that step."""
    lines = progress(out, replica)
    calls = [(p[1], float(p[2]), float(p[3])) for p in lines if p[0] == "phase"]

    def first(name, since, until=float("inf")):
        return next(((s, e) for n, s, e in calls if n == name and since <= s <= until), None)

    step = next(float(p[2]) for p in lines if p[0] == "step" and int(p[1]) > kill_at and float(p[2]) > killed)
    configure = first("configure", killed)
    if configure is None:
        return None
    error = first("error", killed)
    quorum_end = max(e for n, s, e in calls if n == "quorum" and e <= configure[0])
    create = first("create_pg", *configure)
    allreduce = first("allreduce", configure[1])
    return {"error": error and error[0] - killed, "quorum": quorum_end - killed,
            "configure": configure[1] - configure[0], "create_pg": create[1] - create[0],
            "configure_rest": configure[1] - configure[0] - (create[1] - create[0]),
            "allreduce": allreduce[1] - allreduce[0],
            "to_commit": step - allreduce[1], "from_quorum": step - quorum_end, "recovery": step - killed}


def progress(out, replica):
    path = os.path.join(out, f"progress{replica}.txt")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split() for line in f if line.strip()]


def steps(out, replica):
    return [(int(p[1]), float(p[2]), int(p[4])) for p in progress(out, replica) if p[0] == "step"]


def _start(replica, lighthouse, out, n_steps, backend, hold_at=-1, die_at=-1, model=()):
    log = open(os.path.join(out, f"replica{replica}.log"), "a")
    # One OpenMP thread each, as torchrun gives the workers it starts several of on a
    # host: otherwise every replica runs a spinning thread per core, and three
    # replicas' threads take the cores from one another.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--replica-id", str(replica),
                             "--lighthouse", lighthouse, "--steps", str(n_steps), "--out", out, "--backend", backend,
                             *model,
                             "--hold-at", str(hold_at), "--hold-file", os.path.join(out, "go"),
                             "--start-file", os.path.join(out, "start"), "--die-at", str(die_at)],
                            stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _wait(pred, limit, what, out, alive=()):
    """Until pred() holds; fails with the replicas' logs after `limit` seconds or
    as soon as a process in `alive` has ended."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if pred():
            return
        ended = [p for p in alive if p.poll() is not None]
        if ended:
            _fail(f"{what}: a replica exited (code {ended[0].returncode}) first", out)
        time.sleep(0.05)
    _fail(f"{what}: not within {limit} s", out)


def _fail(what, out):
    logs = ""
    for name in sorted(os.listdir(out)):
        if name.endswith(".log"):
            with open(os.path.join(out, name)) as f:
                logs += f"--- {name}\n{f.read()[-3000:]}\n"
    raise AssertionError(f"{what}\n{logs}")


def run_kill_and_heal(out, backend="ringx", n_steps=14, kill_at=4, hidden=32, step_sleep=0.05):
    """Three replicas, started together once all are up; replica 2 SIGKILLs itself
    once it committed `kill_at` (or the first step after it, had it sat out a quorum
    and healed past it); the survivors must commit two steps without it (2
    participants). Recovery is timed from the kill to the first of those, the step
    time over the steps up to the kill. The survivors then wait,
    at step kill_at + 4 or so, for a replacement to start up (torch's import takes
    seconds, a step a fraction of one); it heals from them and all three train to
    `n_steps`. `hidden` and `step_sleep` set the model's width and the seconds of
    stand-in compute per step. Raises AssertionError, with the replicas' logs, when
    any of that fails."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=500, heartbeat_timeout_ms=1000)
    procs = {}
    model = ("--hidden", str(hidden), "--step-sleep", str(step_sleep))
    try:
        hold_at = kill_at + 4
        for r in range(3):
            procs[r] = _start(r, lighthouse.address(), out, n_steps, backend, hold_at, kill_at if r == 2 else -1,
                              model)
        _wait(lambda: all(any(p[0] == "ready" for p in progress(out, r)) for r in range(3)), 120,
              "the three replicas to start up", out, alive=list(procs.values()))
        open(os.path.join(out, "start"), "w").close()
        _wait(lambda: procs[2].poll() is not None, 120, f"replica 2 to die after step {kill_at}", out,
              alive=[procs[0], procs[1]])
        dying = [(float(p[1]), int(p[2])) for p in progress(out, 2) if p[0] == "dying"]
        if procs[2].returncode != -signal.SIGKILL or not dying:
            _fail(f"replica 2 exited with {procs[2].returncode} before it got to die after step {kill_at}", out)
        killed, kill_at = dying[0]
        if kill_at > hold_at - 2:
            _fail(f"replica 2 first committed step {kill_at}, too late for two survivor steps before the "
                  f"hold at step {hold_at}", out)

        # Steps the survivors committed without replica 2 (a step it had already
        # joined when the kill landed may still commit after it, with three; and
        # the kill_at step of a survivor a little behind the victim may commit
        # after it with two, when one replica sat out that step's quorum).
        def after(r):
            return [s for s in steps(out, r) if s[0] > kill_at and s[1] > killed and s[2] == 2]

        _wait(lambda: all(len(after(r)) >= 2 for r in (0, 1)), 60, "two survivor steps without replica 2", out,
              alive=[procs[0], procs[1]])
        first_back = min((0, 1), key=lambda r: after(r)[0][1])
        recovery = after(first_back)[0][1] - killed
        phases = (recovery_phases(out, first_back, killed, kill_at)
                  if os.environ.get("RINGX_RECOVERY_PHASES") == "1" else None)
        # A replica that started late joins by healing and may have committed
        # none of the first steps: the step time is the one with the most.
        before = max(([t for s, t, _ in steps(out, r) if s <= kill_at] for r in range(3)), key=len)
        if len(before) < 2:
            _fail(f"no replica committed two steps up to step {kill_at}", out)
        step_s = statistics.median(b - a for a, b in zip(before, before[1:]))
        ready_before = sum(p[0] == "ready" for p in progress(out, 2))
        first_life = len(steps(out, 2))
        procs[2] = _start(2, lighthouse.address(), out, n_steps, backend, model=model)
        _wait(lambda: sum(p[0] == "ready" for p in progress(out, 2)) > ready_before, 60,
              "the replacement to start up", out)
        open(os.path.join(out, "go"), "w").close()
        for r in range(3):
            try:
                procs[r].wait(timeout=120)
            except subprocess.TimeoutExpired:
                _fail(f"replica {r} did not finish within 120 s", out)
            if procs[r].returncode != 0:
                _fail(f"replica {r} exited with {procs[r].returncode}", out)
        return Run(recovery, step_s, after(0), steps(out, 2)[first_life:], phases)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        lighthouse.shutdown()


if __name__ == "__main__":
    replica_main()
