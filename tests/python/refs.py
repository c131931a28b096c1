"""Deterministic inputs and independent references for collective tests.

Pure torch, no torch.distributed: the worker processes and the pytest process both
import this module, so a worker builds its input from (seed, rank, dtype, count, op)
and the parent rebuilds every rank's input with the same call and computes the
expected result with plain torch arithmetic.  Nothing here asks the backend under
test for anything.

Input ranges (per dtype) are chosen so that the expected value is well defined:

* floating types: uniform in [-2, 2); for PRODUCT the magnitude is in [0.5, 1.5) with a
  random sign, so an 8-rank product stays within [2^-8, 26].
* int8 / uint8 / int16 / int32: the whole range, so SUM wraps; the reference computes
  in int64 and wraps to the dtype's width (two's complement), which is what adding in
  the dtype itself gives.
* int64: [-2^59, 2^59), so a SUM over <= 8 ranks cannot overflow (signed overflow in
  C++ is undefined; we do not test it).
* PRODUCT on integers: values in [-4, 4] ([0, 4] for uint8): |product| <= 4^8, which
  wraps int8/uint8/int16 (narrowing, well defined) but never overflows int32/int64.
* bool: fair coin flips.  Reductions on bool are logical: SUM/MAX/BOR = any,
  PRODUCT/MIN/BAND = all, BXOR = parity (what gloo does, and NCCL's bool mapping).

16-bit floats: a backend may round to the storage dtype after each reduction step
(ring or tree); with N ranks at most N+1 roundings happen, each off by at most eps/2
times a partial result bounded by sum(|x_r|).  The tolerance is therefore
(N + 2) * eps(dtype) * sum_r |x_r| per element (scaled for AVG / PREMUL_SUM), and
(N + 2) * eps * |product| for PRODUCT.  MIN / MAX / integer / bool results are exact.
"""

from __future__ import annotations

import zlib

import torch

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
INT_DTYPES = ("int8", "uint8", "int16", "int32", "int64")

OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM", "BAND", "BOR", "BXOR")
BITWISE_OPS = ("BAND", "BOR", "BXOR")
FLOAT_ONLY_OPS = ("AVG", "PREMUL_SUM")

# Factor for PREMUL_SUM: exactly representable in every floating dtype (1.01b).
PREMUL_FACTOR = 1.25

_RANGES = {  # [low, high) for the non-PRODUCT integer inputs
    "int8": (-(2**7), 2**7),
    "uint8": (0, 2**8),
    "int16": (-(2**15), 2**15),
    "int32": (-(2**31), 2**31),
    "int64": (-(2**59), 2**59),
}
_BITS = {"int8": 8, "uint8": 8, "int16": 16, "int32": 32, "int64": 64}


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def op_supported(dtype: str, op: str) -> bool:
    """Whether the (dtype, op) pair is meaningful (what ringx must support)."""
    if op in BITWISE_OPS:
        return not is_float(dtype)
    if op in FLOAT_ONLY_OPS:
        return is_float(dtype)
    return True


def ops_for(dtype: str) -> list[str]:
    return [op for op in OPS if op_supported(dtype, op)]


def unsupported_pairs() -> list[tuple[str, str]]:
    return [(d, op) for d in DTYPES for op in OPS if not op_supported(d, op)]


def _generator(seed, rank, dtype, count, kind) -> torch.Generator:
    key = f"{seed}:{rank}:{dtype}:{count}:{kind}".encode()
    g = torch.Generator()
    g.manual_seed(zlib.crc32(key))
    return g


def make_input(seed: int, rank: int, dtype: str, count: int, op: str = "SUM") -> torch.Tensor:
    """The 1-D input of `rank` (a fresh contiguous tensor of `count` elements)."""
    kind = "product" if op == "PRODUCT" else "default"
    g = _generator(seed, rank, dtype, count, kind)
    td = DTYPES[dtype]
    if dtype == "bool":
        return torch.randint(0, 2, (count,), generator=g, dtype=torch.int64).to(torch.bool)
    if is_float(dtype):
        u = torch.rand(count, generator=g, dtype=torch.float64)
        if kind == "product":
            sign = torch.randint(0, 2, (count,), generator=g, dtype=torch.int64) * 2 - 1
            return ((u + 0.5) * sign).to(td)
        return (u * 4 - 2).to(td)
    if kind == "product":
        lo, hi = (0, 5) if dtype == "uint8" else (-4, 5)
    else:
        lo, hi = _RANGES[dtype]
    return torch.randint(lo, hi, (count,), generator=g, dtype=torch.int64).to(td)


