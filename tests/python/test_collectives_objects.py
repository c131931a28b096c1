"""all_gather_object, gather_object (every root), broadcast_object_list (every root) and
scatter_object_list (every root), with rank-dependent objects of different sizes."""

import os

import pytest

import cases_collectives_objects as cases
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))


@pytest.mark.parametrize("ws", (1, 2, 3, 4, 8), ids=lambda w: f"ws{w}")
def test_object_collectives(worlds, ws):
    roots = list(range(ws)) if ws < 8 else [0, 5]
    results = worlds.run(ws, cases.object_collectives, seed=SEED, roots=roots)
    failures = refs.errors_of(results, f"object collectives world {ws}")

    def check(r, key, got, want):
        if got != want:
            at_root = f" root {key[1]}" if key[1] is not None else ""
            failures.append(f"rank {r}: {key[0]}{at_root} world {ws}: got {str(got)[:200]}, "
                            f"expected {str(want)[:200]}")

    for r, res in enumerate(results):
        key = ("all_gather_object", None)
        if key in res:
            check(r, key, res[key], [cases.obj(SEED, key[0], i) for i in range(ws)])
        for root in roots:
            key = ("gather_object", root)
            if key in res:
                want = [cases.obj(SEED, key[0], i) for i in range(ws)] if r == root else None
                check(r, key, res[key], want)
            key = ("broadcast_object_list", root)
            if key in res:
                check(r, key, res[key], [cases.obj(SEED, key[0], root),
                                         cases.obj(SEED, key[0], root + 100), None])
            key = ("scatter_object_list", root)
            if key in res:
                check(r, key, res[key], cases.obj(SEED, key[0], r))
    assert not failures, refs.report(failures)
