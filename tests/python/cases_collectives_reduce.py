"""reduce (every root), reduce_scatter (list) and reduce_scatter_tensor case bodies.

Inputs are refs.make_input(seed_for(seed, <collective>, ...), rank, dtype, count, op), so
the parent rebuilds them and reduces with refs.reference_allreduce.  Each case loops over
its sub-cases with refs.run_until_error (an exception comes back as data).
"""

import warnings

import torch
import torch.distributed as dist

import refs

_RS_SINGLE = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def dist_op(op: str):
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(refs.PREMUL_FACTOR)
    return getattr(dist.ReduceOp, op)


def reduce_roots(seed, dtype, counts, ops, roots, group=None):
    """{(root, op, count): result on the root (None on other ranks)}."""
    rank = dist.get_rank()
    keys = [(root, op, count) for root in roots for op in ops for count in counts]

    def one(key):
        root, op, count = key
        x = refs.make_input(refs.seed_for(seed, "reduce", root), rank, dtype, count, op)
        dist.reduce(x, dst=root, op=dist_op(op), group=group)
        return x if rank == root else None

    return refs.run_until_error(keys, one)


RS_FORMS = ("list", "list_views", "list_views_inplace", "flat", "stacked", "flat_inplace", "tensor_alias")


def reduce_scatter_forms(seed, dtype, counts, ops, forms=RS_FORMS):
    """{(form, op, count): this rank's reduced chunk (count elements)}.

    Every rank's input has world*count elements, make_input(seed_for(seed, "rs", form)).
    list:          dist.reduce_scatter(out, [input chunks])
    list_views:    the same with chunk views of the input (read in place, no packing)
    list_views_inplace: the same with out the view of this rank's own chunk
    flat:          reduce_scatter_single(out[count], input[world*count])
    stacked:       input viewed as [world, count]
    flat_inplace:  out is the view input[rank*count:(rank+1)*count] (Megatron's pattern)
    tensor_alias:  the deprecated dist.reduce_scatter_tensor name, flat
    """
    rank, ws = dist.get_rank(), dist.get_world_size()
    keys = [(form, op, count) for form in forms for op in ops for count in counts]

    def one(key):
        form, op, count = key
        x = refs.make_input(refs.seed_for(seed, "rs", form), rank, dtype, ws * count, op)
        out = refs.perturb(torch.zeros(count, dtype=x.dtype))
        if form == "list":
            chunks = [x[i * count:(i + 1) * count].clone() for i in range(ws)]
            dist.reduce_scatter(out, chunks, op=dist_op(op))
            return out
        if form == "list_views":
            dist.reduce_scatter(out, list(x.chunk(ws)), op=dist_op(op))
            return out
        if form == "list_views_inplace":
            chunks = list(x.chunk(ws))
            dist.reduce_scatter(chunks[rank], chunks, op=dist_op(op))
            return chunks[rank].clone()
        if form == "flat":
            _RS_SINGLE(out, x, op=dist_op(op))
            return out
        if form == "stacked":
            _RS_SINGLE(out, x.view(ws, count), op=dist_op(op))
            return out
        if form == "flat_inplace":
            view = x[rank * count:(rank + 1) * count]
            _RS_SINGLE(view, x, op=dist_op(op))
            return view.clone()
        if form == "tensor_alias":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                dist.reduce_scatter_tensor(out, x, op=dist_op(op))
            return out
        raise ValueError(form)

    return refs.run_until_error(keys, one)
