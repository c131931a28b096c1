"""all_reduce: world sizes x dtypes x ops x sizes against a torch reference.

One test item per (world size, dtype, count) runs every op the dtype allows in a single
round trip; a failure lists every (op, rank) that mismatched.  Under gloo, int16 items
are skipped and PREMUL_SUM is left out of the op list (gloo supports neither), and the
error-text checks for unsupported pairs are ringx-only.
"""

import os

import pytest

import cases_allreduce
import harness
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))
WORLD_SIZES = (1, 2, 3, 4, 5, 8)
SIZES = (0, 1, 7, 1000)
LARGE = 2**20 + 3
LARGE_DTYPES = ("float32", "bfloat16", "int64")
LARGE_OPS = ("SUM", "MAX")

GLOO = harness.BACKEND == "gloo"
ringx_only = pytest.mark.skipif(
    harness.BACKEND != "ringx",
    reason="error contract of ringx; gloo raises different errors (or none) for these")


def backend_ops(dtype, ops):
    if GLOO:  # gloo has no PREMUL_SUM
        ops = [op for op in ops if op != "PREMUL_SUM"]
    return list(ops)


def _params():
    gloo_no_int16 = pytest.mark.skipif(GLOO, reason="gloo has no int16 all_reduce")
    out = []
    for ws in WORLD_SIZES:
        for count in SIZES:
            for dtype in refs.DTYPES:
                marks = [gloo_no_int16] if dtype == "int16" else []
                out.append(pytest.param(ws, dtype, count, marks=marks, id=f"ws{ws}-{dtype}-n{count}"))
        for dtype in LARGE_DTYPES:
            out.append(pytest.param(ws, dtype, LARGE, id=f"ws{ws}-{dtype}-n{LARGE}"))
    return out


def check_allreduce(results, ws, seed, count, dtype, ops):
    """Compare every rank's {op: tensor} with the reference; list of failure texts."""
    failures = []
    for op in ops:
        inputs = [refs.make_input(seed, r, dtype, count, op) for r in range(ws)]
        expected, tol = refs.reference_allreduce(inputs, dtype, op)
        for r in range(ws):
            got = results[r].get(op)
            msg = refs.compare(got, expected, tol, f"rank {r}: {dtype} {op} count {count} world {ws}",
                               dtype)
            if msg:
                failures.append(msg)
    return failures


@pytest.mark.parametrize("ws,dtype,count", _params())
def test_allreduce(worlds, ws, dtype, count):
    ops = refs.ops_for(dtype) if count != LARGE else list(LARGE_OPS)
    ops = backend_ops(dtype, ops)
    results = worlds.run(ws, cases_allreduce.allreduce_ops, seed=SEED, count=count, dtype=dtype,
                         ops=ops)
    failures = check_allreduce(results, ws, SEED, count, dtype, ops)
    assert not failures, refs.report(failures)


SWEEP_COUNTS = list(range(0, 18)) + [31, 32, 33, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025,
                                     4095, 4096, 4097, 65535, 65536, 65537, 131073]


SWEEP_DTYPES = ("float32", "int32")


def check_count_sweep(results, ws):
    """Failure texts of cases_allreduce.allreduce_counts over SWEEP_COUNTS x SWEEP_DTYPES."""
    failures = []
    for dtype in SWEEP_DTYPES:
        for count in SWEEP_COUNTS:
            inputs = [refs.make_input(SEED, r, dtype, count, "SUM") for r in range(ws)]
            expected, tol = refs.reference_allreduce(inputs, dtype, "SUM")
            for r in range(ws):
                msg = refs.compare(results[r][(dtype, count)], expected, tol,
                                   f"rank {r}: {dtype} SUM count {count} world {ws}", dtype)
                if msg:
                    failures.append(msg)
    return failures


@pytest.mark.parametrize("ws", WORLD_SIZES, ids=lambda w: f"ws{w}")
def test_allreduce_count_sweep(worlds, ws):
    """Counts around chunk and world-size boundaries, many collectives back to back."""
    results = worlds.run(ws, cases_allreduce.allreduce_counts, seed=SEED, counts=SWEEP_COUNTS,
                         dtypes=SWEEP_DTYPES)
    failures = check_count_sweep(results, ws)
    assert not failures, refs.report(failures)


