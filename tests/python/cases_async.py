"""Async-work and future case bodies, run on every rank by harness.World.run."""

import datetime
import random
import time
import warnings

import torch
import torch.distributed as dist

import refs

# (dtype, count, op) of the outstanding collectives in outstanding_allreduces
OUTSTANDING = (
    ("float32", 1000, "SUM"),
    ("int64", 7, "MAX"),
    ("float32", 65537, "SUM"),
    ("bfloat16", 1, "SUM"),
    ("int32", 0, "SUM"),
    ("float64", 4099, "MIN"),
    ("int64", 100003, "SUM"),
)


def outstanding_allreduces(seed, order):
    """Issue every OUTSTANDING all_reduce with async_op=True, then wait in `order`.

    order: "forward", "reverse", or "shuffled" (a different order on every rank).
    Returns {"results": [tensor], "completed": [bool after wait], "wait": [return of wait]}.
    """
    rank = dist.get_rank()
    xs, works = [], []
    for dtype, count, op in OUTSTANDING:
        x = refs.make_input(seed, rank, dtype, count, op)
        xs.append(x)
        works.append(dist.all_reduce(x, op=getattr(dist.ReduceOp, op), async_op=True))
    idx = list(range(len(works)))
    if order == "reverse":
        idx.reverse()
    elif order == "shuffled":
        random.Random(seed * 1000 + rank).shuffle(idx)
    waited = [None] * len(works)
    for i in idx:
        waited[i] = works[i].wait()
    return {"results": xs, "completed": [w.is_completed() for w in works], "wait": waited}


def work_status(seed, count):
    """The Work API around one async all_reduce (SUM of float32 inputs)."""
    rank = dist.get_rank()
    x = refs.make_input(seed, rank, "float32", count)
    w = dist.all_reduce(x, async_op=True)
    out = {}
    out["wait_timeout"] = w.wait(timeout=datetime.timedelta(seconds=30))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["is_completed"] = w.is_completed()
        out["is_success"] = w.is_success()
        exc = w.exception()
    out["exception"] = None if exc is None else repr(exc)
    fut = w.get_future()
    value = fut.wait()
    out["future_done"] = fut.done()
    out["future_type"] = type(value).__name__
    out["future_len"] = len(value) if isinstance(value, (list, tuple)) else None
    first = value[0] if isinstance(value, (list, tuple)) and value else None
    out["future_is_input"] = isinstance(first, torch.Tensor) and first.data_ptr() == x.data_ptr()
    out["future_value"] = first.clone() if isinstance(first, torch.Tensor) else None
    out["result"] = x
    out["second_wait"] = w.wait()  # waiting again on a finished work is fine
    return out


def future_then_collective(seed, count, attach):
    """fut.then(cb) where cb runs a synchronous all_reduce; the chain's value is checked.

    attach "pending": then() right after issuing (usually before completion);
    attach "completed": then() after wait(), so the callback runs inline.
    With inputs x_r (int64): first all_reduce gives S = sum_r x_r on every rank; the
    callback copies S + 1 into y and all_reduces it: y = N * (S + 1).
    """
    rank = dist.get_rank()
    # small values (the PRODUCT input range) so that N * (S + 1) cannot overflow
    x = refs.make_input(seed, rank, "int64", count, "PRODUCT")
    y = torch.empty_like(x)
    w = dist.all_reduce(x, async_op=True)
    if attach == "completed":
        w.wait()

    def cb(fut):
        (s,) = fut.value()
        y.copy_(s + 1)
        dist.all_reduce(y)
        return [y, s]

    chained = w.get_future().then(cb)
    value = chained.wait()
    return {"value": [t.clone() for t in value], "x": x, "y": y}


def backend_info():
    return {"backend": dist.get_backend(), "rank": dist.get_rank(),
            "world_size": dist.get_world_size()}


def async_progress_after_sync(rounds, count):
    """A synchronous all_reduce (the caller drives it while one rank arrives late),
    then an async one the caller does not wait on while it computes: the async op
    must progress on its own. Returns the ms each async op took to show completed,
    and the ms the same all_reduce took where the caller drove it (waited at once)."""
    rank = dist.get_rank()
    small = torch.ones(2)
    took, driven = [], []
    for _ in range(rounds):
        big = torch.full((count,), float(rank + 1))
        if rank == 1:
            time.sleep(0.005)
        dist.all_reduce(small)
        work = dist.all_reduce(big, async_op=True)
        start = time.perf_counter()
        while not work.is_completed() and time.perf_counter() - start < 1.0:
            time.sleep(0.0005)
        took.append((time.perf_counter() - start) * 1e3)
        work.wait()
        again = torch.full((count,), float(rank + 1))
        dist.all_reduce(small)
        start = time.perf_counter()
        dist.all_reduce(again)
        driven.append((time.perf_counter() - start) * 1e3)
    return {"took_ms": took, "driven_ms": driven, "big": big}
