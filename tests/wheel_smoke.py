"""Smoke test of an installed ringx wheel (run by `make wheel-test`).

Run it with the python of a venv the wheel was installed into, from a directory
outside the repository, so that `import ringx` finds the installed package and
not python/ringx. It starts a world of 2 processes twice:

1. `import ringx`, then init_process_group("ringx"), all_reduce, check the sum;
2. without importing ringx: the `torch.backends` entry point in the wheel's
   metadata must register the backend when torch is imported;

then runs `python -m ringx`, which must name the installed ringx, the torch it was
built for (the torch in this venv, which the wheel's metadata must require exactly)
and the UCX library it found.

Prints "wheel smoke: ok" and exits 0, or says what failed and exits non-zero.
A hung rank fails the test after --timeout seconds.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import time

WORLD = 2


def child(args):
    rank = int(os.environ["RANK"])
    if args.import_ringx and args.backend == "ringx":
        # Before torch, as users write it: torch's import then autoloads ringx
        # through the entry point while ringx is still half imported.
        import ringx  # noqa: F401
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        assert dist.get_backend() == args.backend, dist.get_backend()
        world = dist.get_world_size()
        expect = world * (world + 1) / 2
        for n in (1, 1003):
            t = torch.full((n,), float(rank + 1))
            dist.all_reduce(t)
            assert torch.all(t == expect), f"all_reduce of {n} gave {t[:4].tolist()}..., want {expect}"
        t = torch.full((257,), float(rank + 1))
        dist.all_reduce(t, async_op=True).wait()
        assert torch.all(t == expect), f"async all_reduce gave {t[:4].tolist()}..., want {expect}"
        if rank == 0 and args.backend == "ringx":
            ringx = sys.modules.get("ringx")
            assert ringx is not None, "backend ringx worked but no module ringx is loaded"
            print(f"  ringx loaded from {os.path.dirname(ringx.__file__)}", flush=True)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(args, import_ringx):
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                   OMP_NUM_THREADS="1")
        if not import_ringx:
            env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # autoload is on unless set to 0
        cmd = [sys.executable, os.path.abspath(__file__), "--child",
               "--backend", args.backend, "--timeout", str(args.timeout)]
        if import_ringx:
            cmd.append("--import-ringx")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + args.timeout
    failed = []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n[rank {rank} timed out after {args.timeout}s]"
        if out.strip():
            print(f"--- rank {rank} (exit {p.returncode}) ---\n{out.rstrip()}", flush=True)
        if p.returncode != 0:
            failed.append(rank)
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="ringx")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--import-ringx", action="store_true")
    ap.add_argument("--skip-autoload", action="store_true",
                    help="skip the run that relies on the torch.backends entry point")
    args = ap.parse_args()
    if args.child:
        return child(args)

    phases = [("import ringx", True)]
    if args.backend == "ringx" and not args.skip_autoload:
        phases.append(("entry point (no import)", False))
    for name, import_ringx in phases:
        print(f"wheel smoke: world {WORLD}, backend {args.backend}, {name}", flush=True)
        failed = run_world(args, import_ringx)
        if failed:
            print(f"wheel smoke: FAILED ({name}): ranks {failed} exited non-zero", flush=True)
            return 1
    if args.backend == "ringx":
        problem = check_report()
        if problem:
            print(f"wheel smoke: FAILED (python -m ringx): {problem}", flush=True)
            return 1
    print("wheel smoke: ok", flush=True)
    return 0


def check_report():
    """What is wrong with `python -m ringx` and the wheel's torch pin, or ""."""
    import importlib.metadata

    torch_version = importlib.metadata.version("torch")
    # torch itself, not the extras' packages whose names start with it (torchft).
    pins = [r for r in importlib.metadata.requires("ringx") if re.match(r"torch\s*(==|$)", r)]
    if pins != [f"torch=={torch_version.split('+')[0]}"]:
        return f"the wheel requires {pins}, not exactly this venv's torch {torch_version}"
    p = subprocess.run([sys.executable, "-m", "ringx"], capture_output=True, text=True, timeout=120)
    print(p.stdout.rstrip(), flush=True)
    if p.returncode != 0:
        return f"exit {p.returncode}: {p.stderr[-2000:]}"
    want = [f"ringx {importlib.metadata.version('ringx')} (", f"built for torch {torch_version},",
            f"torch {torch_version} (", "UCX "]
    missing = [w for w in want if w not in p.stdout]
    return f"its report lacks {missing}" if missing else ""


if __name__ == "__main__":
    sys.exit(main())
