"""broadcast from every root: world sizes x sizes x dtypes, exact comparison."""

import os

import pytest

import cases_broadcast
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))
WORLD_SIZES = (1, 2, 3, 4, 5, 8)
SIZES = (0, 1, 7, 1000)
DTYPES = ("float32", "bfloat16", "int64", "uint8", "bool")
LARGE = 2**20 + 3
LARGE_DTYPES = ("float32",)


def _params():
    out = []
    for ws in WORLD_SIZES:
        for count in SIZES:
            for dtype in DTYPES:
                out.append(pytest.param(ws, dtype, count, id=f"ws{ws}-{dtype}-n{count}"))
        for dtype in LARGE_DTYPES:
            out.append(pytest.param(ws, dtype, LARGE, id=f"ws{ws}-{dtype}-n{LARGE}"))
    return out


@pytest.mark.parametrize("ws,dtype,count", _params())
def test_broadcast(worlds, ws, dtype, count):
    roots = list(range(ws))
    results = worlds.run(ws, cases_broadcast.broadcast_roots, seed=SEED, count=count, dtype=dtype,
                         roots=roots)
    failures = []
    for root in roots:
        expected = refs.make_input(SEED, root, dtype, count)
        for r in range(ws):
            msg = refs.compare(results[r][root], expected, None,
                               f"rank {r}: broadcast from root {root}, {dtype} count {count} "
                               f"world {ws}", dtype)
            if msg:
                failures.append(msg)
    assert not failures, refs.report(failures)
