"""Persistent multi-process worlds for the ringx pytest suite.

Starting a process group costs seconds on our 2-core machines (mostly `import torch`),
so the suite keeps one world of N worker processes per world size alive and sends it
many test cases.

How it works
------------
* Workers are forked from a multiprocessing *forkserver* that has imported torch once
  (so a world of 8 starts in about a second, not 8 torch imports).  Each worker gets a
  torchrun-like environment (MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>, RANK,
  WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, OMP_NUM_THREADS=1), redirects its
  stdout/stderr to a per-rank log file, does `import ringx` when the backend is
  "ringx", calls `init_process_group(backend, timeout=...)` and then serves cases.
* A case is a plain function in an importable module under tests/python (by
  convention `cases_*.py`).  `World.run(fn, **kwargs)` sends (module:qualname, kwargs)
  to every rank over a pipe; every rank calls `fn(**kwargs)` (it finds its rank with
  `dist.get_rank()`), and the picklable return values come back as a list indexed by
  rank.  The parent waits for every rank before sending the next case, so cases never
  overlap.
* If any rank raises, `CaseFailed` is raised with every rank's traceback.  If a rank
  does not answer within the bound (RINGX_TEST_CASE_TIMEOUT, default 60 s, or
  `run(..., timeout=)`), `CaseTimeout`; if a rank dies, `CaseCrashed` (with exit
  status and the rank's log output since the case started).  In all three cases the
  world is killed and the next `run` starts a fresh one, so one bad case cannot
  poison the next.
* Workers die with the test session: the pool closes them at session end (and from an
  atexit hook), and every worker sets PR_SET_PDEATHSIG so that even a SIGKILLed pytest
  leaves no orphans (forkserver exits when pytest does; workers follow it).

Adding a test
-------------
1. Write the per-rank body in a `cases_*.py` module::

       def my_case(seed, count):
           x = refs.make_input(seed, dist.get_rank(), "float32", count)
           dist.all_reduce(x)
           return x

   Catch expected exceptions inside the case and return them as data (an uncaught
   exception tears the world down, which costs a restart).
2. In a `test_*.py`, take the session fixture `worlds` and do
   `results = worlds.run(world_size, cases_x.my_case, seed=1, count=7)`, then compare
   each rank's result with a reference computed in the parent (see refs.py).
   Batch several collectives into one case when the test is cheap; a round trip costs
   a few milliseconds.

Knobs: RINGX_TEST_BACKEND (default "ringx"), RINGX_TEST_CASE_TIMEOUT (60),
RINGX_TEST_START_TIMEOUT (120), RINGX_TEST_PG_TIMEOUT (init_process_group timeout, 45),
RINGX_TEST_MAX_TIMEOUTS (after this many timed-out cases the pool fails further cases
at once instead of spending the bound on each, 3), RINGX_TEST_KEEP_LOGS=1 (keep worker
logs; their directory is printed at the end).
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import multiprocessing.connection as mpc
import os
import signal
import sys
import tempfile
import shutil
import time
import traceback
import weakref

from ports import free_port

BACKEND = os.environ.get("RINGX_TEST_BACKEND", "ringx")


def _env_float(name, default):
    v = os.environ.get(name)
    return float(v) if v else float(default)


CASE_TIMEOUT = _env_float("RINGX_TEST_CASE_TIMEOUT", 60)
START_TIMEOUT = _env_float("RINGX_TEST_START_TIMEOUT", 120)
PG_TIMEOUT = _env_float("RINGX_TEST_PG_TIMEOUT", 45)
MAX_TIMEOUTS = int(_env_float("RINGX_TEST_MAX_TIMEOUTS", 3))
# After one rank died, how long the others get to report (their errors say why).
CRASH_GRACE = 5.0
LOG_TAIL_CHARS = 4000


class CaseFailed(AssertionError):
    """A case raised on some rank, or the world could not be started."""


class CaseTimeout(CaseFailed):
    """Some rank did not answer within the bound."""


class CaseCrashed(CaseFailed):
    """Some rank's process died."""


