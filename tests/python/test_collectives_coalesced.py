"""all_reduce_coalesced and dist._coalescing_manager with all_reduce, all_gather_single
(all_gather_into_tensor) and reduce_scatter_single (reduce_scatter_tensor) inside, sync and
async (FSDP style), against refs references."""

import os

import pytest

import cases_collectives_coalesced as cases
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))
COUNTS = (13, 0, 1, 1000, 7)
WORLD_SIZES = (1, 2, 3, 4, 8)


def _ids(ws):
    return f"ws{ws}"


def _check_reduced(results, ws, dtype, counts, op, seed_of, where):
    failures = refs.errors_of(results, where)
    for r, res in enumerate(results):
        if not isinstance(res, list):
            continue
        if len(res) != len(counts):
            failures.append(f"rank {r}: {where}: {len(res)} results for {len(counts)} tensors")
            continue
        for i, c in enumerate(counts):
            expected, tol = refs.expected_reduction(seed_of(i), ws, dtype, c, op)
            msg = refs.compare(res[i], expected, tol, f"rank {r}: {where}: tensor {i} (count {c})",
                               dtype)
            if msg:
                failures.append(msg)
    return failures


@pytest.mark.parametrize("dtype,op", [("float32", "SUM"), ("bfloat16", "SUM"), ("int64", "MAX")])
@pytest.mark.parametrize("ws", WORLD_SIZES, ids=_ids)
def test_all_reduce_coalesced(worlds, ws, dtype, op):
    results = worlds.run(ws, cases.all_reduce_coalesced, seed=SEED, dtype=dtype, counts=COUNTS,
                         op=op)
    failures = _check_reduced(results, ws, dtype, COUNTS, op,
                              lambda i: refs.seed_for(SEED, "arc", i),
                              f"all_reduce_coalesced {dtype} {op} world {ws}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("async_ops", (False, True), ids=("sync", "async"))
@pytest.mark.parametrize("ws", WORLD_SIZES, ids=_ids)
def test_coalescing_manager_all_reduce(worlds, ws, async_ops):
    dtype = "float32"
    results = worlds.run(ws, cases.coalescing_manager, seed=SEED, dtype=dtype, counts=COUNTS,
                         kind="all_reduce", async_ops=async_ops)
    failures = _check_reduced(results, ws, dtype, COUNTS, "SUM",
                              lambda i: refs.seed_for(SEED, "cm", "all_reduce", i),
                              f"_coalescing_manager(all_reduce, async_ops={async_ops}) world {ws}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("async_ops", (False, True), ids=("sync", "async"))
@pytest.mark.parametrize("ws", WORLD_SIZES, ids=_ids)
def test_coalescing_manager_all_gather(worlds, ws, async_ops):
    dtype = "bfloat16"
    where = f"_coalescing_manager(all_gather_single, async_ops={async_ops}) world {ws}"
    results = worlds.run(ws, cases.coalescing_manager, seed=SEED, dtype=dtype, counts=COUNTS,
                         kind="all_gather", async_ops=async_ops)
    failures = refs.errors_of(results, where)
    for r, res in enumerate(results):
        if not isinstance(res, list):
            continue
        for i, c in enumerate(COUNTS):
            expected = refs.concat_inputs(refs.seed_for(SEED, "cm", "all_gather", i), range(ws),
                                          dtype, c)
            msg = refs.compare(res[i], expected, None, f"rank {r}: {where}: tensor {i} (count {c})",
                               dtype)
            if msg:
                failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("async_ops", (False, True), ids=("sync", "async"))
@pytest.mark.parametrize("ws", WORLD_SIZES, ids=_ids)
def test_coalescing_manager_reduce_scatter(worlds, ws, async_ops):
    dtype = "float32"
    where = f"_coalescing_manager(reduce_scatter_single, async_ops={async_ops}) world {ws}"
    results = worlds.run(ws, cases.coalescing_manager, seed=SEED, dtype=dtype, counts=COUNTS,
                         kind="reduce_scatter", async_ops=async_ops)
    failures = refs.errors_of(results, where)
    for r, res in enumerate(results):
        if not isinstance(res, list):
            continue
        for i, c in enumerate(COUNTS):
            full, tol = refs.expected_reduction(refs.seed_for(SEED, "cm", "reduce_scatter", i), ws,
                                                dtype, ws * c, "SUM")
            part = slice(r * c, (r + 1) * c)
            msg = refs.compare(res[i], full[part], tol[part],
                               f"rank {r}: {where}: tensor {i} (count {c})", dtype)
            if msg:
                failures.append(msg)
    assert not failures, refs.report(failures)
