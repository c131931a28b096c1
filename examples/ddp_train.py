"""Train a small MLP with DistributedDataParallel on CPU over the ringx backend.

    torchrun --standalone --nproc-per-node 4 examples/ddp_train.py [--backend gloo]

The task is synthetic but learnable: a fixed random "teacher" network labels
random inputs with one of 10 classes, and a wider "student" MLP learns to
predict those labels from a dataset split across the ranks by
DistributedSampler. Each rank starts from different random weights on purpose:
DDP broadcasts rank 0's, and every step all-reduces the gradients, so at the end
all ranks must hold bit-identical parameters.

Rank 0 prints the loss (averaged over the ranks) and the time per step. The run
exits non-zero if the loss did not fall or the ranks' parameters disagree.
"""

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:
    import ringx  # noqa: F401  registers backend "ringx"
except ImportError as e:  # lets --backend gloo run where ringx is not built
    _RINGX_IMPORT_ERROR = e
else:
    _RINGX_IMPORT_ERROR = None

IN_DIM, N_CLASSES = 32, 10


def make_dataset(n_samples, seed):
    """The same inputs and labels on every rank (the sampler splits them)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_samples, IN_DIM, generator=g)
    w1 = torch.randn(IN_DIM, 64, generator=g) / IN_DIM**0.5
    w2 = torch.randn(64, N_CLASSES, generator=g) / 8.0
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return TensorDataset(x, y)


class Student(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(IN_DIM, hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.GELU(),
            nn.Linear(hidden, N_CLASSES),
        )

    def forward(self, x):
        return self.net(x)


def global_mean(value):
    """Mean of a float over all ranks (SUM then divide: gloo has no AVG)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def params_agree(model):
    """Broadcast rank 0's parameters and compare them bit for bit on every rank."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    worst = torch.tensor([0.0 if torch.equal(flat, ref) else 1.0,
                          (flat - ref).abs().max().item()], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return worst[0].item() == 0.0, worst[1].item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="ringx", help="ringx (default) or gloo, to compare")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--samples", type=int, default=16384)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()

    torch.set_num_threads(1)
    if args.backend == "ringx" and _RINGX_IMPORT_ERROR is not None:
        sys.exit(f"ddp_train: cannot import ringx ({_RINGX_IMPORT_ERROR}); "
                 "build it with `make build`, or pass --backend gloo")
    if "RANK" not in os.environ:
        sys.exit("ddp_train: run me under torchrun, e.g. "
                 "torchrun --standalone --nproc-per-node 4 examples/ddp_train.py")

    dist.init_process_group(backend=args.backend, timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    log = print if rank == 0 else (lambda *a, **k: None)

    dataset = make_dataset(args.samples, seed=1234)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, drop_last=True)

    torch.manual_seed(100 + rank)  # different on each rank: DDP must broadcast rank 0's
    model = DDP(Student(args.hidden))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"ddp_train: backend {dist.get_backend()}, world {world}, {n_params} parameters, "
        f"batch {args.batch} per rank, {args.steps} steps", flush=True)

    step, epoch = 0, 0
    first_loss = last_loss = None
    window_loss, window_n = 0.0, 0
    t_window = time.perf_counter()
    t_start = t_window
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces the gradient buckets here
            opt.step()
            step += 1
            window_loss += loss.item()
            window_n += 1
            if step == 1 or step % args.log_every == 0 or step == args.steps:
                ms = (time.perf_counter() - t_window) * 1e3 / window_n
                mean = global_mean(window_loss / window_n)
                if first_loss is None:
                    first_loss = mean
                last_loss = mean
                log(f"step {step:4d}  loss {mean:.4f}  {ms:7.2f} ms/step", flush=True)
                window_loss, window_n = 0.0, 0
                t_window = time.perf_counter()
            if step == args.steps:
                break
        epoch += 1
    total = time.perf_counter() - t_start

    agree, max_diff = params_agree(model)
    fell = last_loss < 0.7 * first_loss
    log(f"done: loss {first_loss:.4f} -> {last_loss:.4f} "
        f"({'fell' if fell else 'DID NOT FALL'}), {total:.2f} s for {args.steps} steps "
        f"({total * 1e3 / args.steps:.2f} ms/step); parameters "
        f"{'identical on all ranks' if agree else f'DIFFER across ranks (max |diff| {max_diff:g})'}",
        flush=True)
    dist.destroy_process_group()
    if not (fell and agree):
        sys.exit(1)


if __name__ == "__main__":
    main()
