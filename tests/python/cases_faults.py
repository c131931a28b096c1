"""Bad input: every misuse case a user can make, and the error it must get.

Each entry of MISUSE is (key, what the user did, where, fn, expected exception types,
words the message must contain).  ``where`` says which ranks can see the mistake:

* "all":  every rank makes it and every rank's argument checks reject it before
          anything is sent, so the group stays usable (misuse_all runs these in the
          persistent harness world, then checks that an all_reduce still works);
* "root": only the root's arguments are wrong (a bad gather/scatter list); the root
          rejects the call and poisons the group, and the other ranks, already in the
          collective, fail when they exchange data with the root (it tells them) or
          time out (fault_scripts/bad_input.py runs these, each on its own subgroup);
* "non-root": the reverse: torch rejects the non-roots' arguments, the root times out.

The functions take the group to use and run on every rank (``dist.get_rank()`` tells
which).  docs/failure-semantics.md's table is produced from what these raise
(``python tests/python/fault_scripts/bad_input.py --table`` prints it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _r(group):
    return dist.get_rank(group)


def _n(group):
    return dist.get_world_size(group)


def all_reduce_float8_fnuz(g):
    dist.all_reduce(torch.ones(4).to(torch.float8_e4m3fnuz), group=g)


def all_reduce_complex_max(g):
    dist.all_reduce(torch.ones(4, dtype=torch.complex64), op=dist.ReduceOp.MAX, group=g)


def all_reduce_band_float(g):
    dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND, group=g)


def all_reduce_avg_int(g):
    dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG, group=g)


def all_reduce_sparse_max(g):
    dist.all_reduce(torch.ones(4).to_sparse(), op=dist.ReduceOp.MAX, group=g)


def all_reduce_two_tensors(g):
    # The backend API (one tensor per call) reached directly, as a custom wrapper would.
    g = g or dist.group.WORLD
    g._get_backend(torch.device("cpu")).allreduce([torch.ones(2), torch.ones(2)]).wait()


def broadcast_src_out_of_range(g):
    dist.broadcast(torch.ones(4), src=_n(g) + 5, group=g)


def reduce_dst_out_of_range(g):
    dist.reduce(torch.ones(4), dst=_n(g) + 5, group=g)


def all_gather_list_too_short(g):
    dist.all_gather([torch.empty(4) for _ in range(_n(g) - 1)], torch.ones(4), group=g)


def all_gather_list_dtype(g):
    out = [torch.empty(4, dtype=torch.float64) for _ in range(_n(g))]
    dist.all_gather(out, torch.ones(4), group=g)


def all_gather_into_tensor_wrong_size(g):
    dist.all_gather_into_tensor(torch.empty(4 * _n(g) + 1), torch.ones(4), group=g)


def all_gather_into_tensor_dtype(g):
    dist.all_gather_into_tensor(torch.empty(4 * _n(g), dtype=torch.float64), torch.ones(4), group=g)


def reduce_scatter_tensor_wrong_size(g):
    dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * _n(g) + 3), group=g)


def all_to_all_single_split_sum(g):
    n = _n(g)
    dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n), output_split_sizes=[2] * n,
                           input_split_sizes=[3] * n, group=g)


def all_to_all_single_split_len(g):
    n = _n(g)
    dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n), input_split_sizes=[2] * (n + 1),
                           group=g)


def all_to_all_single_negative_split(g):
    n = _n(g)
    splits = [2] * n
    splits[0], splits[-1] = -1, 2 + 3 if n > 1 else 2
    dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n), input_split_sizes=splits, group=g)


def all_to_all_list_len(g):
    n = _n(g)
    dist.all_to_all([torch.empty(2) for _ in range(n)], [torch.ones(2) for _ in range(n + 1)], group=g)


def send_to_self(g):
    dist.send(torch.ones(4), dst=dist.get_global_rank(g or dist.group.WORLD, _r(g)), group=g)


def send_out_of_range(g):
    dist.send(torch.ones(4), dst=dist.get_world_size() + 3)


def recv_out_of_range(g):
    dist.recv(torch.empty(4), src=dist.get_world_size() + 3)


def premul_sum_int(g):
    dist.all_reduce(torch.ones(4, dtype=torch.int64),
                    op=dist._make_nccl_premul_sum(2.0), group=g)


def gather_list_on_non_root_too(g):
    # every rank passes a gather_list, but only rank 0 is the root
    out = [torch.empty(4) for _ in range(_n(g))]
    dist.gather(torch.ones(4), gather_list=out, dst=dist.get_global_rank(g or dist.group.WORLD, 0), group=g)


def gather_root_list_too_short(g):
    root = dist.get_global_rank(g or dist.group.WORLD, 0)
    out = [torch.empty(4) for _ in range(_n(g) - 1)] if _r(g) == 0 else None
    dist.gather(torch.ones(4), gather_list=out, dst=root, group=g)


def scatter_root_list_too_short(g):
    root = dist.get_global_rank(g or dist.group.WORLD, 0)
    src = [torch.ones(4) for _ in range(_n(g) - 1)] if _r(g) == 0 else None
    dist.scatter(torch.empty(4), scatter_list=src, src=root, group=g)


def scatter_root_list_wrong_size(g):
    root = dist.get_global_rank(g or dist.group.WORLD, 0)
    src = [torch.ones(5) for _ in range(_n(g))] if _r(g) == 0 else None
    dist.scatter(torch.empty(4), scatter_list=src, src=root, group=g)


_VE, _TE, _RE = "ValueError", "TypeError", "RuntimeError"

MISUSE = [
    # key, what the user did, where, fn, accepted exception types, words in the message
    ("dtype_float8_fnuz", "all_reduce of a torch.float8_e4m3fnuz tensor", "all", all_reduce_float8_fnuz, (_TE,),
     ("dtype",)),
    ("complex_max", "all_reduce(MAX) of a complex tensor", "all", all_reduce_complex_max, (_TE, _VE, _RE),
     ("complex",)),
    ("band_float", "all_reduce(BAND) of a float32 tensor", "all", all_reduce_band_float, (_TE,), ("BAND",)),
    ("avg_int", "all_reduce(AVG) of an int32 tensor", "all", all_reduce_avg_int, (_TE,), ("AVG",)),
    ("premul_int", "all_reduce(PREMUL_SUM) of an int64 tensor", "all", premul_sum_int, (_TE,),
     ("PREMUL_SUM",)),
    ("sparse_max", "all_reduce(MAX) of a sparse tensor", "all", all_reduce_sparse_max, (_VE, _RE), ("sparse",)),
    ("two_tensors", "backend.allreduce([t1, t2]) (two tensors in one call)", "all", all_reduce_two_tensors,
     (_VE,), ("one tensor",)),
    ("broadcast_src", "broadcast(src=world_size + 5)", "all", broadcast_src_out_of_range, (_VE, _RE),
     ("rank",)),
    ("reduce_dst", "reduce(dst=world_size + 5)", "all", reduce_dst_out_of_range, (_VE, _RE), ("rank",)),
    ("all_gather_len", "all_gather with world_size - 1 output tensors", "all", all_gather_list_too_short,
     (_VE, _RE), ("list has", "(one per rank)")),
    ("all_gather_dtype", "all_gather into float64 outputs from a float32 input", "all", all_gather_list_dtype,
     (_TE, _VE, _RE), ("dtype",)),
    ("all_gather_into_tensor_size", "all_gather_into_tensor with an output of 4n+1 elements", "all",
     all_gather_into_tensor_wrong_size, (_VE, _RE), ("elements",)),
    ("all_gather_into_tensor_dtype", "all_gather_into_tensor into float64 from float32", "all",
     all_gather_into_tensor_dtype, (_TE, _VE, _RE), ("dtype",)),
    ("reduce_scatter_tensor_size", "reduce_scatter_tensor with an input of 4n+3 elements", "all",
     reduce_scatter_tensor_wrong_size, (_VE, _RE), ("elements",)),
    ("a2a_split_sum", "all_to_all_single whose input splits add up to more than the input", "all",
     all_to_all_single_split_sum, (_VE, _RE), ("split",)),
    ("a2a_split_len", "all_to_all_single with n+1 input split sizes", "all", all_to_all_single_split_len,
     (_VE, _RE), ("split",)),
    ("a2a_negative", "all_to_all_single with a negative split size", "all", all_to_all_single_negative_split,
     (_VE, _RE), ("negative",)),
    ("a2a_list_len", "all_to_all with n+1 input tensors", "all", all_to_all_list_len, (_VE, _RE),
     ("input list",)),
    ("send_self", "send(dst=own rank)", "all", send_to_self, (_VE, _RE), ("rank",)),
    ("send_range", "send(dst=world_size + 3)", "all", send_out_of_range, (_VE, _RE), ("rank",)),
    ("recv_range", "recv(src=world_size + 3)", "all", recv_out_of_range, (_VE, _RE), ("rank",)),
    ("gather_list_non_root", "gather with a gather_list on a non-root rank too", "non-root",
     gather_list_on_non_root_too, (_VE,), ("gather_list",)),
    ("gather_root_len", "gather whose root passes world_size - 1 output tensors", "root",
     gather_root_list_too_short, (_VE, _RE), ("list has", "(one per rank)")),
    ("scatter_root_len", "scatter whose root passes world_size - 1 input tensors", "root",
     scatter_root_list_too_short, (_VE, _RE), ("list has", "(one per rank)")),
    ("scatter_root_size", "scatter whose root passes 5-element inputs for 4-element outputs", "root",
     scatter_root_list_wrong_size, (_VE, _RE), ("elements",)),
]

BY_KEY = {m[0]: m for m in MISUSE}


def outcome(fn, group):
    """(exception type name, MRO names, message) or None when the call did not raise."""
    try:
        fn(group)
    except Exception as e:  # noqa: BLE001 - the point is to see what it raises
        return type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)
    return None


def misuse_all():
    """Runs every "all" case on the world group, then an all_reduce that must still work."""
    results = {}
    for key, _what, where, fn, _types, _words in MISUSE:
        if where == "all":
            results[key] = outcome(fn, None)
    n = dist.get_world_size()
    x = torch.full((9,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    results["__after__"] = torch.equal(x, torch.full((9,), float(n * (n + 1) // 2)))
    return results
