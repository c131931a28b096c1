"""Shared by the fault scripts (rank side) and tests/python/test_faults.py (launcher side).

Fault-injection tests kill, stop or desynchronise ranks, which the persistent worlds
of harness.py cannot survive, so every scenario is a standalone script started as
WORLD_SIZE fresh processes with a torchrun-like environment (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Rank side
---------
``setup(timeout_s)`` imports ringx and calls ``init_process_group("ringx", timeout=)``.
``record(event, **fields)`` appends one JSON line to ``$FAULT_OUT/rank<R>.jsonl`` and
flushes it, so what a rank recorded survives its own death.  ``attempt(label, fn)``
runs ``fn()`` and records either success or the exception's type and text together
with when it started and ended (``time.time()``: the ranks share one clock, so the
launcher can subtract a victim's time of death from a survivor's time of error).

Launcher side
-------------
``launch(script, world_size, args, timeout)`` starts the ranks in their own sessions,
waits for all of them to exit (at most ``timeout`` seconds), then SIGCONTs and SIGKILLs
whatever is left, and returns one ``RankResult`` per rank: exit code, records and log.
A rank is forked from harness.py's forkserver, which has imported torch, and made into
what ``python script args`` would be; an environment torch reads at import that differs
from the forkserver's, gdb (RINGX_FAULT_GDB=1), or a script about the interpreter's exit
gets a fresh interpreter instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from ports import free_port  # noqa: E402  (tests/python/ports.py)

# ----------------------------------------------------------------------------- rank side

_OUT = None


def _die_with_parent():
    """A rank dies with its launcher (even a SIGKILLed pytest leaves no orphans)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass


def _rank_side_start():
    _die_with_parent()
    if os.environ.get("FAULT_DUMP_AFTER"):
        # A rank still running when the launcher is about to give up prints every
        # thread's Python stack into its log (shown in the failure report).
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["FAULT_DUMP_AFTER"]), repeat=True)


if "FAULT_OUT" in os.environ and "RANK" in os.environ:
    _rank_side_start()


def rank() -> int:
    return int(os.environ["RANK"])


def world_size() -> int:
    return int(os.environ["WORLD_SIZE"])


def record(event: str, **fields):
    global _OUT
    if _OUT is None:
        path = os.path.join(os.environ["FAULT_OUT"], f"rank{rank()}.jsonl")
        _OUT = open(path, "a", buffering=1)
    fields.update(event=event, rank=rank(), t=time.time())
    _OUT.write(json.dumps(fields) + "\n")
    _OUT.flush()
    os.fsync(_OUT.fileno())


def setup(timeout_s: float, backend: str = "ringx"):
    """init_process_group on the ringx backend with a group timeout of timeout_s."""
    import datetime

    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    if backend == "ringx":
        import ringx  # noqa: F401
    # Start-up (import torch) can take seconds longer on one rank than another on a
    # loaded machine; the group's first store waits are bounded by timeout_s, so let
    # every rank get here before any of them starts to wait.
    file_barrier("setup", range(world_size()), timeout=120)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    record("up", pid=os.getpid())
    return dist


def describe(e: BaseException) -> dict:
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "msg": str(e)}


def attempt(label: str, fn, **extra):
    """Runs fn(); records {label, ok, type, msg, start, end}; returns the exception or None."""
    start = time.time()
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - everything is data here
        record("result", label=label, ok=False, start=start, end=time.time(), **describe(e), **extra)
        return e
    record("result", label=label, ok=True, start=start, end=time.time(), **extra)
    return None


