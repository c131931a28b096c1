"""Where ringx must behave as gloo does (issue 15): all_gather_coalesced (empty inputs
included), monitored_barrier with a zero or tiny timeout (fails at once, naming the ranks
that did not arrive), sparse all_reduce (SUM of COO tensors), coalescing with a device
(one Work per batch of collectives or point-to-point ops) and the torch profiler records
(names, input shapes and counts per call, against gloo's in the same run)."""

import os
import re

import pytest
import torch

import cases_parity as cases
import harness
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))


def _ids(ws):
    return f"ws{ws}"


# ---------------------------------------------------------------- all_gather_coalesced

@pytest.mark.parametrize("async_op", (False, True), ids=("sync", "async"))
@pytest.mark.parametrize("ws", (1, 2, 3), ids=_ids)
def test_all_gather_coalesced_matches_reference(worlds, ws, async_op):
    shapes = [(2, 3), (0,), (5,), (1,), (0, 4), (7,)]
    dtype = "float32"
    where = f"all_gather_coalesced(async_op={async_op}) world {ws}"
    results = worlds.run(ws, cases.all_gather_coalesced, seed=SEED, dtype=dtype, shapes=shapes,
                         async_op=async_op)
    failures = refs.errors_of(results, where)
    for r, res in enumerate(results):
        outs = res.get("all_gather_coalesced")
        if outs is None:
            continue
        for src in range(ws):
            for i, shape in enumerate(shapes):
                n = 1
                for s in shape:
                    n *= s
                want = refs.make_input(refs.seed_for(SEED, "agc", i), src, dtype, n).reshape(shape)
                msg = refs.compare(outs[src][i], want, None,
                                   f"rank {r}: {where}: output [{src}][{i}] {shape}", dtype)
                if msg:
                    failures.append(msg)
    assert not failures, refs.report(failures)


# ---------------------------------------------------------------- monitored_barrier

def _names_rank(text, k):
    """Whether `text` names rank k as one that did not arrive ("Rank 1 failed",
    "rank(s) 1, 2 failed"); the "(rank R, seq S)" prefix of ringx's messages does not
    count."""
    pattern = rf"(?i)\branks?(?:\(s\))?\s*(?:\d+\s*(?:,|and)\s*)*{k}\b(?!\s*,\s*seq)"
    return re.search(pattern, text) is not None


GLOO_WAIT_ALL_ZERO = pytest.mark.skipif(
    harness.BACKEND == "gloo",
    reason="with wait_all_ranks gloo hands each receive the whole timeout, and gloo reads 0 as "
           "its default timeout")


