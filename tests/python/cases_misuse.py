"""Misuse case bodies: every rank makes the same mistake (so the error is local and no rank
is left waiting in a collective), records what happened, then checks that the default
group still works.

Calls go through the public torch.distributed API where torch passes the arguments on to
the backend unchecked, and through the ProcessGroup methods where torch's Python layer
rejects the mistake first (different dtypes in one call, send/recv to self): those are
what other frontends (functional collectives, compiled graphs, direct ProcessGroup use)
reach without the Python checks.
"""

import warnings

import torch
import torch.distributed as dist

_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_RS = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _pg():
    return dist.group.WORLD


def _wait(work):
    if work is not None:
        work.wait()


def _f(n, dtype=torch.float32):
    return torch.ones(n, dtype=dtype)


# name -> (function(rank, ws), op regex, [keyword groups], world sizes)
# Each keyword group is a tuple of alternatives; the message must contain one from every
# group (case-insensitive).  They check that the text says what is wrong.
LENGTH = [("list", "length", "tensors", "entries", "size"),
          ("expected", "must", "should", "got", "but", "instead")]
SIZES = [("size", "shape", "numel", "elements", "bytes"),
         ("expected", "must", "should", "match", "got", "differ", "but")]
SPLITS = [("split",), ("sum", "add up", "total", "elements", "size", "dim")]
ROOT = [("root", "src", "dst", "source", "destination"),
        ("range", "invalid", "between", "must be", "out of", "size")]
PEER = [("peer", "dst", "src", "destination", "source", "rank"),
        ("range", "invalid", "between", "must be", "out of", "size")]
SELF = [("self", "itself", "own rank", "same rank", "its own", "this rank")]
DTYPES = [("dtype", "type", "float", "double", "long", "int64"),
          ("match", "same", "different", "expected", "mix", "differ", "but", "one dtype", "got")]

OP_ALL_GATHER = r"\ball_?gather\b"
OP_AG_TENSOR = r"\b_?all_?gather(_into_tensor|_base|_single)?\b"
OP_REDUCE_SCATTER = r"\b_?reduce_?scatter\w*"
OP_ALL_TO_ALL = r"\b(all_?to_?all|alltoall)\w*"


def _all_gather_len(delta):
    def f(rank, ws):
        dist.all_gather([_f(4) for _ in range(ws + delta)], _f(4))
    return f


def _all_gather_size(rank, ws):
    outs = [_f(4) for _ in range(ws)]
    outs[ws - 1] = _f(5)
    dist.all_gather(outs, _f(4))


def _all_gather_dtype(rank, ws):
    outs = [_f(4) for _ in range(ws)]
    outs[0] = _f(4, torch.float64)
    _wait(_pg().allgather([outs], [_f(4)]))


def _ag_tensor_size(rank, ws):
    _AG(_f(4 * ws + 1), _f(4))


def _ag_tensor_dtype(rank, ws):
    _AG(_f(4 * ws, torch.float64), _f(4))


def _rs_tensor_size(rank, ws):
    _RS(_f(3), _f(4 * ws))


def _rs_tensor_dtype(rank, ws):
    _RS(_f(4, torch.int64), _f(4 * ws))


def _rs_list_len(rank, ws):
    dist.reduce_scatter(_f(4), [_f(4) for _ in range(ws + 1)])


def _rs_list_dtype(rank, ws):
    inputs = [_f(4) for _ in range(ws)]
    inputs[-1] = _f(4, torch.float64)
    _wait(_pg().reduce_scatter([_f(4)], [inputs]))


def _a2a_single_in_splits(rank, ws):
    dist.all_to_all_single(_f(4 * ws), _f(4 * ws), output_split_sizes=[4] * ws,
                           input_split_sizes=[4] * (ws - 1) + [3])


def _a2a_single_out_splits(rank, ws):
    dist.all_to_all_single(_f(4 * ws), _f(4 * ws), output_split_sizes=[4] * (ws - 1) + [5],
                           input_split_sizes=[4] * ws)