def perturb(x: torch.Tensor) -> torch.Tensor:
    """A tensor of x's shape and dtype whose every element differs from x's."""
    if x.dtype == torch.bool:
        return ~x
    if x.is_floating_point():
        return x + 1  # inputs are in [-2, 2): x + 1 != x in every dtype
    return x ^ 1


def _wrap(v: torch.Tensor, dtype: str) -> torch.Tensor:
    """int64 -> dtype with two's-complement wrap-around, computed explicitly."""
    bits = _BITS[dtype]
    if bits == 64:
        return v
    if dtype == "uint8":
        return torch.remainder(v, 2**bits).to(DTYPES[dtype])
    half = 2 ** (bits - 1)
    return (torch.remainder(v + half, 2**bits) - half).to(DTYPES[dtype])


def reference_allreduce(inputs, dtype: str, op: str, factor: float = PREMUL_FACTOR):
    """Expected all_reduce result from all ranks' inputs.

    Returns (expected, tol).  For floating dtypes `expected` is float64 and `tol` a
    float64 tensor of per-element absolute tolerances; otherwise `expected` has the
    input dtype and `tol` is None (exact comparison).
    """
    n = len(inputs)
    x = torch.stack([t.reshape(-1) for t in inputs])  # (n, numel)
    shape = inputs[0].shape
    if dtype == "bool":
        if op in ("SUM", "MAX", "BOR"):
            r = x.any(0)
        elif op in ("PRODUCT", "MIN", "BAND"):
            r = x.all(0)
        elif op == "BXOR":
            r = (x.to(torch.int64).sum(0) % 2).bool()
        else:
            raise ValueError(f"no reference for bool {op}")
        return r.reshape(shape), None
    if not is_float(dtype):
        v = x.to(torch.int64)
        if op == "SUM":
            r = _wrap(v.sum(0), dtype)
        elif op == "PRODUCT":
            r = _wrap(v.prod(0), dtype)
        elif op == "MIN":
            r = x.min(0).values
        elif op == "MAX":
            r = x.max(0).values
        elif op in BITWISE_OPS:
            fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
            r = x[0].clone()
            for i in range(1, n):
                r = fn(r, x[i])
        else:
            raise ValueError(f"no reference for {dtype} {op}")
        return r.reshape(shape), None
    eps = torch.finfo(DTYPES[dtype]).eps
    v = x.to(torch.float64)
    k = (n + 2) * eps
    if op == "SUM":
        r, tol = v.sum(0), k * v.abs().sum(0)
    elif op == "AVG":
        r, tol = v.sum(0) / n, k * v.abs().sum(0) / n
    elif op == "PREMUL_SUM":
        r, tol = factor * v.sum(0), k * abs(factor) * v.abs().sum(0)
    elif op == "PRODUCT":
        r = v.prod(0)
        tol = k * r.abs()
    elif op == "MIN":
        r, tol = v.min(0).values, torch.zeros(v.shape[1], dtype=torch.float64)
    elif op == "MAX":
        r, tol = v.max(0).values, torch.zeros(v.shape[1], dtype=torch.float64)
    else:
        raise ValueError(f"no reference for {dtype} {op}")
    return r.reshape(shape), tol.reshape(shape)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def compare(got: torch.Tensor, expected: torch.Tensor, tol, label: str, dtype: str) -> str | None:
    """None when `got` matches, else a one-paragraph description of the mismatch."""
    want_dtype = DTYPES[dtype]
    if not isinstance(got, torch.Tensor):
        return f"{label}: result is {type(got).__name__}, not a tensor"
    if got.dtype != want_dtype:
        return f"{label}: result dtype {got.dtype}, expected {want_dtype}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"{label}: result shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if got.numel() == 0:
        return None
    g = got.reshape(-1)
    e = expected.reshape(-1)
    if tol is not None:
        g64 = g.to(torch.float64)
        diff = (g64 - e).abs()
        t = tol.reshape(-1)
        bad = ~(diff <= t)  # NaN counts as bad
    else:
        bad = g != e
    nbad = int(bad.sum())
    if nbad == 0:
        return None
    idx = bad.nonzero().reshape(-1)[:5].tolist()
    parts = []
    for i in idx:
        gi, ei = g[i].item(), e[i].item()
        s = f"[{i}] got {_fmt(gi)} expected {_fmt(ei)}"
        if tol is not None:
            s += f" (|diff| {_fmt(diff[i].item())} > tol {_fmt(t[i].item())})"
        parts.append(s)
    msg = f"{label}: {nbad} of {g.numel()} elements wrong; " + "; ".join(parts)
    if tol is not None:
        d = torch.nan_to_num(diff, nan=float("inf"))
        j = int(d.argmax())
        msg += f"; max |diff| {_fmt(d[j].item())} at [{j}]"
    return msg


