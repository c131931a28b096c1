"""all_to_all_single with equal splits, explicit uneven input/output split sizes (zeros
included) and a 2-D tensor; all_to_all (list form, equal and uneven sizes).  Exact
comparison with the messages rebuilt in the parent (cases_collectives_alltoall.msg)."""

import os

import pytest
import torch

import cases_collectives_alltoall as cases
import harness
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))
DTYPES = ("float32", "float64", "bfloat16", "int64", "uint8", "bool")
DTYPES_WS8 = ("float32", "int64")
LARGE = 2**18 + 1
LARGE_COMBOS = {(3, "float32"), (8, "float32")}


def _params():
    out = []
    for ws in (1, 2, 3, 4, 8):
        for dtype in DTYPES_WS8 if ws == 8 else DTYPES:
            out.append(pytest.param(ws, dtype, id=f"ws{ws}-{dtype}"))
    return out


def _variants(ws, dtype):
    v = [("equal", c) for c in (0, 1, 13)]
    v += [("equal_explicit", 13), ("uneven", 0), ("zeros", 0), ("mixed", 0), ("mixed", 13)]
    if (ws, dtype) in LARGE_COMBOS:
        v += [("equal", LARGE // ws), ("large_uneven", LARGE // ws), ("mixed", LARGE // ws),
              ("lopsided", LARGE // ws)]
    return v


def _check(results, ws, dtype, variants, what, prefix=""):
    failures = refs.errors_of(results, f"{what} {dtype} world {ws}")
    for variant, count in variants:
        for r in range(ws):
            if (variant, count) not in results[r]:
                continue
            expected = cases.expected_received(SEED, variant, r, ws, dtype, count,
                                               name=prefix + variant)
            msg = refs.compare(results[r][(variant, count)], expected, None,
                               f"rank {r}: {what} {variant} {dtype} count {count} world {ws}",
                               dtype)
            if msg:
                failures.append(msg)
    return failures


@pytest.mark.parametrize("ws,dtype", _params())
def test_all_to_all_single(worlds, ws, dtype):
    """The "mixed" variants: rank 0 passes no split sizes where the others pass them (gloo
    allows it, and so does ringx: on one host with the single copy off too, test_cma.py)."""
    variants = _variants(ws, dtype)
    results = worlds.run(ws, cases.all_to_all_single_variants, seed=SEED, dtype=dtype,
                         variants=variants)
    failures = _check(results, ws, dtype, variants, "all_to_all_single")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (1, 2, 3, 4, 8), ids=lambda w: f"ws{w}")
def test_all_to_all_single_2d(worlds, ws):
    rows, cols = 3, 5
    results = worlds.run(ws, cases.all_to_all_single_2d, seed=SEED, dtype="float32",
                         rows_per_peer=rows, cols=cols)
    failures = refs.errors_of(results, f"all_to_all_single 2-D world {ws}")
    for r in range(ws):
        if "2d" not in results[r]:
            continue
        expected = torch.cat([cases.msg(SEED, "2d", src, r, "float32", rows * cols)
                              for src in range(ws)])
        msg = refs.compare(results[r]["2d"], expected, None,
                           f"rank {r}: all_to_all_single [{ws * rows}, {cols}] world {ws}",
                           "float32")
        if msg:
            failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("form", ("separate", "views"))
@pytest.mark.parametrize("ws,dtype", [p for p in _params()
                                      if p.values[1] in ("float32", "int64", "bool")])
def test_all_to_all_list(worlds, ws, dtype, form):
    variants = [("equal_explicit", 0), ("equal_explicit", 1), ("equal_explicit", 13)]
    # torch documents uneven list all_to_all (its example uses it) and ringx must do it;
    # gloo requires equal sizes ("ProcessGroupGloo::alltoall: invalid tensor size")
    if harness.BACKEND != "gloo":
        variants += [("uneven", 0), ("zeros", 0)]
        if (ws, dtype) in LARGE_COMBOS:
            variants += [("large_uneven", LARGE // ws)]
    results = worlds.run(ws, cases.all_to_all_list_variants, seed=SEED, dtype=dtype,
                         variants=variants, form=form)
    failures = _check(results, ws, dtype, variants, f"all_to_all (list, {form})",
                      prefix="list-")
    assert not failures, refs.report(failures)
