"""Per-rank bodies of test_mismatch.py: mismatched calls, PREMUL_SUM with per-rank
factors, aliased all_to_all_single, collectives from several threads, and a
root-only argument error.  Risky calls run on a group of their own (new_group), which
the case destroys afterwards, so that a poisoned group never outlives its case."""

from __future__ import annotations

import datetime
import random
import threading
import time

import torch
import torch.distributed as dist


def _outcome(fn):
    """("ok", result) or ("error", type name, message)."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the case reports whatever was raised
        return ("error", type(e).__name__, str(e))


def _fresh_group(timeout_s):
    g = dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))
    # Every rank has connected to the new group before any rank can destroy it (a
    # rank joining a group its peer already tore down fails to connect).
    dist.barrier()
    return g


def allreduce_vs_allgather(timeout_s=10.0):
    """Rank 0 all_reduces 16 floats while rank 1 all_gathers a 16-float input."""
    g = _fresh_group(timeout_s)
    r = dist.get_rank()
    x = torch.arange(16, dtype=torch.float32) + 100 * (r + 1)

    def call():
        if r == 0:
            dist.all_reduce(x, group=g)
            return x
        out = torch.zeros(32)
        dist.all_gather_into_tensor(out, x, group=g)
        return out

    res = _outcome(call)
    dist.destroy_process_group(g)
    return res


def sparse_vs_dense(timeout_s, dense, count):
    """Rank 0 all_reduces a sparse tensor while the other ranks make a dense call of
    `count` elements: `all_reduce`, or `all_gather` (all_gather_into_tensor, which takes
    the single copy on one host).  Returns (outcome, seconds it took)."""
    g = _fresh_group(timeout_s)
    r = dist.get_rank()
    x = torch.arange(count, dtype=torch.float32)
    if r == 0:
        call = lambda: dist.all_reduce(x.to_sparse(), group=g)  # noqa: E731
    elif dense == "all_reduce":
        call = lambda: dist.all_reduce(x, group=g)  # noqa: E731
    else:
        out = torch.empty(count * dist.get_world_size(g))
        call = lambda: dist.all_gather_into_tensor(out, x, group=g)  # noqa: E731
    t0 = time.monotonic()
    res = _outcome(call)
    took = time.monotonic() - t0
    dist.destroy_process_group(g)
    return res, took


def premul_sum(count, tensor_factor):
    """Every reducing collective with PREMUL_SUM and factor rank + 1 (as a float or as
    a one-element tensor); inputs (i % 13) + 10 r.  Returns {name: tensor}."""
    r, n = dist.get_rank(), dist.get_world_size()
    f = float(r + 1)
    op = lambda: dist._make_nccl_premul_sum(torch.tensor([f]) if tensor_factor else f)  # noqa: E731

    def inp(k):
        return (torch.arange(k) % 13).to(torch.float32) + 10 * r

    out = {}
    x = inp(count)
    dist.all_reduce(x, op=op())
    out["all_reduce"] = x
    y = torch.full((count,), -1.0)
    dist.reduce_scatter_tensor(y, inp(n * count), op=op())
    out["reduce_scatter_tensor"] = y
    z = torch.full((count,), -1.0)
    dist.reduce_scatter(z, list(inp(n * count).chunk(n)), op=op())
    out["reduce_scatter"] = z
    for root in range(n):
        w = inp(count)
        dist.reduce(w, dst=root, op=op())
        if r == root:
            out[f"reduce_root{root}"] = w
    return out


def alltoall_aliased(block):
    """all_to_all_single(x, x) without and with (equal) split sizes; block d of rank r
    holds r * 1000 + d * 100 + (i % 100)."""
    r, n = dist.get_rank(), dist.get_world_size()

    def make():
        return torch.cat([r * 1000 + d * 100 + (torch.arange(block) % 100).float() for d in range(n)])

    x = make()
    dist.all_to_all_single(x, x)
    y = make()
    dist.all_to_all_single(y, y, [block] * n, [block] * n)
    return {"even": x, "splits": y}


def threaded_collectives(threads, iters, counts):
    """`threads` threads per rank issue collectives on the default group at once.

    Phase "free", once per count: no ordering between threads, every call an
    all_reduce of that count with data that depends on the rank only, so whatever the
    interleaving the i-th call of every rank agrees; each result must be the sum over
    ranks.  Phase "turns": thread t of
    every rank issues its calls in turn t of a per-rank round robin (the user's
    responsibility in torch too), each with its own size and kind, all async, checked
    at the end."""
    r, n = dist.get_rank(), dist.get_world_size()
    errors = []
    want_free = {c: float(sum(q + 1 for q in range(n))) for c in counts}

    def free(t, c):
        try:
            for i in range(iters):
                works = []
                for _ in range(3):
                    x = torch.full((c,), float(r + 1))
                    works.append((dist.all_reduce(x, async_op=True), x, c))
                for w, x, _ in works:
                    w.wait()
                    if not torch.all(x == want_free[c]):
                        errors.append(f"free: thread {t} iter {i} count {c}: got {x[:4].tolist()}")
        except Exception as e:  # noqa: BLE001
            errors.append(f"free: thread {t}: {type(e).__name__}: {e}")

    for c in counts:
        ts = [threading.Thread(target=free, args=(t, c)) for t in range(threads)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()

    turn = [0]
    cv = threading.Condition()
    pending = []

    def turns(t):
        try:
            for i in range(iters):
                with cv:
                    cv.wait_for(lambda: turn[0] % threads == t)
                    c = counts[(t + i) % len(counts)] + t
                    if t % 2 == 0:
                        x = torch.full((c,), float((r + 1) * (t + 1) + i))
                        pending.append((dist.all_reduce(x, async_op=True), x,
                                        sum((q + 1) * (t + 1) + i for q in range(n)), t, i))
                    else:
                        x = torch.full((c,), float(r * 10 + t + i))
                        root = i % n
                        pending.append((dist.broadcast(x, src=root, async_op=True), x, root * 10 + t + i, t, i))
                    turn[0] += 1
                    cv.notify_all()
        except Exception as e:  # noqa: BLE001
            errors.append(f"turns: thread {t}: {type(e).__name__}: {e}")
            with cv:
                turn[0] = 1 << 30
                cv.notify_all()

    ts = [threading.Thread(target=turns, args=(t,)) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    for w, x, want, t, i in pending:
        w.wait()
        if not torch.all(x == want):
            errors.append(f"turns: thread {t} iter {i}: got {x[:4].tolist()} want {want}")
    return errors


def root_only_rejection(timeout_s):
    """Scatter whose scatter_list is wrong on the root only, then an all_reduce."""
    g = _fresh_group(timeout_s)
    r, n = dist.get_rank(), dist.get_world_size()
    out = torch.zeros(4)

    def bad_scatter():
        lst = [torch.zeros(4) for _ in range(n)]
        lst[-1] = torch.zeros(5)
        dist.scatter(out, lst if r == 0 else None, src=0, group=g)
        return out

    first = _outcome(bad_scatter)

    def after():
        x = torch.full((8,), float(r + 1))
        dist.all_reduce(x, group=g)
        return x

    second = _outcome(after)
    dist.destroy_process_group(g)
    return {"scatter": first, "after": second}


SPECS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "all_to_all", "barrier")


def _spec_call(spec, g, r, n):
    kind, count, dtype, op, root = spec
    dt = getattr(torch, dtype)
    base = lambda k, q=r: ((torch.arange(k) % 11) + 3 * (q + 1)).to(dt)  # noqa: E731
    red = {"SUM": dist.ReduceOp.SUM, "MAX": dist.ReduceOp.MAX}[op]
    if kind == "all_reduce":
        x = base(count)
        dist.all_reduce(x, op=red, group=g)
        return x
    if kind == "broadcast":
        x = base(count)
        dist.broadcast(x, group_src=root, group=g)
        return x
    if kind == "all_gather":
        out = torch.zeros(n * count, dtype=dt)
        dist.all_gather_into_tensor(out, base(count), group=g)
        return out
    if kind == "reduce_scatter":
        out = torch.zeros(count, dtype=dt)
        dist.reduce_scatter_tensor(out, base(n * count), op=red, group=g)
        return out
    if kind == "reduce":
        x = base(count)
        dist.reduce(x, group_dst=root, op=red, group=g)
        return x
    if kind == "all_to_all":
        out = torch.zeros(n * count, dtype=dt)
        dist.all_to_all_single(out, base(n * count), group=g)
        return out
    dist.barrier(group=g)
    return torch.zeros(0)


def random_mismatches(seed, trials, timeout_s):
    """Random pairs of calls on a group of their own; after any error the group is
    destroyed and rebuilt on every rank (the ranks learn of each other's errors over
    the default group's store).  Returns per trial (specs, outcomes)."""
    r, n = dist.get_rank(), dist.get_world_size()
    rng = random.Random(seed)
    store = dist.distributed_c10d._get_default_store()
    g = _fresh_group(timeout_s)
    log = []
    for t in range(trials):
        base = (rng.choice(SPECS), rng.choice([1, 16, 300000]), rng.choice(["float32", "int32"]),
                rng.choice(["SUM", "MAX"]), rng.randrange(n))
        specs = [base] * n
        if rng.random() < 0.6:
            field = rng.randrange(5)
            other = list(base)
            other[field] = {0: rng.choice(SPECS), 1: rng.choice([1, 7, 16, 300000]),
                            2: rng.choice(["float32", "float64", "int32"]), 3: rng.choice(["SUM", "MAX"]),
                            4: rng.randrange(n)}[field]
            specs = [tuple(other) if q == n - 1 else base for q in range(n)]
        res = _outcome(lambda: _spec_call(specs[r], g, r, n))
        failed = res[0] == "error"
        store.set(f"mm/{seed}/{t}/{r}", "1" if failed else "0")
        anyone = any(store.get(f"mm/{seed}/{t}/{q}") == b"1" for q in range(n))
        log.append((specs, res))
        if anyone:
            dist.destroy_process_group(g)
            g = _fresh_group(timeout_s)
    dist.destroy_process_group(g)
    return log
