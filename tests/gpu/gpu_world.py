"""Worlds of ranks on CUDA devices for tests/gpu.

`run(fn, **kwargs)` starts `world_size()` spawned processes (CUDA does not
survive fork), each with a torchrun-like environment, its device
`cuda:(rank % device_count)` made current, and a process group made by
`init_process_group(backend, device_id=...)`; every rank calls
`fn(**kwargs)`, which returns a list of problems found (strings), and `run`
returns all ranks' problems. A case checks its results on its own rank
against a reference computed on the CPU from inputs every rank can rebuild
(`make_input`), so nothing but strings crosses the process boundary.

RINGX_GPU_TEST_WORLD sets the world size (default: one rank per GPU when
there are several, else three ranks sharing the one GPU);
RINGX_GPU_TEST_TIMEOUT bounds a case in seconds (default 300). A rank that
does not answer in time has its stacks added to the problems: every Python
thread's (faulthandler, on SIGUSR1) and every native thread's (gdb or
cuda-gdb, whichever is on the PATH: the GPU machines have only cuda-gdb).
"""

import datetime
import faulthandler
import functools
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import traceback

import torch


@functools.cache
def skip_reason():
    """Why tests/gpu cannot run here, or None. Loads the extension: a CUDA
    build that cannot be imported fails here, skipped or not."""
    import ringx  # noqa: F401
    from ringx import _build_info

    if not _build_info.cuda:
        return ("ringx was built without CUDA: tests/gpu needs a CUDA build "
                "(RINGX_CUDA=on against a CUDA torch; see README, CUDA)")
    if not torch.cuda.is_available():
        return "no CUDA GPU here: tests/gpu needs one; see README, CUDA"
    return None


def world_size():
    if os.environ.get("RINGX_GPU_TEST_WORLD"):
        return int(os.environ["RINGX_GPU_TEST_WORLD"])
    n = torch.cuda.device_count()
    return n if n > 1 else 3


def device():
    return torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())


def make_input(seed, rank, dtype, count, device="cpu", low=-4, high=5):
    """Deterministic values for (seed, rank), exact in every dtype used here."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == torch.bool:
        t = torch.randint(0, 2, (count,), generator=g).bool()
    elif dtype == torch.uint8:
        t = torch.randint(0, high, (count,), generator=g).to(dtype)
    else:
        t = torch.randint(low, high, (count,), generator=g).to(dtype)
    return t.to(device)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, size, port, backend, env, module, name, kwargs, conn, stacks_path):
    stacks = open(stacks_path, "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size), **env)
    try:
        import importlib

        import torch.distributed as dist

        import ringx  # noqa: F401 - registers the backend

        torch.cuda.set_device(device())
        dist.init_process_group(backend, rank=rank, world_size=size, device_id=device(),
                                timeout=datetime.timedelta(seconds=120))
        fn = getattr(importlib.import_module(module), name)
        problems = list(fn(**kwargs))
        dist.destroy_process_group()
        conn.send(problems)
    except BaseException:  # noqa: BLE001 - every failure goes back to the test as text
        conn.send([f"rank {rank} raised:\n{traceback.format_exc()}"])
    finally:
        conn.close()


def run(fn, backend="ringx", size=None, env=None, **kwargs):
    """Every rank's problems, as 'rank R: ...' strings; empty when all passed.
    `env`: RINGX_* settings for the ranks (the data path, blocking wait)."""
    size = size or world_size()
    timeout = float(os.environ.get("RINGX_GPU_TEST_TIMEOUT", "300"))
    ctx = mp.get_context("spawn")
    port = _free_port()
    pipes, procs = [], []
    stacks_dir = tempfile.TemporaryDirectory(prefix="ringx-gpu-stacks-")
    stacks = [os.path.join(stacks_dir.name, f"rank{rank}.txt") for rank in range(size)]
    for rank in range(size):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_rank_main, args=(rank, size, port, backend, env or {}, fn.__module__, fn.__name__,
                                                 kwargs, child, stacks[rank]))
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    problems = []
    try:
        for rank, conn in enumerate(pipes):
            if not conn.poll(timeout):
                problems.append(f"rank {rank}: no answer within {timeout:g} s")
                problems += _stacks_of_live_ranks(procs, stacks)
                break
            try:
                problems += [f"rank {rank}: {p}" for p in conn.recv()]
            except EOFError:
                problems.append(f"rank {rank}: died (exit code {procs[rank].exitcode})")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        stacks_dir.cleanup()
    return problems


def _stacks_of_live_ranks(procs, stacks):
    """Every live rank's Python and native stacks, as problems, so that a
    hang on a lent machine says where each rank was."""
    live = [(rank, p) for rank, p in enumerate(procs) if p.is_alive()]
    for _, p in live:
        os.kill(p.pid, signal.SIGUSR1)
    debugger = shutil.which("gdb") or shutil.which("cuda-gdb")
    native = {}
    if debugger:
        cmd = [debugger, "-batch", "-nx", "-ex", "set pagination off", "-ex", "thread apply all bt 30", "-p"]
        running = {rank: subprocess.Popen(cmd + [str(p.pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True) for rank, p in live}
        for rank, d in running.items():
            try:
                out, _ = d.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                d.kill()
                out, _ = d.communicate()
            native[rank] = "\n".join(line for line in out.splitlines()
                                     if line.startswith(("Thread ", "#")))
    else:
        time.sleep(1)
    found = []
    for rank, _ in live:
        with open(stacks[rank]) as f:
            found.append(f"rank {rank}: Python stacks:\n{f.read()}")
        if debugger:
            found.append(f"rank {rank}: native stacks ({os.path.basename(debugger)}):\n{native[rank]}")
    return found
