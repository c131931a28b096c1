"""reduce to every root, reduce_scatter (list) and reduce_scatter_tensor / _single (flat,
stacked, in place): world sizes x dtypes x every op the dtype allows x sizes, against
refs.reference_allreduce of the deterministic inputs (16-bit floats within the
per-element tolerance documented in refs.py, everything else exact)."""

import os

import pytest

import cases_collectives_reduce as cases
import harness
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))
GLOO = harness.BACKEND == "gloo"
DTYPES = ("float32", "float64", "bfloat16", "int64", "uint8", "bool")
DTYPES_WS8 = ("float32", "int64", "bool")
SIZES = (0, 1, 13)
LARGE = 2**18 + 1
LARGE_OPS = ("SUM",)
LARGE_COMBOS = {(3, "float32"), (4, "bfloat16"), (8, "int64")}
# gloo rejects the stacked [world, count] input of reduce_scatter_single (a fatal check,
# "outputShape[0] * worldSize == inputShape[0]"); torch documents it and ringx must accept
# it, so it is left out under gloo only.
RS_FORMS = tuple(f for f in cases.RS_FORMS if not (GLOO and f == "stacked"))


def _ops(dtype, ws):
    ops = refs.ops_for(dtype)
    if GLOO:  # gloo has no PREMUL_SUM
        ops = [op for op in ops if op != "PREMUL_SUM"]
    if ws == 8:  # fewer combinations at 8 ranks
        ops = [op for op in ops if op in ("SUM", "MAX", "PRODUCT", "BXOR")]
    return list(ops)


def _params():
    out = []
    for ws in (1, 2, 3, 4, 8):
        for dtype in DTYPES_WS8 if ws == 8 else DTYPES:
            out.append(pytest.param(ws, dtype, id=f"ws{ws}-{dtype}"))
    return out


def _plan(ws, dtype):
    """[(op, counts)] of one test item: every op at the small sizes, SUM at LARGE."""
    plan = [(op, SIZES) for op in _ops(dtype, ws)]
    if (ws, dtype) in LARGE_COMBOS:
        plan += [(op, (LARGE,)) for op in LARGE_OPS]
    return plan


# The large count runs in these reduce_scatter forms only (time).
LARGE_RS_FORMS = ("list", "flat_inplace")


def _run_plan(worlds, ws, dtype, fn, **kwargs):
    """One round trip per (op, counts) of the plan (an error in one op does not hide the
    others); per-rank results merged, errors collected as a list under ERROR_KEY."""
    merged = [{refs.ERROR_KEY: []} for _ in range(ws)]
    for op, counts in _plan(ws, dtype):
        kw = dict(kwargs)
        if "forms" in kw and LARGE in counts:
            kw["forms"] = [f for f in kw["forms"] if f in LARGE_RS_FORMS]
        res = worlds.run(ws, fn, seed=SEED, dtype=dtype, counts=counts, ops=[op], **kw)
        for r in range(ws):
            if refs.ERROR_KEY in res[r]:
                merged[r][refs.ERROR_KEY].append(res[r].pop(refs.ERROR_KEY))
            merged[r].update(res[r])
    return merged



@pytest.mark.parametrize("ws,dtype", _params())
def test_reduce(worlds, ws, dtype):
    roots = list(range(ws))
    results = _run_plan(worlds, ws, dtype, cases.reduce_roots, roots=roots)
    failures = refs.errors_of(results, f"reduce {dtype} world {ws}")
    for op, counts in _plan(ws, dtype):
        for root in roots:
            for count in counts:
                if (root, op, count) not in results[root]:
                    continue
                expected, tol = refs.expected_reduction(refs.seed_for(SEED, "reduce", root), ws,
                                                        dtype, count, op)
                msg = refs.compare(results[root][(root, op, count)], expected, tol,
                                   f"rank {root}: reduce to root {root}, {dtype} {op} count "
                                   f"{count} world {ws}", dtype)
                if msg:
                    failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws,dtype", _params())
def test_reduce_scatter(worlds, ws, dtype):
    results = _run_plan(worlds, ws, dtype, cases.reduce_scatter_forms, forms=RS_FORMS)
    failures = refs.errors_of(results, f"reduce_scatter {dtype} world {ws}")
    for form in RS_FORMS:
        for op, counts in _plan(ws, dtype):
            for count in counts:
                if count == LARGE and form not in LARGE_RS_FORMS:
                    continue
                full, tol = refs.expected_reduction(refs.seed_for(SEED, "rs", form), ws, dtype,
                                                    ws * count, op)
                for r in range(ws):
                    if (form, op, count) not in results[r]:
                        continue
                    part = slice(r * count, (r + 1) * count)
                    msg = refs.compare(results[r][(form, op, count)], full[part],
                                       None if tol is None else tol[part],
                                       f"rank {r}: reduce_scatter {form} {dtype} {op} count "
                                       f"{count} world {ws}", dtype)
                    if msg:
                        failures.append(msg)
    assert not failures, refs.report(failures)
