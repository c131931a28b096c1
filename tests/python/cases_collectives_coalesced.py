"""Coalesced collectives: all_reduce_coalesced and dist._coalescing_manager around
all_reduce, all_gather_single (all_gather_into_tensor) and reduce_scatter_single
(reduce_scatter_tensor), sync and async_ops=True (the FSDP call pattern), which torch turns
into allreduce_coalesced, allgather_into_tensor_coalesced and
reduce_scatter_tensor_coalesced on the backend."""

import warnings

import torch
import torch.distributed as dist

import refs

_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_RS = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _op(op):
    return getattr(dist.ReduceOp, op)


def all_reduce_coalesced(seed, dtype, counts, op):
    """dist.all_reduce_coalesced over tensors of `counts` elements.  [tensor]."""
    rank = dist.get_rank()

    def run(_):
        xs = [refs.make_input(refs.seed_for(seed, "arc", i), rank, dtype, c, op)
              for i, c in enumerate(counts)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_reduce_coalesced(xs, op=_op(op))
        return xs

    res = refs.run_until_error(["all_reduce_coalesced"], run)
    return res.get("all_reduce_coalesced", res)


def coalescing_manager(seed, dtype, counts, kind, async_ops, op="SUM"):
    """Inside `with dist._coalescing_manager(async_ops=...)`, one collective of `kind` per
    count; returns [result tensor] (all_reduce: the tensor; all_gather: the world*count
    output; reduce_scatter: this rank's count-element chunk)."""
    rank, ws = dist.get_rank(), dist.get_world_size()

    def run(_):
        outs = []
        with dist._coalescing_manager(async_ops=async_ops) as cm:
            for i, c in enumerate(counts):
                s = refs.seed_for(seed, "cm", kind, i)
                if kind == "all_reduce":
                    x = refs.make_input(s, rank, dtype, c, op)
                    dist.all_reduce(x, op=_op(op))
                    outs.append(x)
                elif kind == "all_gather":
                    x = refs.make_input(s, rank, dtype, c)
                    out = refs.perturb(refs.concat_inputs(s, range(ws), dtype, c))
                    _AG(out, x)
                    outs.append(out)
                elif kind == "reduce_scatter":
                    x = refs.make_input(s, rank, dtype, ws * c, op)
                    out = torch.zeros(c, dtype=x.dtype)
                    _RS(out, x, op=_op(op))
                    outs.append(out)
                else:
                    raise ValueError(kind)
        if async_ops:
            cm.wait()
        return outs

    res = refs.run_until_error([kind], run)
    return res.get(kind, res)