def report(failures, limit=40) -> str:
    """Join failure texts for an assertion message, at most `limit` of them."""
    if len(failures) <= limit:
        return "\n".join(failures)
    return "\n".join(failures[:limit]) + f"\n... and {len(failures) - limit} more"


# --------------------------------------------------------------------------------------
# Helpers for the issue-3 collective tests (test_collectives_*.py, test_subgroups.py, ...)

ERROR_KEY = "__error__"


def run_until_error(keys, fn) -> dict:
    """{key: fn(key)} for each key in order; stops at the first exception.

    The exception is recorded as result[ERROR_KEY] = (key, type name, message) and returned
    as data instead of raised, so the world survives (an uncaught exception costs a world
    restart) and the parent can say which sub-case failed and why.  Callers loop over the
    same keys on every rank, so a deterministic error (an unsupported op, a misuse check)
    stops every rank at the same key and no rank is left waiting in a collective.
    """
    out = {}
    for key in keys:
        try:
            out[key] = fn(key)
        except Exception as e:  # noqa: BLE001 - reported by the parent
            out[ERROR_KEY] = (key, type(e).__name__, str(e))
            break
    return out


def errors_of(results, where: str) -> list[str]:
    """Failure texts for the run_until_error errors in `results` (one list per rank).

    A rank's result is a dict whose ERROR_KEY entry (if any) is one (key, type name,
    message) tuple or a list of them; results of other types hold no error.  Ranks that
    raised the same exception type at the same key are reported together, with the lowest
    such rank's message (messages differ only by the rank they name).
    """
    per_rank = []
    for res in results:
        err = res.get(ERROR_KEY) if isinstance(res, dict) else None
        per_rank.append([] if err is None else [err] if isinstance(err, tuple) else list(err))
    groups = {}
    for r, errs in enumerate(per_rank):
        for key, tname, text in errs:
            groups.setdefault((repr(key), tname), []).append((r, text))
    failures = []
    for (key, tname), hits in groups.items():
        ranks = [r for r, _ in hits]
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"
        failures.append(f"{who}: {where}: {key} raised {tname}: {hits[0][1].strip()[:600]}")
    return failures


def seed_for(seed, *parts) -> str:
    """A distinct input seed per (collective, root, variant): make_input keys on it."""
    return ":".join(str(p) for p in (seed,) + parts)


def expected_reduction(seed, ws: int, dtype: str, count: int, op: str):
    """(expected, tol) of reducing make_input(seed, r, dtype, count, op) over r < ws."""
    inputs = [make_input(seed, r, dtype, count, op) for r in range(ws)]
    return reference_allreduce(inputs, dtype, op)


def concat_inputs(seed, ranks, dtype: str, count: int) -> torch.Tensor:
    """The concatenation of make_input(seed, r, dtype, count) over `ranks` (all-gather)."""
    parts = [make_input(seed, r, dtype, count) for r in ranks]
    return torch.cat(parts) if parts else torch.empty(0, dtype=DTYPES[dtype])