@ringx_only
@pytest.mark.parametrize("ws", (1, 2, 3), ids=lambda w: f"ws{w}")
def test_allreduce_unsupported_pairs_raise(worlds, ws):
    """Bitwise ops on floats, AVG / PREMUL_SUM on integers and bool: a clear error naming
    ringx and the op, raised on every rank, input left untouched, group still usable."""
    pairs = refs.unsupported_pairs()
    counts = (0, 7)
    results = worlds.run(ws, cases_allreduce.allreduce_unsupported, seed=SEED, pairs=pairs,
                         counts=counts)
    failures = []
    for count in counts:
        for dtype, op in pairs:
            for r in range(ws):
                res = results[r][(dtype, op, count)]
                where = f"rank {r}: {dtype} {op} count {count} world {ws}"
                if res[0] == "returned":
                    failures.append(f"{where}: returned instead of raising")
                    continue
                _, tname, ok_type, text, unchanged = res
                if not ok_type:
                    failures.append(f"{where}: raised {tname}, expected ValueError/TypeError/"
                                    f"RuntimeError: {text}")
                low = text.lower()
                if "ringx" not in low or op.lower() not in low:
                    failures.append(f"{where}: message should name ringx and {op}: {text!r}")
                if not unchanged:
                    failures.append(f"{where}: the input was modified by the failed call")
    for r in range(ws):
        if results[r]["sanity"] != ws * (ws - 1) // 2:
            failures.append(f"rank {r}: all_reduce after the errors gave {results[r]['sanity']}")
    assert not failures, refs.report(failures)


NC_DTYPES = ("float32", "bfloat16", "int64")
NC_OPS = ("SUM", "MAX")


def _nc_params():
    out = []
    for ws in (2, 3):
        for layout in ("transposed", "strided"):
            marks = []
            if GLOO and layout == "strided":
                marks = [pytest.mark.xfail(
                    strict=True, reason="gloo silently reduces the wrong elements of a strided "
                                        "slice (it ignores strides); the test must catch that")]
            out.append(pytest.param(ws, layout, marks=marks, id=f"ws{ws}-{layout}"))
    return out


@pytest.mark.parametrize("ws,layout", _nc_params())
def test_allreduce_noncontiguous(worlds, ws, layout):
    """A non-contiguous input is reduced correctly (memory outside the view untouched), or
    the call raises on every rank; a silently wrong result fails."""
    rows, cols = 37, 29
    results = worlds.run(ws, cases_allreduce.allreduce_noncontiguous, seed=SEED, layout=layout,
                         dtypes=NC_DTYPES, ops=NC_OPS, rows=rows, cols=cols)
    failures = []
    for dtype in NC_DTYPES:
        for op in NC_OPS:
            outcomes = [results[r][(dtype, op)] for r in range(ws)]
            kinds = {o[0] for o in outcomes}
            where = f"{dtype} {op} {layout} world {ws}"
            if kinds == {"raised"}:
                continue  # an error on every rank is acceptable
            if kinds != {"ok"}:
                failures.append(f"{where}: some ranks raised and some did not: "
                                + "; ".join(f"rank {r}: {o[0]} {o[1:] if o[0] == 'raised' else ''}"
                                            for r, o in enumerate(outcomes)))
                continue
            made = [cases_allreduce.noncontiguous_view(SEED, r, dtype, op, layout, rows, cols)
                    for r in range(ws)]
            expected, tol = refs.reference_allreduce([v for _, v in made], dtype, op)
            for r in range(ws):
                got_base = outcomes[r][1]
                _, got_view = _view_of(got_base, layout, rows, cols)
                msg = refs.compare(got_view.contiguous(), expected, tol, f"rank {r}: {where}", dtype)
                if msg:
                    failures.append(msg)
                if layout == "strided":
                    orig = made[r][0][0::2]
                    msg = refs.compare(got_base[0::2].contiguous(), orig, None,
                                       f"rank {r}: {where}: elements between the slice's", dtype)
                    if msg:
                        failures.append(msg + " (memory outside the view was overwritten)")
    for r in range(ws):
        if results[r]["sanity"] != [float(ws)] * 3:
            failures.append(f"rank {r}: all_reduce afterwards gave {results[r]['sanity']}")
    assert not failures, refs.report(failures)


def _view_of(base, layout, rows, cols):
    if layout == "transposed":
        return base, base.view(rows, cols).t()
    return base, base[1::2]
