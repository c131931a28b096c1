"""Case bodies for the dtypes NCCL takes beyond gloo's: uint16/32/64 and the 8-bit floats."""

import torch
import torch.distributed as dist

DTYPES = {"uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
          "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def make_input(seed, rank, dtype, count, op):
    """Unsigned: any bit pattern (SUM and PRODUCT wrap; PRODUCT's factors in [0, 4]).
    8-bit floats: values in [-2, 2) as float32, rounded into the dtype."""
    g = torch.Generator().manual_seed(seed * 1000 + rank * 10 + len(op))
    if dtype.startswith("float8"):
        return (torch.rand(count, generator=g) * 4 - 2).to(DTYPES[dtype])
    bits = DTYPES[dtype].itemsize * 8
    if op == "PRODUCT":
        v = torch.randint(0, 5, (count,), generator=g, dtype=torch.int64)
    else:
        v = torch.randint(-(2**62), 2**62, (count,), generator=g, dtype=torch.int64) * 2 + 1
        v = v if bits == 64 else v & ((1 << bits) - 1)
    return v.view(torch.uint64).to(DTYPES[dtype]) if bits == 64 else v.to(DTYPES[dtype])


def all_reduce(seed, count, dtype, ops):
    """{op: this rank's result}; each op's refusal as ('raised', type, text)."""
    rank = dist.get_rank()
    out = {}
    for op in ops:
        x = make_input(seed, rank, dtype, count, op)
        try:
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
            out[op] = x
        except (TypeError, ValueError, RuntimeError) as e:
            out[op] = ("raised", type(e).__name__, str(e))
    return out


def data_movement(seed, count, dtype):
    """all_gather and broadcast move the dtype's bytes unchanged."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = make_input(seed, rank, dtype, count, "SUM")
    gathered = torch.empty(size * count, dtype=x.dtype)
    dist.all_gather_into_tensor(gathered, x)
    b = make_input(seed, rank, dtype, count, "SUM")
    dist.broadcast(b, src=size - 1)
    return {"all_gather": gathered, "broadcast": b}
