"""Kill trials for dist.shrink_group (issue 43): crashes, hangs, wrong parameters.

    python tests/soak_shrink.py --trials 50 [--seed 1]        (make soak-shrink)

Each trial runs examples/elastic_ddp.py's launcher, in this process, with what a
seeded generator picks: 3 to 5
ranks, one or two victims (any global rank, the job store's host included; two may
die in the same step), the steps they die in, and the model's width (8 to 4096, so
DDP's buckets range from a few hundred bytes to about 700 KB). The trial passes when
the example exits 0 within the time limit (every survivor finished, their parameters
equal) and the survivors' parameters equal a plain-torch replay of the same run:
each step the mean of the current group's gradients (batches seeded by the step and
the rank in the group, a failed step redone by the smaller group), then SGD with
momentum, within float32 rounding. Prints one line per trial and a summary; exits
non-zero if any trial crashed, hung or ended with wrong parameters.

The ranks start from a forkserver that has imported torch and ringx once, so a trial
costs what its ranks do, not their imports (about 12 s a trial on the 2-core VM when
each rank was a fresh interpreter).
"""

import argparse
import multiprocessing as mp
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import elastic_ddp  # noqa: E402

STEPS = 8


def replay(nproc, kills, hidden):
    """The survivors' final parameters, computed without torch.distributed."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        world = nproc - sum(1 for s in kills.values() if s <= step)
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for rank in range(world):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            for acc, p in zip(grads, model.parameters()):
                acc += p.grad / world
        for p, acc in zip(model.parameters(), grads):
            p.grad = acc
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ranks_context():
    ctx = mp.get_context("forkserver")
    # torch._dynamo: torch.optim.SGD imports it on first construction, 1.6 s of CPU a rank.
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "ringx",
                                "elastic_ddp"])
    return ctx


def trial(rng, limit, ctx):
    nproc = rng.choice([3, 4, 5])
    victims = rng.sample(range(nproc), rng.choice([1, 2]))
    kills = {v: rng.randrange(1, STEPS - 1) for v in victims}
    hidden = rng.choice([8, 64, 1024, 4096])
    what = f"{nproc} ranks, width {hidden}, kills " + ", ".join(f"rank {v} in step {s}" for v, s in kills.items())
    start = time.monotonic()
    out = elastic_ddp.launch(nproc, STEPS, kills, hidden, ctx=ctx, limit=limit)
    took = time.monotonic() - start
    if out.hung:
        return "hang", what, f"ranks {out.hung} still running after {limit} s"
    if not out.ok:
        return "crash", what, out.why
    got = torch.from_numpy(np.frombuffer(out.done[out.survivors[0]][1], dtype=np.float32).copy())
    want = replay(nproc, kills, hidden)
    err = (got - want).abs().max().item()
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
        return "wrong", what, f"parameters off the replay by up to {err:.3g}"
    return "ok", what, f"{took:.1f} s, largest difference from the replay {err:.2g}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=float, default=120, help="seconds a trial may take before it counts as a hang")
    a = p.parse_args()
    rng = random.Random(a.seed)
    ctx = ranks_context()
    counts = {"ok": 0, "crash": 0, "hang": 0, "wrong": 0}
    for i in range(a.trials):
        verdict, what, detail = trial(rng, a.limit, ctx)
        counts[verdict] += 1
        print(f"trial {i + 1}/{a.trials} {verdict}: {what}: {detail}", flush=True)
    print(f"{a.trials} trials: {counts['crash']} crashes, {counts['hang']} hangs, {counts['wrong']} wrong "
          f"parameters, {counts['ok']} passed")
    sys.exit(0 if counts["ok"] == a.trials else 1)


if __name__ == "__main__":
    main()