def case_name(fn) -> str:
    mod = fn.__module__
    if mod in ("__main__", "__mp_main__"):
        raise ValueError(f"case {fn.__qualname__} must live in an importable module")
    return f"{mod}:{fn.__qualname__}"


def resolve(name: str):
    mod, _, qual = name.partition(":")
    obj = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------- worker


def _set_pdeathsig():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # not Linux: the pipe EOF still ends an idle worker
        pass


def take_over_process(env, log_path):
    """In a child of the forkserver: stdout and stderr to log_path, line by line, and
    env in place of the forkserver's environment."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except Exception:
            pass
    os.environ.clear()
    os.environ.update(env)


def _worker_main(rank, world_size, env, conn, log_path):
    """Entry point of one worker process (runs in a child of the forkserver)."""
    _set_pdeathsig()
    if os.getppid() == 1:  # parent already gone
        os._exit(1)
    take_over_process(env, log_path)
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    print(f"[harness] rank {rank}/{world_size} pid {os.getpid()} starting", flush=True)
    try:
        import datetime

        import torch

        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        import torch.distributed as dist

        backend = env["RINGX_TEST_BACKEND"]
        if backend == "ringx":
            import ringx  # noqa: F401  (registers the backend)
        dist.init_process_group(
            backend, timeout=datetime.timedelta(seconds=float(env["RINGX_TEST_PG_TIMEOUT"]))
        )
    except BaseException as e:
        tb = traceback.format_exc()
        print(tb, flush=True)
        try:
            conn.send(("err", 0, f"{type(e).__name__}: {e}", tb))
        finally:
            os._exit(3)
    conn.send(("ready", 0, os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "exit":
            break
        _, seq, name, kwargs = msg
        try:
            value = resolve(name)(**kwargs)
            reply = ("ok", seq, value)
        except BaseException as e:  # report everything, including SystemExit
            reply = ("err", seq, f"{type(e).__name__}: {e}", traceback.format_exc())
        try:
            conn.send(reply)
        except Exception as e:
            conn.send(("err", seq, f"could not send the result: {type(e).__name__}: {e}",
                       traceback.format_exc()))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# --------------------------------------------------------------------------- parent

_CTX = None
_CTX_ENV = {}


def _mp_context():
    """A forkserver context whose server has imported torch once."""
    global _CTX, _CTX_ENV
    if _CTX is None:
        import multiprocessing.forkserver as fs

        ctx = multiprocessing.get_context("forkserver")
        # torch._dynamo too: torch.optim's optimizers import it on their first
        # construction, 1.6 s of CPU in every worker that builds one.
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "forkserver_gc_freeze"])
        saved = dict(os.environ)
        # The forkserver must not start thread pools before it forks, and must not
        # autoload backends: the workers import ringx themselves.
        os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                          TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        try:
            fs.ensure_running()
            _CTX_ENV = dict(os.environ)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _CTX = ctx
    return _CTX


def fork_env():
    """The environment torch's import saw in the forkserver (started if need be)."""
    _mp_context()
    return _CTX_ENV


def fork(target, args, name):
    """Starts target(*args) in a child of the forkserver (torch already imported there)."""
    p = _mp_context().Process(target=target, args=args, name=name, daemon=True)
    p.start()
    return p


_LIVE = weakref.WeakSet()


def shutdown_forkserver():
    """Stop (and reap) the forkserver once no world is alive; a later start makes a new one."""
    global _CTX
    if _CTX is None or any(w.alive for w in list(_LIVE)):
        return
    import multiprocessing.forkserver as fs

    import multiprocessing.resource_tracker as rt

    # Private helpers of CPython 3.8+: they close the helper's "alive" pipe and reap it,
    # so no zombie is left behind (our containers' pid 1 does not reap).
    for helper in (fs._forkserver, rt._resource_tracker):
        stop = getattr(helper, "_stop", None)
        if stop is not None:
            try:
                stop()
            except Exception:
                pass
    _CTX = None


_LOG_DIRS = []  # temporary log directories to remove at exit