def snapshot():
    """This process's thread and fd counts, and what they are."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":")[0] if ":" in target else ("file" if target.startswith("/") else target)
        fds[kind] = fds.get(kind, 0) + 1
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return {"threads": sum(names.values()), "fds": sum(fds.values()), "fd_kinds": fds, "thread_names": names}


def file_barrier(name: str, ranks, timeout: float):
    """Waits (at most `timeout` s) until every rank in `ranks` has reached this point;
    works without the process group (which may have failed).  Returns whether all did."""
    out = os.environ["FAULT_OUT"]
    open(os.path.join(out, f"barrier-{name}-{rank()}"), "w").close()
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(os.path.exists(os.path.join(out, f"barrier-{name}-{r}")) for r in ranks):
            return True
        time.sleep(0.02)
    record("file_barrier_timeout", name=name)
    return False


def finish(dist=None, destroy=True):
    """Records how long destroy_process_group takes, then exits without atexit surprises."""
    if dist is not None and destroy:
        t0 = time.time()
        try:
            dist.destroy_process_group()
            record("destroyed", seconds=time.time() - t0)
        except BaseException as e:  # noqa: BLE001
            record("destroy_failed", seconds=time.time() - t0, **describe(e))
    record("done")
    sys.stdout.flush()
    sys.stderr.flush()


def main(body):
    """Runs body(); an unexpected exception is recorded (and the rank exits 1)."""
    try:
        body()
    except BaseException as e:  # noqa: BLE001
        record("crashed", tb=traceback.format_exc(), **describe(e))
        raise


# ------------------------------------------------------------------------- launcher side


@dataclass
class RankResult:
    rank: int
    returncode: int | None  # None: still running at the deadline (then killed)
    records: list = field(default_factory=list)
    log: str = ""
    exit_time: float | None = None

    def results(self, label=None):
        return [r for r in self.records if r["event"] == "result" and (label is None or r["label"] == label)]

    def result(self, label):
        found = self.results(label)
        assert len(found) == 1, f"rank {self.rank}: {len(found)} results labelled {label!r}\n{self.describe()}"
        return found[0]

    def event(self, name):
        found = [r for r in self.records if r["event"] == name]
        return found[-1] if found else None

    def describe(self) -> str:
        lines = [f"--- rank {self.rank}: exit {self.returncode}"]
        lines += [json.dumps(r)[:600] for r in self.records]
        lines.append("--- log tail:")
        lines.append(self.log[-3000:])
        return "\n".join(lines)


class Launch:
    """The outcome of one launch: per-rank results plus a text report for assertion messages."""

    def __init__(self, ranks, wall):
        self.ranks = ranks
        self.wall = wall

    def __getitem__(self, r) -> RankResult:
        return self.ranks[r]

    def __iter__(self):
        return iter(self.ranks)

    def report(self) -> str:
        return f"launch took {self.wall:.1f} s\n" + "\n".join(r.describe() for r in self.ranks)


def base_env(extra=None) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONUNBUFFERED="1")
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    if extra:
        env.update(extra)
    return env


def launch(script: str, world_size: int, args=(), *, timeout: float = 90.0, env=None,
           keep_dir=None, wait_for=None) -> Launch:
    """Starts `script` as world_size ranks and waits for them (see the module docstring);
    with `wait_for`, only for those ranks (a stopped rank never exits by itself)."""
    out = keep_dir or tempfile.mkdtemp(prefix="ringx-fault-")
    port = free_port()
    procs, logs = [], []
    t0 = time.time()
    try:
        for r in range(world_size):
            e = base_env(env)
            e.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world_size),
                     LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", ROLE_RANK=str(r),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FAULT_OUT=out,
                     FAULT_DUMP_AFTER=str(max(5.0, timeout - 10)))
            log_path = os.path.join(out, f"rank{r}.log")
            log = open(log_path, "wb")
            logs.append(log)
            procs.append(_start_rank(os.path.join(HERE, script), [str(a) for a in args], e, log, log_path))
        deadline = t0 + timeout
        exit_times = [None] * world_size
        awaited = [procs[r] for r in (range(world_size) if wait_for is None else wait_for)]
        while time.time() < deadline and any(p.poll() is None for p in awaited):
            for r, p in enumerate(procs):
                if exit_times[r] is None and p.poll() is not None:
                    exit_times[r] = time.time()
            time.sleep(0.05)
        for r, p in enumerate(procs):
            if exit_times[r] is None and p.poll() is not None:
                exit_times[r] = time.time()
        codes = [p.poll() for p in procs]
    finally:
        for p in procs:
            _kill_session(p)
        for log in logs:
            log.close()
    results = []
    for r in range(world_size):
        recs = []
        path = os.path.join(out, f"rank{r}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        pass
        with open(os.path.join(out, f"rank{r}.log"), errors="replace") as f:
            text = f.read()
        results.append(RankResult(r, codes[r], recs, text, exit_times[r]))
    if keep_dir is None:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    return Launch(results, time.time() - t0)


# What torch (or the C runtime under it) reads when it is imported: a rank whose
# environment differs there from the forkserver's must be a fresh interpreter.
_READ_AT_IMPORT = ("LD_", "PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GLOG_", "TORCH_",
                   "ASAN_", "UBSAN_", "LSAN_", "TSAN_", "CUDA_", "MALLOC_")
# Read again by _forked_rank, or only by a fresh interpreter's sys.path set-up.
_RESET_AFTER_FORK = {"PYTHONPATH", "PYTHONUNBUFFERED", "TORCH_DISTRIBUTED_DEBUG"}
# Scripts about the interpreter's own exit, which a forked rank does not go through
# (it runs the atexit hooks, then _exit()s).
_FRESH_SCRIPTS = {"exit_release.py"}


def _start_rank(path, args, env, log, log_path):
    """A rank forked from the test suite's forkserver, which has imported torch once
    (each fresh interpreter costs about 3 s of CPU to import it), unless the rank
    needs an interpreter of its own."""
    if not _debugger() and os.path.basename(path) not in _FRESH_SCRIPTS:
        import harness  # launcher side only: tests/python is on sys.path there

        ctx_env = harness.fork_env()
        if all(
                env.get(k) == ctx_env.get(k) for k in set(env) | set(ctx_env)
                if k.startswith(_READ_AT_IMPORT) and k not in _RESET_AFTER_FORK):
            p = harness.fork(_forked_rank, (path, args, env, log_path), os.path.basename(path))
            return _ForkedRank(p)
    return subprocess.Popen([*_debugger(), sys.executable, path, *args], env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


class _ForkedRank:
    """The part of subprocess.Popen the launcher uses, for a forked rank."""

    def __init__(self, process):
        self._process = process
        self.pid = process.pid

    def poll(self):
        return self._process.exitcode

    def wait(self, timeout):
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self._process.name, timeout)
        return self._process.exitcode


def _forked_rank(path, args, env, log_path):
    """Runs in the forked child: becomes what `python path args` with env would be."""
    import atexit
    import runpy

    import harness

    os.setsid()
    harness.take_over_process(env, log_path)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.argv = [path, *args]
    extra = [os.path.dirname(path), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    sys.path[:0] = [d for d in extra if d not in sys.path]
    import torch.distributed as dist

    dist.set_debug_level_from_env()
    _rank_side_start()
    code = 0
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as the interpreter would: print it, exit 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _debugger():
    """RINGX_FAULT_GDB=1 runs every rank under gdb and logs all threads' stacks on a crash."""
    if os.environ.get("RINGX_FAULT_GDB") != "1":
        return []
    return ["gdb", "-q", "-batch", "-ex", "set pagination off", "-ex", "handle SIGPIPE nostop noprint",
            "-ex", "run", "-ex", "thread apply all bt 30", "--args"]


def _kill_session(p: subprocess.Popen):
    """SIGCONT (a stopped rank cannot die otherwise... it can, but be sure) and SIGKILL
    the rank's whole session, then reap it."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        # A forked rank may not have made its session yet: signal it by pid too.
        for kill in (os.killpg, os.kill):
            try:
                kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
