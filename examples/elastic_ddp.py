"""DDP that keeps training when ranks die: dist.shrink_group on ringx, no restart.

    python examples/elastic_ddp.py --nproc 4 --steps 60 --kill 2@20 --kill 0@40

torchrun's agent stops every local worker as soon as one dies, so the survivors
would never get to shrink under it. This example is its own launcher, one that
keeps survivors: it hosts the job's store, starts the ranks, and when a rank's
process ends it tells the others which ranks are gone (the store key
``elastic/gone``). Each rank trains a small MLP with DDP; `--kill R@S` makes
global rank R kill itself (SIGKILL) in the middle of step S. The survivors'
backward then raises, they read who is gone, call

    group = dist.shrink_group(gone)        # the new default group, renumbered

rebuild DDP on it, and go on from the step that failed, their parameters and
optimizer state as they were (the failed step changed neither: DDP's reducer
raises before the optimizer steps). No rank reloads a checkpoint and nobody
rendezvouses again: the survivors build the smaller group from the connections
they had (docs/surviving-failures.md, "Shrinking a group").

The launcher prints each death and each rank's last loss; it exits non-zero if a
survivor failed or the survivors' parameters differ at the end.
"""

import argparse
import collections
import datetime
import multiprocessing as mp
import os
import signal
import sys
import time

GONE_KEY = "elastic/gone"


def rank_main(rank, world, port, steps, kills, results, progress, hidden):
    # The launcher's store is the job's, as torchrun's agent's is: every rank
    # is a client of it, so it outlives any rank.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), TORCHELASTIC_USE_AGENT_STORE="True")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ringx  # noqa: F401  registers backend "ringx"

    # As torchrun does when it starts several ranks on a host: one OpenMP thread
    # each unless OMP_NUM_THREADS says otherwise, or the ranks' spinning threads
    # take the cores from one another. (Set here, not in the environment: a rank
    # forked from a server that imported torch has read its environment already.)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    dist.init_process_group("ringx", timeout=datetime.timedelta(seconds=30))
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ddp = DDP(model)
    gone = set()
    step = 0
    while step < steps:
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        try:
            loss = F.cross_entropy(ddp(x), y)
            if kills.get(rank) == step:
                _note(progress, f"{rank} dying {time.time()}")
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
        except dist.DistBackendError as err:
            start = time.perf_counter()
            new = shrink_without(store, gone, rank, err)
            took = time.perf_counter() - start
            gone |= set(new)
            sys.stdout.write(f"[rank {rank}] step {step}: ranks {new} died; shrinking took {took * 1e3:.0f} ms; "
                             f"training on {dist.get_world_size()} ranks as rank {dist.get_rank()}\n")
            sys.stdout.flush()
            ddp = DDP(model)
            continue
        opt.step()
        step += 1
        _note(progress, f"{rank} step {step} {time.time()}")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    loss = loss.detach()
    results.put((rank, loss.item(), flat.numpy().tobytes()))
    dist.destroy_process_group()


def shrink_without(store, gone, rank, err, settle=0.2):
    """Shrinks the default group by the ranks gone since `gone`; returns them.

    Who is gone comes from the launcher, which saw the processes end. Ranks that
    die together are seen one at a time, so the survivors wait until the list has
    not changed for `settle` seconds before they shrink. If shrink_group still
    fails (a rank died while they shrank, or they read the list at different
    moments), it fails on every survivor and leaves the group as it was: they
    settle again and retry.
    """
    import torch.distributed as dist

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now, since = _gone(store), time.monotonic()
        while time.monotonic() - since < settle:
            time.sleep(0.01)
            latest = _gone(store)
            if latest != now:
                now, since = latest, time.monotonic()
        new = sorted(now - gone)
        if not new:
            continue
        # shrink_group takes ranks of the group it shrinks: the default
        # group's, whose numbering changed with each shrink.
        ranks = dist.get_process_group_ranks(dist.group.WORLD)
        try:
            dist.shrink_group([ranks.index(r) for r in new])
            return new
        except (dist.DistBackendError, ValueError) as again:
            sys.stdout.write(f"[rank {rank}] shrink_group without {new} failed, settling to retry: {again}\n")
    raise RuntimeError(f"rank {rank}: a collective failed and the launcher named no rank gone: {err}") from err


