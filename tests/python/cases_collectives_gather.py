"""all_gather (list), all_gather_into_tensor, gather and scatter case bodies.

Every output starts as refs.perturb() of the value expected in it, so an element the
backend forgot to write differs from the reference.  Each case loops over its sub-cases
with refs.run_until_error: an exception is returned as data (see refs.py).
"""

import warnings

import torch
import torch.distributed as dist

import refs

# all_gather_single is the 2.13 name; all_gather_into_tensor is the deprecated alias
# users still call (same C++ path).  Both are exercised.
_AG_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather_into_tensor(out, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_into_tensor(out, x)


def _prefilled(seed, ranks, dtype, count):
    """The perturbed all-gather result: every element differs from the expected one."""
    return refs.perturb(refs.concat_inputs(seed, ranks, dtype, count))


ALL_GATHER_FORMS = ("list", "list_inplace", "flat", "flat_inplace", "stacked", "into_tensor_alias")


def all_gather_forms(seed, dtype, counts, forms=ALL_GATHER_FORMS):
    """{(form, count): gathered tensor (flat, ws*count)} for each form and count.

    list:           dist.all_gather(out_list, x)
    list_inplace:   out_list[rank] is x itself
    flat:           all_gather_single(out[ws*count], x)
    flat_inplace:   x is the view out[rank*count:(rank+1)*count] (the FSDP pattern)
    stacked:        all_gather_single(out[ws, count], x)
    into_tensor_alias: the deprecated dist.all_gather_into_tensor name, flat output
    """
    rank, ws = dist.get_rank(), dist.get_world_size()
    keys = [(form, count) for form in forms for count in counts]

    def one(key):
        form, count = key
        s = refs.seed_for(seed, "all_gather", form)
        x = refs.make_input(s, rank, dtype, count)
        out = _prefilled(s, range(ws), dtype, count)
        if form in ("list", "list_inplace"):
            outs = [out[i * count:(i + 1) * count].clone() for i in range(ws)]
            if form == "list_inplace":
                outs[rank] = x
            dist.all_gather(outs, x)
            return torch.cat(outs)
        if form == "flat":
            _AG_SINGLE(out, x)
            return out
        if form == "flat_inplace":
            view = out[rank * count:(rank + 1) * count]
            view.copy_(x)
            _AG_SINGLE(out, view)
            return out
        if form == "stacked":
            out2 = out.view(ws, count)
            _AG_SINGLE(out2, x)
            return out2.reshape(-1)
        if form == "into_tensor_alias":
            _all_gather_into_tensor(out, x)
            return out
        raise ValueError(form)

    return refs.run_until_error(keys, one)


def gather_roots(seed, dtype, counts, roots, group=None):
    """{(root, count): gathered tensor (flat) on the root, None elsewhere}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    keys = [(root, count) for root in roots for count in counts]

    def one(key):
        root, count = key
        s = refs.seed_for(seed, "gather", root)
        x = refs.make_input(s, rank, dtype, count)
        if rank == root:
            out = _prefilled(s, range(ws), dtype, count)
            outs = [out[i * count:(i + 1) * count].clone() for i in range(ws)]
            dist.gather(x, gather_list=outs, dst=root, group=group)
            return torch.cat(outs)
        dist.gather(x, gather_list=None, dst=root, group=group)
        # the input of a non-root rank must be left alone
        return ("input", x)

    return refs.run_until_error(keys, one)


def scatter_roots(seed, dtype, counts, roots, group=None):
    """{(root, count): (received tensor, root's scatter_list after the call or None)}.

    The root scatters make_input(seed_root, i, ...) to rank i.
    """
    rank, ws = dist.get_rank(), dist.get_world_size()
    keys = [(root, count) for root in roots for count in counts]

    def one(key):
        root, count = key
        s = refs.seed_for(seed, "scatter", root)
        out = refs.perturb(refs.make_input(s, rank, dtype, count))
        if rank == root:
            lst = [refs.make_input(s, i, dtype, count) for i in range(ws)]
            dist.scatter(out, scatter_list=lst, src=root, group=group)
            return (out, torch.cat(lst))
        dist.scatter(out, scatter_list=None, src=root, group=group)
        return (out, None)

    return refs.run_until_error(keys, one)
