"""DDP that keeps training when ranks die: ``dist.shrink_group``, no restart.

    python examples/elastic_ddp.py --nproc 4 --steps 30 --kill 2:10 --kill 0:20

torchrun's agent stops every worker as soon as one dies, so its survivors never get
to shrink. This script is its own launcher instead: it starts one process per rank
with the variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...)
and leaves the others running when one dies. ``--kill RANK:STEP`` SIGKILLs global
rank RANK in the middle of step STEP (after its forward pass); kill one yourself
instead with ``kill -9 <pid>`` (each rank prints its pid).

Each survivor catches the error its backward pass raises, works out which ranks died
(here from their pids, all on this host; on several hosts ask your scheduler, or read
the rank out of "connection to rank V closed"), calls ``dist.shrink_group`` with them,
rebuilds DDP on the shrunk default group and redoes the step. Rank 0 of the last group
prints the parameters' checksum at the end. Killing rank 0 is fine: the job's store
dies with it, and the shrunk group does not need it.
"""

import argparse
import datetime
import hashlib
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ringx  # noqa: F401  (registers the backend)


def alive(pid):
    """Whether pid runs (a zombie, dead but not yet reaped by the launcher, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def worker(args):
    me = int(os.environ["RANK"])
    dist.init_process_group("ringx", timeout=datetime.timedelta(seconds=args.timeout))
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    print(f"rank {me}: pid {os.getpid()}", flush=True)
    kills = {int(r): int(s) for r, s in (k.split(":") for k in args.kill)}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    while step < args.steps:
        opt.zero_grad()
        x, y = batch(step, dist.get_rank())
        loss = F.mse_loss(ddp(x), y)
        if kills.get(me) == step:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
        except dist.DistBackendError as e:
            print(f"rank {me}: step {step} failed: {str(e).splitlines()[0]}", flush=True)
            deadline = time.monotonic() + args.timeout
            dead = [r for r, pid in enumerate(pids) if not alive(pid)]
            while not dead and time.monotonic() < deadline:  # a peer that hangs: wait for it to go
                time.sleep(0.05)
                dead = [r for r, pid in enumerate(pids) if not alive(pid)]
            t0 = time.perf_counter()
            dist.shrink_group(dead)
            pids = [pid for r, pid in enumerate(pids) if r not in dead]
            ddp = DDP(model)  # on the new default group; opt keeps the same parameters
            print(f"rank {me}: without rank(s) {dead} of the old group, now rank {dist.get_rank()} of "
                  f"{dist.get_world_size()} ({1000 * (time.perf_counter() - t0):.0f} ms)", flush=True)
            continue
        opt.step()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f} on {dist.get_world_size()} ranks", flush=True)
        step += 1
    if dist.get_rank() == 0:
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        print(f"done: {args.steps} steps, {dist.get_world_size()} ranks left, parameters {digest[:16]}", flush=True)
    dist.destroy_process_group()


def launch(args):
    """One process per rank, as torchrun would start them, but no rank's death stops the others."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), WORLD_SIZE=str(args.nproc),
               LOCAL_WORLD_SIZE=str(args.nproc), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(args.nproc)]
    codes = [p.wait() for p in procs]
    print(f"exit codes: {codes}", flush=True)
    killed = {int(k.split(":")[0]) for k in args.kill}
    return 0 if all(c == (-signal.SIGKILL if r in killed else 0) for r, c in enumerate(codes)) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill", action="append", default=[], metavar="RANK:STEP")
    parser.add_argument("--timeout", type=float, default=30.0, help="the group timeout, seconds")
    parser.add_argument("--port", type=int, default=29512)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