def _a2a_single_splits_len(rank, ws):
    dist.all_to_all_single(_f(4 * ws), _f(4 * ws), output_split_sizes=[4] * ws,
                           input_split_sizes=[4 * ws // (ws + 1)] * (ws + 1))


def _a2a_single_dtype(rank, ws):
    _wait(_pg().alltoall_base(_f(4 * ws, torch.float64), _f(4 * ws), [], []))


def _a2a_list_len(rank, ws):
    dist.all_to_all([_f(4) for _ in range(ws)], [_f(4) for _ in range(ws + 1)])


def _a2a_list_dtype(rank, ws):
    outs = [_f(4) for _ in range(ws)]
    outs[0] = _f(4, torch.int64)
    _wait(_pg().alltoall(outs, [_f(4) for _ in range(ws)]))


def _broadcast_root(root_of_ws):
    def f(rank, ws):
        dist.broadcast(_f(4), src=root_of_ws(ws))
    return f


def _reduce_root(rank, ws):
    dist.reduce(_f(4), dst=ws)


def _gather_root(rank, ws):
    dist.gather(_f(4), None, dst=ws)


def _scatter_root(rank, ws):
    dist.scatter(_f(4), None, src=ws)


def _send_self(rank, ws):
    _wait(_pg().send([_f(4)], rank, 0))


def _recv_self(rank, ws):
    _wait(_pg().recv([_f(4)], rank, 0))


def _send_oor(rank, ws):
    _wait(_pg().send([_f(4)], ws, 0))


def _recv_oor(rank, ws):
    _wait(_pg().recv([_f(4)], ws + 3, 0))


def _send_negative(rank, ws):
    _wait(_pg().send([_f(4)], -1, 0))


def _allreduce_coalesced_dtypes(rank, ws):
    _wait(_pg().allreduce_coalesced([_f(4), _f(3, torch.float64)]))


def _gather_list_len(rank, ws):  # ws == 1: the root is the only rank
    dist.gather(_f(4), [_f(4) for _ in range(ws + 1)], dst=0)


def _gather_list_size(rank, ws):
    dist.gather(_f(4), [_f(5) for _ in range(ws)], dst=0)


def _gather_list_dtype(rank, ws):
    _wait(_pg().gather([[_f(4, torch.float64) for _ in range(ws)]], [_f(4)],
                       dist.GatherOptions()))


def _scatter_list_len(rank, ws):
    dist.scatter(_f(4), [_f(4) for _ in range(ws + 1)], src=0)


def _scatter_list_size(rank, ws):
    dist.scatter(_f(4), [_f(6) for _ in range(ws)], src=0)


def _scatter_list_dtype(rank, ws):
    _wait(_pg().scatter([_f(4)], [[_f(4, torch.int64) for _ in range(ws)]],
                        dist.ScatterOptions()))


SYMMETRIC = (2, 3)  # every rank can detect the mistake locally
ROOT_ONLY = (1,)  # only the root can tell: run where the root is the only rank

CASES = {
    "all_gather: output list one too long": (_all_gather_len(1), OP_ALL_GATHER, LENGTH, SYMMETRIC),
    "all_gather: output list one too short": (_all_gather_len(-1), OP_ALL_GATHER, LENGTH,
                                              SYMMETRIC),
    "all_gather: an output tensor of the wrong size": (_all_gather_size, OP_ALL_GATHER, SIZES,
                                                       SYMMETRIC),
    "all_gather: an output tensor of another dtype": (_all_gather_dtype, OP_ALL_GATHER, DTYPES,
                                                      SYMMETRIC),
    "all_gather_into_tensor: output not world x input": (_ag_tensor_size, OP_AG_TENSOR, SIZES,
                                                         SYMMETRIC),
    "all_gather_into_tensor: output of another dtype": (_ag_tensor_dtype, OP_AG_TENSOR, DTYPES,
                                                        SYMMETRIC),
    "reduce_scatter_tensor: input not world x output": (_rs_tensor_size, OP_REDUCE_SCATTER, SIZES,
                                                        SYMMETRIC),
    "reduce_scatter_tensor: output of another dtype": (_rs_tensor_dtype, OP_REDUCE_SCATTER,
                                                       DTYPES, SYMMETRIC),
    "reduce_scatter: input list one too long": (_rs_list_len, OP_REDUCE_SCATTER, LENGTH,
                                                SYMMETRIC),
    "reduce_scatter: an input of another dtype": (_rs_list_dtype, OP_REDUCE_SCATTER, DTYPES,
                                                  SYMMETRIC),
    "all_to_all_single: input splits do not add up": (_a2a_single_in_splits, OP_ALL_TO_ALL,
                                                      SPLITS, SYMMETRIC),
    "all_to_all_single: output splits do not add up": (_a2a_single_out_splits, OP_ALL_TO_ALL,
                                                       SPLITS, SYMMETRIC),
    "all_to_all_single: split list not world long": (_a2a_single_splits_len, OP_ALL_TO_ALL,
                                                     [("split",)], SYMMETRIC),
    "all_to_all_single: output of another dtype": (_a2a_single_dtype, OP_ALL_TO_ALL, DTYPES,
                                                   SYMMETRIC),
    "all_to_all: input list one too long": (_a2a_list_len, OP_ALL_TO_ALL, LENGTH, SYMMETRIC),
    "all_to_all: an output of another dtype": (_a2a_list_dtype, OP_ALL_TO_ALL, DTYPES, SYMMETRIC),
    "broadcast: root == world size": (_broadcast_root(lambda ws: ws), r"\bbroadcast\b", ROOT,
                                      SYMMETRIC),
    "broadcast: root -1": (_broadcast_root(lambda ws: -1), r"\bbroadcast\b", ROOT, SYMMETRIC),
    "reduce: root == world size": (_reduce_root, r"\breduce\b", ROOT, SYMMETRIC),
    "gather: root == world size": (_gather_root, r"\bgather\b", ROOT, SYMMETRIC),
    "scatter: root == world size": (_scatter_root, r"\bscatter\b", ROOT, SYMMETRIC),
    "send: to itself": (_send_self, r"\bsend\b", SELF, SYMMETRIC),
    "recv: from itself": (_recv_self, r"\brecv\b|\breceive\b", SELF, SYMMETRIC),
    "send: peer == world size": (_send_oor, r"\bsend\b", PEER, SYMMETRIC),
    "send: peer -1": (_send_negative, r"\bsend\b", PEER, SYMMETRIC),
    "recv: peer out of range": (_recv_oor, r"\brecv\b|\breceive\b", PEER, SYMMETRIC),
    "allreduce_coalesced: tensors of different dtypes": (_allreduce_coalesced_dtypes,
                                                         r"\ball_?reduce_coalesced\b", DTYPES,
                                                         SYMMETRIC),
    "gather: gather_list one too long": (_gather_list_len, r"\bgather\b", LENGTH, ROOT_ONLY),
    "gather: gather_list tensors of the wrong size": (_gather_list_size, r"\bgather\b", SIZES,
                                                      ROOT_ONLY),
    "gather: gather_list of another dtype": (_gather_list_dtype, r"\bgather\b", DTYPES,
                                             ROOT_ONLY),
    "scatter: scatter_list one too long": (_scatter_list_len, r"\bscatter\b", LENGTH, ROOT_ONLY),
    "scatter: scatter_list tensors of the wrong size": (_scatter_list_size, r"\bscatter\b", SIZES,
                                                        ROOT_ONLY),
    "scatter: scatter_list of another dtype": (_scatter_list_dtype, r"\bscatter\b", DTYPES,
                                               ROOT_ONLY),
}


def misuse(name):
    """Make mistake `name`; {"outcome": ("raised", type name, is ValueError/TypeError/
    RuntimeError, message) or ("returned",), "sanity": all_reduce of 1s afterwards}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    fn = CASES[name][0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(rank, ws)
        outcome = ("returned",)
    except Exception as e:  # noqa: BLE001 - inspected by the parent
        outcome = ("raised", type(e).__name__,
                   isinstance(e, (ValueError, TypeError, RuntimeError)), str(e))
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"outcome": outcome, "sanity": float(t.item())}
