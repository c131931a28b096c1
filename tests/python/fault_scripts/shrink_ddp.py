"""DDP survives two deaths through dist.shrink_group: 4 -> 3 -> 2 ranks.

    shrink_ddp.py TIMEOUT_S STEPS        (world 4)

Global rank 2 is SIGKILLed in the middle of a step (after its forward, before its
backward): the survivors' backward fails, they shrink the default group, rebuild DDP
on the shrunk one and train STEPS more steps.  Then global rank 0 (the host of the
job's store, and of the first shrunk group's) dies the same way, and the last two do
it again.  Each survivor records its parameters where each phase starts and ends, and
checks them against a plain-torch run of the same steps on as many ranks, started from
the same state.  Batches depend on (step, rank in the current group) only.
"""

import os
import signal
import sys
import time

import faultlib as common

TIMEOUT_S, STEPS = float(sys.argv[1]), int(sys.argv[2])
LR = 0.1
FIRST_VICTIM, SECOND_VICTIM = 2, 0  # global ranks


def body():
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist = common.setup(TIMEOUT_S)
    me = dist.get_rank()

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))

    def batch(step, rank):
        g = torch.Generator().manual_seed(1000 * step + rank)
        return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)

    def snapshot(model):
        return [p.detach().clone() for p in model.parameters()]

    def reference(start, first_step, steps, size):
        """DDP's arithmetic without DDP: the mean of the ranks' gradients, then SGD."""
        model = make_model()
        with torch.no_grad():
            for p, s in zip(model.parameters(), start):
                p.copy_(s)
        for step in range(first_step, first_step + steps):
            grads = [torch.zeros_like(p) for p in model.parameters()]
            for rank in range(size):
                model.zero_grad()
                x, y = batch(step, rank)
                F.mse_loss(model(x), y).backward()
                for g, p in zip(grads, model.parameters()):
                    g += p.grad / size
            with torch.no_grad():
                for p, g in zip(model.parameters(), grads):
                    p -= LR * g
        return snapshot(model)

    model = make_model()
    step = 0

    def train(ddp, opt, steps, victim=None):
        """Runs `steps` steps; the victim dies in the last one, the others raise there."""
        nonlocal step
        for i in range(steps):
            opt.zero_grad()
            x, y = batch(step, dist.get_rank())
            loss = F.mse_loss(ddp(x), y)
            if victim is not None and i == steps - 1:
                if me == victim:
                    common.record("dying")
                    os.kill(os.getpid(), signal.SIGKILL)
                try:
                    loss.backward()
                except Exception as e:  # noqa: BLE001 - what DDP raises is recorded
                    common.record("caught", step=step, **common.describe(e))
                    return
                raise AssertionError("the step the victim died in completed")
            loss.backward()
            opt.step()
            step += 1

    def phase(victim):
        """Trains STEPS steps, then one in which global rank `victim` dies; returns
        the parameters the survivors are left with."""
        ddp = DDP(model)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        train(ddp, opt, STEPS + 1, victim=victim)
        return snapshot(model)

    def shrink(victim_rank):
        t0 = time.perf_counter()
        dist.shrink_group([victim_rank])
        t1 = time.perf_counter()
        dist.all_reduce(torch.zeros(1))
        t2 = time.perf_counter()
        common.record("shrunk", size=dist.get_world_size(), shrink_s=t1 - t0, first_collective_s=t2 - t0)

    def compare(label, got, want):
        diff = max(float((a - b).abs().max()) for a, b in zip(got, want))
        common.record("compare", label=label, max_diff=diff, ok=all(
            torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want)))

    start4 = phase(FIRST_VICTIM)
    first_step = step
    shrink(FIRST_VICTIM)
    end3 = phase(SECOND_VICTIM)
    compare("three_ranks", end3, reference(start4, first_step, STEPS, 3))
    second_step = step
    shrink(0)  # global rank 0 is rank 0 of the three
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    train(ddp, opt, STEPS)
    compare("two_ranks", snapshot(model), reference(end3, second_step, STEPS, 2))
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
