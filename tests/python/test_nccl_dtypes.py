"""The dtypes NCCL reduces that gloo does not (issue 46): uint16, uint32 and uint64
(SUM, PRODUCT, MIN, MAX and the bitwise ops, exact, wrapping), and float8_e4m3fn and
float8_e5m2 (SUM, AVG, MIN, MAX computed in float32 and rounded into the dtype; a
bitwise op refused with a TypeError). References are computed here from every
rank's input: Python integers modulo 2**bits, and float64 with the rounding
tolerance refs.py uses for 16-bit floats."""

import functools
import operator

import pytest
import torch

import cases_nccl_dtypes as cases
import harness

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="gloo does not take these dtypes")

SEED = 46
UINT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
F8_OPS = ["SUM", "AVG", "MIN", "MAX"]
INT_FN = {"SUM": operator.add, "PRODUCT": operator.mul, "MIN": min, "MAX": max, "BAND": operator.and_,
          "BOR": operator.or_, "BXOR": operator.xor}


def as_ints(t):
    return t.view(torch.int64).tolist() if t.dtype == torch.uint64 else t.to(torch.int64).tolist()


@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
@pytest.mark.parametrize("count", [1, 1031, 300000])
def test_unsigned_all_reduce_is_exact(worlds, ws, dtype, count):
    results = worlds.run(ws, cases.all_reduce, seed=SEED, count=count, dtype=dtype, ops=UINT_OPS)
    bits = cases.DTYPES[dtype].itemsize * 8
    mask = (1 << bits) - 1
    for op in UINT_OPS:
        inputs = [[v & mask for v in as_ints(cases.make_input(SEED, r, dtype, count, op))] for r in range(ws)]
        want = [functools.reduce(INT_FN[op], col) & mask for col in zip(*inputs)]
        for r in range(ws):
            got = results[r][op]
            assert not isinstance(got, tuple), (op, got)
            assert got.dtype == cases.DTYPES[dtype]
            assert [v & mask for v in as_ints(got)] == want, f"rank {r} {dtype} {op}"


@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("count", [1, 1031, 300000])
def test_float8_all_reduce_within_rounding(worlds, ws, dtype, count):
    results = worlds.run(ws, cases.all_reduce, seed=SEED, count=count, dtype=dtype, ops=F8_OPS + ["BAND"])
    eps = torch.finfo(cases.DTYPES[dtype]).eps
    for op in F8_OPS:
        x = torch.stack([cases.make_input(SEED, r, dtype, count, op).to(torch.float64) for r in range(ws)])
        want = {"SUM": x.sum(0), "AVG": x.sum(0) / ws, "MIN": x.min(0).values, "MAX": x.max(0).values}[op]
        tol = (ws + 2) * eps * x.abs().sum(0) / (ws if op == "AVG" else 1)
        if op in ("MIN", "MAX"):
            tol = torch.zeros_like(tol)
        for r in range(ws):
            got = results[r][op]
            assert not isinstance(got, tuple), (op, got)
            assert got.dtype == cases.DTYPES[dtype]
            err = (got.to(torch.float64) - want).abs() - tol
            assert err.max() <= 0, f"rank {r} {dtype} {op}: off by {err.max():.3g} beyond the rounding bound"
    if ws == 2:
        # One reduction: float32 arithmetic then one rounding, bit for bit torch's cast.
        a, b = (cases.make_input(SEED, r, dtype, count, "SUM").to(torch.float32) for r in range(2))
        want = (a + b).to(cases.DTYPES[dtype]).view(torch.uint8)
        for r in range(ws):
            assert torch.equal(results[r]["SUM"].view(torch.uint8), want), f"rank {r}: not torch's rounding"
    for r in range(ws):
        refused = results[r]["BAND"]
        assert isinstance(refused, tuple) and refused[1] == "TypeError", refused
        assert "BAND" in refused[2] and dtype in refused[2], refused


@pytest.mark.parametrize("dtype", list(cases.DTYPES))
def test_data_movement_keeps_the_bytes(worlds, dtype):
    ws, count = 3, 4099
    results = worlds.run(ws, cases.data_movement, seed=SEED, count=count, dtype=dtype)
    inputs = [cases.make_input(SEED, r, dtype, count, "SUM") for r in range(ws)]
    raw = functools.partial(torch.Tensor.view, dtype=torch.uint8)
    for r in range(ws):
        assert torch.equal(raw(results[r]["all_gather"]), raw(torch.cat(inputs)))
        assert torch.equal(raw(results[r]["broadcast"]), raw(inputs[ws - 1]))