@atexit.register
def _kill_all_live():
    for w in list(_LIVE):
        w.kill()
    shutdown_forkserver()
    if os.environ.get("RINGX_TEST_KEEP_LOGS") != "1":
        for d in _LOG_DIRS:
            shutil.rmtree(d, ignore_errors=True)


def _describe_exit(code) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _short(obj, n=300) -> str:
    s = repr(obj)
    return s if len(s) <= n else s[: n - 3] + "..."


class World:
    """N worker processes with an initialised default process group."""

    def __init__(self, size, backend=BACKEND, *, case_timeout=CASE_TIMEOUT,
                 start_timeout=START_TIMEOUT, pg_timeout=PG_TIMEOUT, log_dir=None, env=None):
        self.size = size
        self.extra_env = dict(env or {})
        self.backend = backend
        self.case_timeout = case_timeout
        self.start_timeout = start_timeout
        self.pg_timeout = pg_timeout
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix=f"ringx-world{size}-")
        if self._own_log_dir:
            _LOG_DIRS.append(self.log_dir)
        self.procs = []
        self.conns = []
        self.logs = []
        self.generation = 0  # number of starts so far
        self.unclean_exits = []
        self._seq = 0
        _LIVE.add(self)

    # -- lifecycle

    @property
    def alive(self) -> bool:
        return bool(self.procs)

    def start(self):
        """Start the world (retrying once: the free port may have been taken)."""
        __tracebackhide__ = True
        if self.alive:
            return
        try:
            self._start_once()
        except CaseTimeout:
            raise
        except CaseFailed as first:
            try:
                self._start_once()
            except CaseFailed as second:
                raise CaseFailed(f"{second}\n(a first attempt, on another port, failed too)") from None

    def _start_once(self):
        ctx = _mp_context()
        self.generation += 1
        port = free_port()
        base_env = dict(os.environ)
        base_env.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(self.size),
            LOCAL_WORLD_SIZE=str(self.size), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
            ROLE_WORLD_SIZE=str(self.size), OMP_NUM_THREADS="1",
            RINGX_TEST_BACKEND=self.backend, RINGX_TEST_PG_TIMEOUT=str(self.pg_timeout),
        )
        base_env.update(self.extra_env)
        procs, conns, logs = [], [], []
        try:
            for rank in range(self.size):
                env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
                log = os.path.join(self.log_dir, f"gen{self.generation}-rank{rank}.log")
                parent_end, child_end = ctx.Pipe(duplex=True)
                p = ctx.Process(target=_worker_main, args=(rank, self.size, env, child_end, log),
                                name=f"ringx-test-w{self.size}-r{rank}", daemon=True)
                p.start()
                child_end.close()
                procs.append(p)
                conns.append(parent_end)
                logs.append(log)
        except BaseException:
            for p in procs:
                p.kill()
            raise
        self.procs, self.conns, self.logs = procs, conns, logs
        replies, pending, dead = self._collect(self.start_timeout, [0] * self.size)
        bad = pending or dead or any(r[0] != "ready" for r in replies if r is not None)
        if bad:
            report = self._report(f"starting a world of {self.size} ({self.backend}, "
                                  f"port {port})", replies, pending, dead, self.start_timeout,
                                  [0] * self.size)
            self.kill()
            cls = CaseTimeout if pending and not dead else CaseFailed
            raise cls(report)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def log_text(self, rank, since=0) -> str:
        """What rank `rank` has written so far (all of its starts), from offset `since`
        (a value of log_sizes()) on."""
        with open(self.logs[rank], errors="replace") as f:
            f.seek(since)
            return f.read()

    def log_sizes(self) -> list:
        """Each rank's log length now: log_text(rank, since=...) reads what follows."""
        return [self._log_size(r) for r in range(self.size)] if self.alive else [0] * self.size

    def close(self, grace=10.0):
        """Ask the workers to exit (destroying the process group); kill stragglers."""
        if not self.alive:
            return
        for c in self.conns:
            try:
                c.send(("exit",))
            except Exception:
                pass
        deadline = time.monotonic() + grace
        for rank, p in enumerate(self.procs):
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode != 0:
                self.unclean_exits.append(
                    f"world {self.size} rank {rank}: {_describe_exit(p.exitcode)} at shutdown "
                    f"(log {self.logs[rank]})")
        self.kill()
        if self._own_log_dir and os.environ.get("RINGX_TEST_KEEP_LOGS") != "1":
            self.cleanup_logs()

    def kill(self):
        for p in self.procs:
            if p.exitcode is None:
                try:
                    p.kill()
                except Exception:
                    pass
        for p in self.procs:
            p.join(5)
            try:
                p.close()
            except Exception:
                pass
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []

    def cleanup_logs(self):
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    # -- running cases

    def run(self, fn, *, timeout=None, **kwargs):
        """Run fn(**kwargs) on every rank; return the list of per-rank results."""
        __tracebackhide__ = True
        name = fn if isinstance(fn, str) else case_name(fn)
        self.start()
        timeout = self.case_timeout if timeout is None else timeout
        self._seq += 1
        seq = self._seq
        offsets = [self._log_size(r) for r in range(self.size)]
        dead = {}
        for rank, c in enumerate(self.conns):
            try:
                c.send(("call", seq, name, kwargs))
            except (BrokenPipeError, ConnectionResetError, OSError) as e:
                dead[rank] = f"could not send the case: {e}"
        replies, pending, dead2 = self._collect(timeout, offsets, already_dead=dead)
        errors = [r for r in replies if r is not None and r[0] != "ok"]
        if pending or dead2 or errors:
            what = f"case {name}({_short(kwargs)}) on a world of {self.size} ({self.backend})"
            report = self._report(what, replies, pending, dead2, timeout, offsets)
            self.kill()
            if dead2:
                raise CaseCrashed(report)
            if pending:
                raise CaseTimeout(report)
            raise CaseFailed(report)
        return [r[2] for r in replies]

    def _log_size(self, rank):
        try:
            return os.path.getsize(self.logs[rank])
        except OSError:
            return 0

    def _log_since(self, rank, offset):
        try:
            with open(self.logs[rank], "rb") as f:
                f.seek(offset)
                data = f.read().decode(errors="replace")
        except OSError as e:
            return f"<no log: {e}>"
        if len(data) > LOG_TAIL_CHARS:
            data = "..." + data[-LOG_TAIL_CHARS:]
        return data

    def _collect(self, timeout, offsets, already_dead=None):
        """Wait for one message per rank.  Returns (replies, pending ranks, dead {rank: why})."""
        n = self.size
        replies = [None] * n
        dead = dict(already_dead or {})
        pending = set(range(n)) - set(dead)
        deadline = time.monotonic() + timeout
        if dead:
            deadline = min(deadline, time.monotonic() + CRASH_GRACE)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waitables = {}
            for r in pending:
                waitables[self.conns[r]] = r
                waitables[self.procs[r].sentinel] = r
            ready = mpc.wait(list(waitables), remaining)
            for obj in ready:
                r = waitables[obj]
                if r not in pending:
                    continue
                conn = self.conns[r]
                try:
                    if conn.poll():
                        replies[r] = conn.recv()
                        pending.discard(r)
                        continue
                except (EOFError, OSError):
                    pass
                # no message and either EOF or the process ended
                p = self.procs[r]
                p.join(1.0)
                dead[r] = _describe_exit(p.exitcode)
                pending.discard(r)
                deadline = min(deadline, time.monotonic() + CRASH_GRACE)
        return replies, sorted(pending), dead

    def _report(self, what, replies, pending, dead, timeout, offsets) -> str:
        lines = [f"{what}:"]
        groups = {}  # identical error text -> ranks
        for r, rep in enumerate(replies):
            if rep is not None and rep[0] == "err":
                groups.setdefault((rep[2], rep[3]), []).append(r)
        for (summary, tb), ranks in groups.items():
            lines.append(f"  rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)} raised {summary}")
            lines.append(_indent(tb.rstrip(), 6))
        ok = [r for r, rep in enumerate(replies) if rep is not None and rep[0] != "err"]
        if ok and (groups or pending or dead):
            lines.append(f"  rank{'s' if len(ok) > 1 else ''} {_ranks(ok)} answered normally")
        for r, why in sorted(dead.items()):
            lines.append(f"  rank {r} died ({why}); its output since the case started:")
            lines.append(_indent(self._log_since(r, offsets[r]).rstrip() or "<empty>", 6))
        if pending:
            lines.append(f"  rank{'s' if len(pending) > 1 else ''} {_ranks(pending)} did not answer "
                         f"within {timeout:g} s" + (" (after another rank died)" if dead else ""))
            for r in pending:
                out = self._log_since(r, offsets[r]).rstrip()
                if out:
                    lines.append(f"    rank {r} output since the case started:")
                    lines.append(_indent(out, 6))
        lines.append(f"  (the world was killed; the next case starts a fresh one. logs: {self.log_dir})")
        return "\n".join(lines)