@pytest.mark.parametrize("ws,busy,timeout_ms,wait_all", [
    pytest.param(2, (1,), 0, False, id="ws2-timeout0"),
    pytest.param(2, (1,), 10, False, id="ws2-timeout10ms"),
    pytest.param(3, (1, 2), 10, True, id="ws3-timeout10ms-wait_all_ranks"),
    pytest.param(3, (1, 2), 0, True, id="ws3-timeout0-wait_all_ranks", marks=GLOO_WAIT_ALL_ZERO),
])
def test_monitored_barrier_short_timeout_fails_at_once_and_then_the_group_fails_at_once(
        worlds, ws, busy, timeout_ms, wait_all):
    """The busy ranks sleep, then (ringx) call the barrier late too: they fail at once as
    well, their wait for rank 0's release timing out. gloo's late ranks would wait for rank
    0's release without limit, so under gloo they skip the call. Afterwards an all_reduce on
    the barrier's group raises at once on every rank, for both backends: gloo closes the
    pairs whose wait timed out, ringx's timeout poisons the group."""
    busy_s = 2.0
    results = worlds.run(ws, cases.monitored_barrier_short_timeout, busy=list(busy),
                         busy_s=busy_s, timeout_ms=timeout_ms, wait_all_ranks=wait_all,
                         late_call=harness.BACKEND == "ringx", timeout=40,
                         # gloo, after a zero timeout: the all_reduce hangs (no answer in 40 s).
                         group_call=not (harness.BACKEND == "gloo" and timeout_ms == 0))
    res0 = results[0]
    where = f"rank 0 (ranks {list(busy)} busy {busy_s} s, timeout {timeout_ms} ms, world {ws})"
    failures = []
    if res0["outcome"] == "returned":
        failures.append(f"{where}: monitored_barrier returned after {res0['seconds']:.2f} s; it "
                        f"should fail at once")
    else:
        tname, text = res0["outcome"]
        if res0["seconds"] > 1.0:
            failures.append(f"{where}: raised only after {res0['seconds']:.2f} s: {text!r}")
        want = list(busy) if wait_all else list(busy[:1])
        missing = [k for k in want if not _names_rank(text, k)]
        if missing:
            failures.append(f"{where}: the error should name rank(s) {missing} as not arrived: "
                            f"{tname}: {text!r}")
        if harness.BACKEND == "ringx" and not text.startswith("ringx: monitored_barrier (rank 0"):
            failures.append(f"{where}: the error should start 'ringx: monitored_barrier (rank 0': "
                            f"{text!r}")
    for r in busy:
        res = results[r]
        if res["outcome"] == "returned" or res["seconds"] > 1.0:
            failures.append(f"rank {r} (busy, then late): monitored_barrier should fail at once; "
                            f"got {res['outcome']!r} after {res['seconds']:.2f} s")
    for r, res in enumerate(results):
        if res["group_call"] is not None:
            got, took = res["group_call"]
            if not isinstance(got, str) or took > 1.0:
                failures.append(f"rank {r}: all_reduce on the barrier's group afterwards gave "
                                f"{got!r} after {took:.2f} s; it should raise at once, as gloo's does")
            elif harness.BACKEND == "ringx" and "failed earlier" not in got:
                failures.append(f"rank {r}: all_reduce on the barrier's group afterwards should say "
                                f"the group failed earlier: {got!r}")
        if res["sanity"] != float(ws):
            failures.append(f"rank {r}: all_reduce on the default group afterwards gave "
                            f"{res['sanity']}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (2, 3), ids=_ids)
def test_monitored_barrier_backend_passes_when_all_arrive(worlds, ws):
    results = worlds.run(ws, cases.monitored_barrier_backend_all_arrive)
    assert all(isinstance(t, float) and t < 10 for t in results), results


@pytest.mark.parametrize("how", ("_set_pg_timeout", "set_timeout"))
def test_set_pg_timeout_sets_the_timeout_of_later_calls(worlds, how):
    """torch's _set_pg_timeout reaches ringx groups (torch 2.13 itself sets only gloo and
    NCCL ones, warning for the others), as does ProcessGroup.set_timeout: a call after it
    times out at the new limit."""
    results = worlds.run(2, cases.set_pg_timeout_then_time_out, new_timeout_s=1.0, how=how)
    caught, error, took = results[0]
    assert caught == [] and results[1][0] == [], results
    assert error == ("RuntimeError" if harness.BACKEND == "gloo" else "DistBackendError"), results
    assert 0.8 <= took < 10, results


# ---------------------------------------------------------------- sparse all_reduce

SPARSE_CASES = [((6,), 1, "float32"), ((5, 4), 2, "float64"), ((6, 3), 1, "int64"),
                ((4, 2, 3), 1, "float32"), ((3, 3), 2, "float32")]


@pytest.mark.parametrize("ws", (1, 2, 3), ids=_ids)
def test_sparse_all_reduce_sum_matches_dense_reference(worlds, ws):
    results = worlds.run(ws, cases.sparse_all_reduce, seed=SEED, cases=SPARSE_CASES)
    where = f"sparse all_reduce world {ws}"
    failures = refs.errors_of(results, where)
    want = cases.sparse_reference(SEED, ws, SPARSE_CASES)
    for r, res in enumerate(results):
        for i, (is_sparse, dense) in enumerate(res.get("sparse_all_reduce", [])):
            label = f"rank {r}: {where}: case {SPARSE_CASES[i]}"
            if not is_sparse:
                failures.append(f"{label}: the tensor is no longer sparse")
            msg = refs.compare(dense, want[i], None, label, SPARSE_CASES[i][2])
            if msg:
                failures.append(msg)
        if res["max"] == "returned" or "sparse" not in res["max"][1]:
            failures.append(f"rank {r}: all_reduce(MAX) of a sparse tensor should raise an error "
                            f"that says 'sparse'; got {res['max']!r}")
        # torch's dispatcher refuses a sparse broadcast before any backend sees it
        if res["bcast"] == "returned":
            failures.append(f"rank {r}: broadcast of a sparse tensor returned")
        # gloo says "Sparse dimensions do not match"
        if ws > 1 and (res["shapes"] == "returned"
                       or not re.search(r"shape|dimensions", res["shapes"][1])):
            failures.append(f"rank {r}: ranks passing sparse tensors of different shapes should "
                            f"get an error that says so; got {res['shapes']!r}")
        # ringx's own limit (gloo sums it); refused alike on every rank, before any message
        if harness.BACKEND == "ringx" and (res["dims"] == "returned" or "dimensions" not in res["dims"][1]):
            failures.append(f"rank {r}: a 65-dimensional sparse tensor should be refused; got {res['dims']!r}")
        if res["sanity"] != float(ws):
            failures.append(f"rank {r}: all_reduce afterwards gave {res['sanity']}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (2, 3), ids=_ids)
def test_sparse_all_reduce_runs_in_the_background_in_call_order(worlds, ws):
    """async_op=True returns before the indices and values have moved (the big calls,
    16 MiB of values per rank, are not all complete when they return), sparse and dense
    calls issued alternately and waited for in reverse order all give their sums, the
    Future carries the result, and the result is an ordinary tensor (not an inference
    tensor, which later in-place updates outside inference mode could not touch)."""
    results = worlds.run(ws, cases.sparse_all_reduce_async, seed=SEED, cases=SPARSE_CASES,
                         big_rows=1 << 16, tries=5, timeout=120)
    want = cases.sparse_reference(SEED, ws, SPARSE_CASES)
    failures = []
    for r, res in enumerate(results):
        for i, (is_sparse, dense, inference) in enumerate(res["sparse"]):
            label = f"rank {r}: asynchronous sparse all_reduce world {ws}: case {SPARSE_CASES[i]}"
            if not is_sparse or inference:
                failures.append(f"{label}: sparse {is_sparse}, values are inference tensors {inference}")
            msg = refs.compare(dense, want[i], None, label, SPARSE_CASES[i][2])
            if msg:
                failures.append(msg)
        if res["dense"] != [3.0 * ws] * len(SPARSE_CASES):
            failures.append(f"rank {r}: the dense all_reduces between them gave {res['dense']}")
        if res["future"] != float(want[0].sum()):
            failures.append(f"rank {r}: the Future's value summed to {res['future']}, "
                            f"expected {float(want[0].sum())}")
        if res["pending_at_return"] == 0:
            failures.append(f"rank {r}: every big sparse all_reduce had completed when its "
                            "call returned: the call waited for the data")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (2, 3), ids=_ids)
def test_sparse_all_reduce_call_returns_before_the_other_ranks_call(worlds, ws):
    """As gloo's, the call returns at once: the nonzero counts move in the background
    with the rest. Rank 0 starts it, then receives from ranks that call only after
    sending to it, and waits; every result is the sum."""
    late_s = 1.0
    results = worlds.run(ws, cases.sparse_all_reduce_before_peers, seed=SEED, cases=SPARSE_CASES[:2],
                         late_s=late_s, timeout=60)
    want = cases.sparse_reference(SEED, ws, SPARSE_CASES[:2])
    failures = []
    for r, res in enumerate(results):
        for i, dense in enumerate(res["sparse"]):
            msg = refs.compare(dense, want[i], None, f"rank {r}: case {SPARSE_CASES[i]}", SPARSE_CASES[i][2])
            if msg:
                failures.append(msg)
    slow = [t for t in results[0]["returned_after"] if t >= late_s / 2]
    if slow:
        failures.append(f"rank 0: its calls returned after {results[0]['returned_after']} s: they waited "
                        "for the ranks that called later")
    want_received = [[float(src)] * 2 for _ in SPARSE_CASES[:2] for src in range(1, ws)]
    if results[0]["received"] != want_received:
        failures.append(f"rank 0 received {results[0]['received']}, expected {want_received}")
    assert not failures, refs.report(failures)


# ---------------------------------------------------------------- coalescing with a device

COUNTS = (13, 0, 1, 300, 7)


@pytest.mark.skipif(harness.BACKEND == "gloo", reason="gloo does not implement startCoalescing")
@pytest.mark.parametrize("ws", (1, 2, 3, 4), ids=_ids)
def test_coalescing_manager_with_device_is_one_work(worlds, ws):
    results = worlds.run(ws, cases.coalesced_with_device, seed=SEED, counts=COUNTS)
    where = f"_coalescing_manager(device=cpu, async_ops=True) world {ws}"
    failures = refs.errors_of(results, where)
    for r, res in enumerate(results):
        for kind, (nworks, outs) in ((k, v) for k, v in res.items() if k != refs.ERROR_KEY):
            label = f"rank {r}: {where}: {kind}"
            if nworks != 1:
                failures.append(f"{label}: the manager holds {nworks} Works, expected 1")
            for i, c in enumerate(COUNTS):
                s = refs.seed_for(SEED, "cmd", kind, i)
                if kind == "all_reduce":
                    want, tol = refs.expected_reduction(s, ws, "float32", c, "SUM")
                elif kind == "all_gather_into_tensor":
                    want, tol = refs.concat_inputs(s, range(ws), "float32", c), None
                elif kind == "reduce_scatter_tensor":
                    full, tol = refs.expected_reduction(s, ws, "float32", ws * c, "SUM")
                    want, tol = full[r * c:(r + 1) * c], tol[r * c:(r + 1) * c]
                else:
                    want, tol = refs.make_input(s, i % ws, "float32", c), None
                msg = refs.compare(outs[i], want, tol, f"{label}: tensor {i} (count {c})",
                                   "float32")
                if msg:
                    failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.skipif(harness.BACKEND == "gloo", reason="gloo does not implement startCoalescing")
@pytest.mark.parametrize("ws", (1, 3), ids=_ids)
def test_coalescing_refuses_reductions_of_another_dtype(worlds, ws):
    results = worlds.run(ws, cases.coalesced_mixed_reductions)
    failures = []
    for r, res in enumerate(results):
        err = res["error"]
        if err is None or err[0] != "ValueError" or "share dtype and reduce op" not in err[1]:
            failures.append(f"rank {r}: an int64 reduce after a float32 one in one coalescing "
                            f"block should raise a ValueError that says they must share dtype "
                            f"and reduce op; got {err!r}")
        if r == 0:
            want = torch.full((3,), float(ws * (ws + 1) // 2))
            msg = refs.compare(res["reduced"], want, None, "rank 0: the float32 reduce", "float32")
            if msg:
                failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.skipif(harness.BACKEND == "gloo", reason="gloo does not implement startCoalescing")
@pytest.mark.parametrize("raiser", ("ringx", "user"))
@pytest.mark.parametrize("ws", (2, 3), ids=_ids)
def test_coalescing_block_left_by_an_exception_runs_its_calls_and_later_ones(worlds, ws, raiser):
    results = worlds.run(ws, cases.coalescing_block_left_by_an_exception, raiser=raiser)
    where = f"coalescing block left by an exception from {raiser} code, world {ws}"
    failures = refs.errors_of(results, where)
    want_error = (("ValueError", "share dtype and reduce op") if raiser == "ringx"
                  else ("KeyError", "the block's own code failed"))
    total = float(ws * (ws + 1) // 2)
    for r, res in enumerate(results):
        if refs.ERROR_KEY in res:
            continue
        err = res["error"]
        if err is None or err[0] != want_error[0] or want_error[1] not in err[1]:
            failures.append(f"rank {r}: {where}: expected {want_error[0]} saying "
                            f"{want_error[1]!r} to leave the block; got {err!r}")
        wants = [("the block's broadcast from rank 0", res["block_broadcast"],
                  torch.full((4,), 1.0)),
                 ("later broadcast from the last rank", res["later_broadcast"],
                  torch.full((5,), float(ws))),
                 ("later all_reduce", res["later_all_reduce"], torch.full((2,), total))]
        if r == 0:
            wants.append(("the block's reduce to rank 0", res["block_reduce"],
                          torch.full((3,), total)))
        for what, got, want in wants:
            msg = refs.compare(got, want, None, f"rank {r}: {where}: {what}", "float32")
            if msg:
                failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.skipif(harness.BACKEND == "gloo", reason="gloo does not implement startCoalescing")
@pytest.mark.parametrize("ws", (2, 3), ids=_ids)
def test_root_only_rejection_in_coalescing_block_fails_every_rank(worlds, ws):
    results = worlds.run(ws, cases.coalescing_block_with_a_root_only_rejection, timeout=40)
    failures = refs.errors_of(results, f"root-only rejection in a coalescing block, world {ws}")
    for r, res in enumerate(results):
        if refs.ERROR_KEY in res:
            continue
        got = res["outcome"]
        if r == 0:
            ok = got and got[0] == "ValueError" and "output tensor 0 has 3 elements" in got[1]
            want = "the gather's ValueError naming the bad output tensor"
        else:
            ok = got and got[0] == "DistBackendError" and "rank 0 rejected its arguments" in got[1]
            want = "a DistBackendError saying rank 0 rejected its arguments"
        if not ok:
            failures.append(f"rank {r}: expected {want}; got {got!r}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (2, 3, 4), ids=_ids)
def test_batch_isend_irecv_ring_exchange_is_one_work(worlds, ws):
    results = worlds.run(ws, cases.batch_ring_exchange, seed=SEED, counts=COUNTS)
    where = f"batch_isend_irecv ring exchange world {ws}"
    failures = refs.errors_of(results, where)
    for r, res in enumerate(results):
        if "batch_isend_irecv" not in res:
            continue
        nworks, got = res["batch_isend_irecv"]
        if harness.BACKEND == "ringx" and nworks != [1, 1]:
            failures.append(f"rank {r}: {where}: batch_isend_irecv returned {nworks} Works per "
                            f"batch, expected one")
        for rnd, recvs in enumerate(got):
            for i, c in enumerate(COUNTS):
                want = refs.make_input(refs.seed_for(SEED, "bir", rnd, i), (r - 1) % ws,
                                       "float32", c)
                msg = refs.compare(recvs[i], want, None,
                                   f"rank {r}: {where}: batch {rnd} tensor {i} (count {c})",
                                   "float32")
                if msg:
                    failures.append(msg)
    assert not failures, refs.report(failures)


# ---------------------------------------------------------------- profiler records

# Calls whose gloo records show how gloo implements them rather than the call: gloo runs
# reduce_scatter_tensor as an all_reduce of the input, and the list and coalesced
# reduce-scatters as one all_reduce per input tensor. ringx records one event per call
# under the call's name, over the same inputs.
OWN_RECORDS = {
    "reduce_scatter_tensor": lambda ws: [("reduce_scatter_tensor", [[2 * ws]], 1, True)],
    "reduce_scatter": lambda ws: [("reduce_scatter", [[3]] * ws, 1, True)],
    "reduce_scatter_tensor_coalesced":
        lambda ws: [("reduce_scatter_tensor_coalesced", [[2 * ws], [3 * ws]], 1, True)],
}


@pytest.mark.skipif(harness.BACKEND != "ringx", reason="compares ringx's records with gloo's")
@pytest.mark.parametrize("ws", (2, 3), ids=_ids)
def test_profiler_records_match_gloo(worlds, ws):
    results = worlds.run(ws, cases.profiler_records, backends=["ringx", "gloo"], timeout=120)
    failures = []
    for r, res in enumerate(results):
        ringx, gloo = res["ringx"], res["gloo"]
        for (profiler, call), got in ringx.items():
            label = f"rank {r}: world {ws}: {profiler} profiler: {call}"
            if call in OWN_RECORDS:
                want = OWN_RECORDS[call](ws)
            else:
                want = gloo[(profiler, call)]
                if isinstance(want, tuple):
                    failures.append(f"{label}: the gloo reference raised {want}")
                    continue
            if got != want:
                failures.append(f"{label}: ringx recorded {got}, gloo {want}")
    assert not failures, refs.report(failures)
