"""Per-rank bodies of test_cma.py: calls whose ranks disagree under the single-copy
algorithms.  Each runs on a group of its own, destroyed afterwards, so the poisoned
group does not outlive the case."""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist


def _outcome(fn):
    """("ok", result), or ("error", type name, message, seconds)."""
    start = time.time()
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the case reports whatever was raised
        return ("error", type(e).__name__, str(e), time.time() - start)


def _run_on_fresh_group(timeout_s, call):
    g = dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))
    dist.barrier()
    out = _outcome(lambda: call(g))
    dist.barrier()
    dist.destroy_process_group(g)
    return out


def all_gather_sizes_differ(timeout_s, base):
    """Rank r all_gathers base + r elements: every rank must fail, none may return data."""
    r, n = dist.get_rank(), dist.get_world_size()

    def call(g):
        x = torch.full((base + r,), float(r))
        out = torch.full((n * (base + r),), -1.0)
        dist.all_gather_into_tensor(out, x, group=g)
        return out

    return _run_on_fresh_group(timeout_s, call)


def all_reduce_sizes_differ(timeout_s, base):
    """Rank r all_reduces base + r elements: every rank must fail, none may return data."""
    r = dist.get_rank()

    def call(g):
        x = torch.full((base + r,), float(r))
        dist.all_reduce(x, group=g)
        return x

    return _run_on_fresh_group(timeout_s, call)


def reduce_scatter_sizes_differ(timeout_s, base):
    """Rank r reduce_scatters n blocks of base + r elements: every rank must fail."""
    r, n = dist.get_rank(), dist.get_world_size()

    def call(g):
        out = torch.full((base + r,), -1.0)
        dist.reduce_scatter_tensor(out, torch.full((n * (base + r),), float(r)), group=g)
        return out

    return _run_on_fresh_group(timeout_s, call)


def all_to_all_splits_disagree(timeout_s, scale):
    """Rank 0 sends rank 1 scale + 1 elements, rank 1 expects scale; the other pairs agree."""
    r, n = dist.get_rank(), dist.get_world_size()

    def call(g):
        sends = [scale + (1 if (r == 0 and q == 1) else 0) for q in range(n)]
        recvs = [scale for _ in range(n)]
        recvs[r] = sends[r]
        inp = torch.full((sum(sends),), float(r))
        out = torch.full((sum(recvs),), -1.0)
        dist.all_to_all_single(out, inp, recvs, sends, group=g)
        return out

    return _run_on_fresh_group(timeout_s, call)


def gather_scatter_views(count):
    """gather into, and scatter from, rows of one tensor (unbind views, back to back), also
    with the root's own row as the gather input (in place). Returns per root:
    (gathered rows or None, in-place gathered rows or None, scattered row, root's rows after)."""
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for root in range(n):
        mine = torch.arange(count, dtype=torch.float32) + 1000.0 * r + 100000.0 * root
        rows = list(torch.full((n, count), -1.0).unbind(0)) if r == root else None
        dist.gather(mine, rows, dst=root)
        own = torch.full((n, count), -1.0)
        own_rows = list(own.unbind(0)) if r == root else None
        src = own_rows[r] if r == root else mine.clone()
        if r == root:
            src.copy_(mine)
        dist.gather(src, own_rows, dst=root)
        sent = torch.arange(n * count, dtype=torch.float32).view(n, count) + 7.0 * root
        got = torch.full((count,), -1.0)
        dist.scatter(got, list(sent.unbind(0)) if r == root else None, src=root)
        out[root] = (torch.stack(rows) if rows else None, own if r == root else None, got,
                     sent if r == root else None)
    return out


def sizes_for_selection():
    """all_gather, broadcast and even all_to_all of 16 and 1 Mi float32 elements per rank,
    and an all_to_all with split sizes of a few elements."""
    r, n = dist.get_rank(), dist.get_world_size()
    for count in (16, 1 << 20):
        x = torch.ones(count)
        dist.all_gather_into_tensor(torch.empty(n * count), x)
        dist.broadcast(x, 0)
        dist.all_to_all_single(torch.empty(n * count), torch.ones(n * count))
    sends = [q + 1 for q in range(n)]
    recvs = [r + 1] * n
    dist.all_to_all_single(torch.empty(sum(recvs)), torch.ones(sum(sends)), recvs, sends)


def separate_tensor_lists(count):
    """all_gather, gather, scatter (from every root) and all_to_all (uneven) with lists of
    separate tensors, in float32 and complex64; then lists a single copy cannot use in
    place: one tensor of the list not contiguous, the input one of the outputs, and
    (scatter) the root's output one of its inputs. Returns, per case, what each rank received (the root's list for gather,
    the output for scatter)."""
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}

    def value(q, dtype, length=count):
        v = torch.arange(length, dtype=torch.float32) + 1000.0 * q
        return torch.complex(v, -v).to(dtype) if dtype.is_complex else v.to(dtype)

    for dtype in (torch.float32, torch.complex64):
        outs = [torch.full((count,), -1, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, value(r, dtype))
        out[("all_gather", str(dtype))] = outs
        for root in range(n):
            rows = [torch.full((count,), -1, dtype=dtype) for _ in range(n)] if r == root else None
            dist.gather(value(r, dtype), rows, dst=root)
            got = torch.full((count,), -1, dtype=dtype)
            dist.scatter(got, [value(q + 7, dtype) for q in range(n)] if r == root else None, src=root)
            out[("gather", str(dtype), root)] = rows
            out[("scatter", str(dtype), root)] = got

    strided = [torch.full((count,), -1.0) for _ in range(n)]
    strided[n - 1] = torch.full((count, 2), -1.0)[:, 0]
    dist.all_gather(strided, value(r, torch.float32))
    out["all_gather strided"] = strided
    own = [torch.full((count,), -1.0) for _ in range(n)]
    own[r].copy_(value(r, torch.float32))
    dist.all_gather(own, own[r])
    out["all_gather own input"] = own
    rows = [value(q + 7, torch.float32) for q in range(n)]
    got = rows[0] if r == 0 else torch.full((count,), -1.0)
    expect_root = rows[0].clone()
    dist.scatter(got, rows if r == 0 else None, src=0)
    out["scatter into own row"] = (got, expect_root)

    # all_to_all: rank r sends rank j count + r + 2 j elements, value(r) shifted by 10 j;
    # then with one output not contiguous (packed).
    def a2a_inputs(dtype):
        return [value(r, dtype, count + r + 2 * j) + 10 * j for j in range(n)]

    def a2a_outputs(dtype):
        return [torch.full((count + q + 2 * r,), -1, dtype=dtype) for q in range(n)]

    for dtype in (torch.float32, torch.complex64):
        outs = a2a_outputs(dtype)
        dist.all_to_all(outs, [t.clone() for t in a2a_inputs(dtype)])
        out[("all_to_all", str(dtype))] = outs
    outs = a2a_outputs(torch.float32)
    outs[n - 1] = torch.full((count + n - 1 + 2 * r, 2), -1.0)[:, 0]
    dist.all_to_all(outs, [t.clone() for t in a2a_inputs(torch.float32)])
    out["all_to_all strided"] = outs
    return out
