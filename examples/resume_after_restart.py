"""Fault-tolerant training under torchrun: checkpoint every N steps, resume on restart.

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 \\
        examples/resume_after_restart.py --ckpt-dir /tmp/ckpt --steps 60 --ckpt-every 5

Kill one worker while it trains (``kill -9 <pid>``: each worker prints its pid) and
watch what happens:

1. the other workers' next collective fails at once: ringx sees the dead peer and
   raises ``DistBackendError: ringx: ... connection to rank N closed`` (for a peer
   that hangs instead of dying, the group timeout below bounds the wait);
2. torchrun's agent sees a worker exit with an error, stops the rest, and since
   ``--max-restarts 1`` allows one more attempt, starts every worker again
   (``TORCHELASTIC_RESTART_COUNT`` is now 1);
3. each new worker builds a fresh process group, finds the last checkpoint and
   resumes from the step after it; the steps since that checkpoint are redone.

The pattern, in three rules: (a) rank 0 writes the checkpoint to a temporary file
and renames it into place, so a crash mid-write never leaves a torn checkpoint;
(b) every rank waits at a barrier after the save, so no rank runs ahead of the
last complete checkpoint; (c) everything the next step depends on is in it: model,
optimizer, the step number, and the data order (here a function of the step).
Because of (c) a resumed run ends with exactly the parameters an uninterrupted run
would have: ``--result FILE`` writes a checksum of them so that is easy to check.
On several hosts, --ckpt-dir must be a shared file system.
"""

import argparse
import datetime
import hashlib
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import ringx  # noqa: F401  registers backend "ringx"
except ImportError as e:
    _RINGX_IMPORT_ERROR = e
else:
    _RINGX_IMPORT_ERROR = None

IN_DIM, HIDDEN, N_CLASSES = 16, 64, 4
CKPT_NAME = "checkpoint.pt"


def batch_for(step, rank, batch):
    """The data of one step on one rank: a function of (step, rank), so a resumed run
    sees exactly what an uninterrupted one would have."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(batch, IN_DIM, generator=g)
    y = (x[:, :N_CLASSES] * torch.arange(1, N_CLASSES + 1)).argmax(dim=1)
    return x, y


def save_checkpoint(path, step, model, opt):
    """Rank 0 writes atomically; every rank leaves only after the file is complete."""
    if dist.get_rank() == 0:
        tmp = path + ".tmp"
        torch.save({"step": step, "model": model.module.state_dict(), "opt": opt.state_dict()}, tmp)
        os.replace(tmp, path)
    dist.barrier()


def load_checkpoint(path, model, opt):
    """Returns the step to resume from (0 when there is no checkpoint)."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])


def checksum(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="seconds to sleep per step (gives you time to kill a worker)")
    ap.add_argument("--timeout", type=float, default=30.0, help="process group timeout in seconds")
    ap.add_argument("--backend", default="ringx")
    ap.add_argument("--result", default=None, help="rank 0 writes a JSON summary here")
    ap.add_argument("--progress", default=None,
                    help="each rank appends a JSON line per step here (<path>.rank<R>), for tests")
    ap.add_argument("--die-at", default=None, metavar="RANK@STEP",
                    help="in the first attempt, global rank RANK SIGKILLs itself in step STEP, after "
                         "its forward pass (for benchmarks/recovery.py)")
    args = ap.parse_args()
    die_rank, die_step = (int(v) for v in args.die_at.split("@")) if args.die_at else (-1, -1)

    torch.set_num_threads(1)
    if args.backend == "ringx" and _RINGX_IMPORT_ERROR is not None:
        sys.exit(f"resume_after_restart: cannot import ringx ({_RINGX_IMPORT_ERROR})")
    if "RANK" not in os.environ:
        sys.exit("resume_after_restart: run me under torchrun (see the docstring)")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    os.makedirs(args.ckpt_dir, exist_ok=True)
    path = os.path.join(args.ckpt_dir, CKPT_NAME)

    torch.manual_seed(0)  # same initial weights everywhere (DDP would broadcast anyway)
    model = DDP(nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, N_CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = load_checkpoint(path, model, opt)
    print(f"[rank {rank} pid {os.getpid()} attempt {attempt}] "
          f"{'resuming after step ' + str(start) if start else 'starting from scratch'}", flush=True)
    progress = open(f"{args.progress}.rank{rank}", "a", buffering=1) if args.progress else None

    loss = None
    for step in range(start + 1, args.steps + 1):
        x, y = batch_for(step, rank, args.batch)
        loss = F.cross_entropy(model(x), y)
        if attempt == 0 and (rank, step) == (die_rank, die_step):
            if progress:
                progress.write(json.dumps({"rank": rank, "pid": os.getpid(), "attempt": attempt, "dying": step,
                                           "t": time.time()}) + "\n")
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients over ringx
        opt.step()
        if progress:
            progress.write(json.dumps({"rank": rank, "pid": os.getpid(), "attempt": attempt, "step": step,
                                       "t": time.time()}) + "\n")
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(path, step, model, opt)
        if args.step_sleep:
            time.sleep(args.step_sleep)

    summary = {"attempt": attempt, "resumed_from": start, "steps": args.steps, "checksum": checksum(model),
               "loss": loss.item() if loss is not None else None}
    if rank == 0:
        print(f"[rank 0] done: {json.dumps(summary)}", flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(summary, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