def _note(progress, line):
    if progress:
        with open(progress, "a") as f:
            f.write(line + "\n")


def _gone(store):
    if not store.check([GONE_KEY]):
        return set()
    return {int(r) for r in store.get(GONE_KEY).decode().split(",") if r}


Outcome = collections.namedtuple("Outcome", "ok survivors done hung why")


def launch(nproc, steps, kills, hidden=64, progress="", ctx=None, limit=600):
    """Runs the job; returns an Outcome.

    ok: every survivor finished, with equal parameters, within `limit` seconds;
    done: {rank: (final loss, parameters as bytes)} of those that finished; hung:
    the ranks still running at the limit, killed then; why: which of those checks
    failed ("" when ok).
    `ctx` is the multiprocessing context that starts the ranks (default spawn);
    a forkserver with torch and ringx preloaded starts them in milliseconds.
    """
    import torch.distributed as dist

    ctx = ctx or mp.get_context("spawn")
    # Port 0: the store takes a free port as it binds. A port found free and
    # then bound was taken in between by another job on a busy machine.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = store.port
    results = ctx.Queue()
    procs = {r: ctx.Process(target=rank_main, args=(r, nproc, port, steps, kills, results, progress, hidden))
             for r in range(nproc)}
    for proc in procs.values():
        proc.start()
    gone, done = set(), {}
    deadline = time.monotonic() + limit
    while len(gone) + len(done) < nproc and time.monotonic() < deadline:
        while not results.empty():
            r, loss, params = results.get()
            done[r] = (loss, params)
        for r, proc in procs.items():
            if r not in gone and r not in done and proc.exitcode is not None and proc.exitcode != 0:
                gone.add(r)
                store.set(GONE_KEY, ",".join(map(str, sorted(gone))))
                print(f"[launcher] rank {r} died (exit code {proc.exitcode})", flush=True)
        time.sleep(0.02)
    hung = []
    for r, proc in procs.items():
        proc.join(timeout=max(1.0, min(30.0, deadline - time.monotonic())))
        if proc.exitcode is None:
            hung.append(r)
            proc.kill()
            proc.join()
    survivors = sorted(set(procs) - gone)
    why = []
    if hung:
        why.append(f"ranks {hung} still running {limit} s after the start, or not exited 30 s after "
                   f"the last result (killed)")
    if not survivors:
        why.append("no rank survived")
    elif sorted(done) != survivors:
        why.append(f"the ranks that did not die are {survivors} but {sorted(done)} sent results")
    if len({params for _, params in done.values()}) > 1:
        first = min(done)
        why.append(f"parameters differ from rank {first}'s on ranks "
                   f"{[r for r in sorted(done) if done[r][1] != done[first][1]]}")
    return Outcome(not why, survivors, done, hung, "; ".join(why))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--kill", action="append", default=[], metavar="RANK@STEP",
                   help="global rank RANK kills itself in step STEP (repeatable)")
    p.add_argument("--hidden", type=int, default=64, help="the MLP's hidden width")
    p.add_argument("--save", default="", metavar="FILE",
                   help="torch.save the survivors' final parameters (one flat float32 tensor) here")
    p.add_argument("--progress", default="", metavar="FILE",
                   help="append '<rank> step <n> <time>' after each step, '<rank> dying <time>' before a kill")
    a = p.parse_args()
    kills = {int(r): int(s) for r, s in (k.split("@") for k in a.kill)}

    ok, survivors, done, _, why = launch(a.nproc, a.steps, kills, a.hidden, a.progress)
    for r in sorted(done):
        print(f"[launcher] rank {r}: final loss {done[r][0]:.4f}")
    if a.save and ok:
        import numpy as np
        import torch

        torch.save(torch.from_numpy(np.frombuffer(done[survivors[0]][1], dtype=np.float32).copy()), a.save)
    print(f"[launcher] {len(survivors)} of {a.nproc} ranks finished "
          + ("with equal parameters" if ok else f"WRONG: {why}"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
