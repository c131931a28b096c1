"""all_reduce case bodies, run on every rank by harness.World.run."""

import torch
import torch.distributed as dist

import refs


def dist_op(op: str, factor: float = refs.PREMUL_FACTOR):
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, op)


def allreduce_ops(seed, count, dtype, ops, factor=refs.PREMUL_FACTOR, group=None):
    """In-place all_reduce of this rank's input for each op; {op: result}."""
    rank = dist.get_rank()
    out = {}
    for op in ops:
        x = refs.make_input(seed, rank, dtype, count, op)
        dist.all_reduce(x, op=dist_op(op, factor), group=group)
        out[op] = x
    return out


def allreduce_cells(seed, cells, group=None):
    """allreduce_ops for each (dtype, count, ops) of `cells`, in one call of the case:
    {(dtype, count): {op: result}}."""
    return {(dtype, count): allreduce_ops(seed, count, dtype, ops, group=group) for dtype, count, ops in cells}


def allreduce_counts(seed, counts, dtypes, op="SUM", group=None):
    """One all_reduce per (dtype, count): many back-to-back collectives of odd sizes."""
    rank = dist.get_rank()
    out = {}
    for dtype in dtypes:
        for count in counts:
            x = refs.make_input(seed, rank, dtype, count, op)
            dist.all_reduce(x, op=dist_op(op), group=group)
            out[(dtype, count)] = x
    return out


def allreduce_unsupported(seed, pairs, counts):
    """Try each unsupported (dtype, op); return what happened, then check the PG still works.

    {(dtype, op, count): ("raised", type name, is ValueError/TypeError/RuntimeError,
    message, input unchanged) or ("returned", result)} plus "sanity": a SUM of ranks.
    """
    rank = dist.get_rank()
    out = {}
    for count in counts:
        for dtype, op in pairs:
            x = refs.make_input(seed, rank, dtype, count, op)
            before = x.clone()
            try:
                dist.all_reduce(x, op=dist_op(op))
                out[(dtype, op, count)] = ("returned", x)
            except Exception as e:  # noqa: BLE001 - the test inspects it
                out[(dtype, op, count)] = (
                    "raised", type(e).__name__, isinstance(e, (ValueError, TypeError, RuntimeError)),
                    str(e), bool(torch.equal(x, before)))
    t = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(t)
    out["sanity"] = int(t.item())
    return out


def allreduce_noncontiguous(seed, layout, dtypes, ops, rows=37, cols=29):
    """all_reduce a non-contiguous view.  {(dtype, op): outcome}.

    layout "transposed": x = base.view(rows, cols).t() (dense in memory, permuted);
    layout "strided":    x = base[1::2] of a 1-D base of 2*rows*cols+1 elements (gaps).
    Outcome ("ok", base after the call) or ("raised", type name, message).
    """
    rank = dist.get_rank()
    out = {}
    for dtype in dtypes:
        for op in ops:
            base, x = noncontiguous_view(seed, rank, dtype, op, layout, rows, cols)
            try:
                dist.all_reduce(x, op=dist_op(op))
                out[(dtype, op)] = ("ok", base)
            except Exception as e:  # noqa: BLE001
                out[(dtype, op)] = ("raised", type(e).__name__, str(e))
    t = torch.ones(3)
    dist.all_reduce(t)
    out["sanity"] = t.tolist()
    return out


def noncontiguous_view(seed, rank, dtype, op, layout, rows, cols):
    """(base, view) for allreduce_noncontiguous; the parent calls it too."""
    if layout == "transposed":
        base = refs.make_input(seed, rank, dtype, rows * cols, op)
        return base, base.view(rows, cols).t()
    if layout == "strided":
        base = refs.make_input(seed, rank, dtype, 2 * rows * cols + 1, op)
        return base, base[1::2]
    raise ValueError(layout)