def _ranks(ranks) -> str:
    return ",".join(str(r) for r in ranks)


def _indent(text, n) -> str:
    pad = " " * n
    return "\n".join(pad + line for line in text.splitlines())


class WorldPool:
    """Lazily started worlds keyed by size, shared by a whole test session."""

    def __init__(self, backend=BACKEND, *, max_live_ranks=24, max_timeouts=MAX_TIMEOUTS):
        self.backend = backend
        self.max_live_ranks = max_live_ranks
        self.max_timeouts = max_timeouts
        self.timeouts = 0
        self.log_dir = tempfile.mkdtemp(prefix="ringx-test-logs-")
        _LOG_DIRS.append(self.log_dir)
        self.worlds = {}  # size -> World (insertion order = least recently used first)
        self.start_errors = {}  # size -> message of a start that failed twice
        self.unclean_exits = []

    def get(self, size) -> World:
        w = self.worlds.pop(size, None)
        if w is None:
            d = os.path.join(self.log_dir, f"world{size}")
            os.makedirs(d, exist_ok=True)
            w = World(size, self.backend, log_dir=d)
        self.worlds[size] = w  # most recently used last
        # Keep at most max_live_ranks worker processes: close least recently used worlds.
        need = 0 if w.alive else size
        live = sum(x.size for x in self.worlds.values() if x.alive)
        for other in list(self.worlds.values()):
            if live + need <= self.max_live_ranks:
                break
            if other is w or not other.alive:
                continue
            other.close()
            self.unclean_exits += other.unclean_exits
            other.unclean_exits = []
            live -= other.size
        return w

    def run(self, size, fn, *, timeout=None, **kwargs):
        """Run fn(**kwargs) on every rank of the world of `size`; per-rank results."""
        __tracebackhide__ = True
        if size in self.start_errors:
            raise CaseFailed(f"the world of {size} failed to start earlier in this session:\n"
                             f"{self.start_errors[size]}")
        if self.timeouts >= self.max_timeouts:
            raise CaseTimeout(f"not run: {self.timeouts} earlier cases timed out (or failed only "
                              f"after the process-group timeout) in this session "
                              f"(RINGX_TEST_MAX_TIMEOUTS={self.max_timeouts}); fix those first")
        w = self.get(size)
        if not w.alive:
            try:
                w.start()
            except CaseFailed as e:
                if isinstance(e, CaseTimeout):
                    self.timeouts += 1
                self.start_errors[size] = str(e)
                raise
        t0 = time.monotonic()
        try:
            return w.run(fn, timeout=timeout, **kwargs)
        except CaseTimeout:
            self.timeouts += 1
            raise
        except CaseFailed:
            # A backend that reports its own timeout (after PG_TIMEOUT) costs as much as a
            # hang: count it too, so a systematic hang cannot make the suite take hours.
            if time.monotonic() - t0 >= 0.9 * min(w.pg_timeout, w.case_timeout):
                self.timeouts += 1
            raise

    def close(self):
        for w in self.worlds.values():
            w.close()
            self.unclean_exits += w.unclean_exits
        self.worlds.clear()
        shutdown_forkserver()
        if os.environ.get("RINGX_TEST_KEEP_LOGS") != "1":
            shutil.rmtree(self.log_dir, ignore_errors=True)
