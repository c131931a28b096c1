"""barrier (really waits for the last rank; many in a row; async) and monitored_barrier
(works when every rank arrives; when some rank skips it, the waiting ranks fail within a
short bound and rank 0's error names the missing rank(s))."""

import re

import pytest

import cases_collectives_barrier as cases
import harness
import refs

MB_TIMEOUT_S = 2.0


@pytest.mark.parametrize("ws", (1, 2, 3, 4, 8), ids=lambda w: f"ws{w}")
def test_barrier_waits_for_late_rank(worlds, ws):
    delay = 0.3
    late = ws - 1
    results = worlds.run(ws, cases.barrier_waits_for_late_rank, late_rank=late, delay_s=delay,
                         repeats=2)
    failures = refs.errors_of(results, f"barrier world {ws}")
    if failures:
        assert not failures, refs.report(failures)
    # CLOCK_MONOTONIC is one clock for every process on the machine
    for i, late_enter in enumerate(results[late]["enter"]):
        for r, res in enumerate(results):
            if res["leave"][i] < late_enter:
                early = late_enter - res["leave"][i]
                failures.append(f"rank {r}: barrier #{i} returned {early:.3f} s before rank "
                                f"{late} entered it (world {ws})")
    for r, res in enumerate(results):
        if not res["async"]:
            failures.append(f"rank {r}: async barrier: wait() / is_completed() gave False")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (1, 2, 3, 4, 8), ids=lambda w: f"ws{w}")
def test_many_barriers(worlds, ws):
    results = worlds.run(ws, cases.many_barriers, n=50)
    failures = refs.errors_of(results, f"50 barriers world {ws}")
    want = ws * (ws + 1) // 2
    failures += [f"rank {r}: all_reduce after the barriers gave {v}, expected {want}"
                 for r, v in enumerate(results) if not isinstance(v, dict) and v != want]
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (1, 2, 3, 4), ids=lambda w: f"ws{w}")
def test_monitored_barrier_all_arrive(worlds, ws):
    results = worlds.run(ws, cases.monitored_barrier_all_arrive, timeout_s=10, via="pg")
    failures = refs.errors_of(results, f"ProcessGroup.monitored_barrier world {ws}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (2, 3), ids=lambda w: f"ws{w}")
def test_monitored_barrier_public_api(worlds, ws):
    """dist.monitored_barrier itself. torch 2.13 refuses any backend but gloo in Python
    before the backend is reached; `import ringx` sends ringx groups to ringx's."""
    results = worlds.run(ws, cases.monitored_barrier_all_arrive, timeout_s=10, via="public",
                         wait_all_ranks=True)
    failures = refs.errors_of(results, f"dist.monitored_barrier world {ws}")
    assert not failures, refs.report(failures)


def _names_rank(text, k):
    """Whether `text` names rank k as a rank ("Rank 3 failed", "ranks 1, 3", "ranks [1, 3]",
    "rank(s) 1 and 3")
    (the "(rank R, seq S)" prefix of ringx's messages names the reporter and does not count:
    after "rank R" must come more ranks, not ", seq")."""
    pattern = rf"(?i)\brank(?:s|\(s\))?\s*[:=\[({{]?\s*(?:\d+\s*(?:,|and)\s*)*{k}\b(?!\s*,\s*seq)"
    return re.search(pattern, text) is not None


@pytest.mark.parametrize("via", ("pg", "public"))
@pytest.mark.parametrize("ws,missing,wait_all", [
    pytest.param(2, (1,), False, id="ws2-skip1"),
    pytest.param(3, (2,), False, id="ws3-skip2"),
    pytest.param(4, (1, 3), True, id="ws4-skip1,3-wait_all_ranks"),
])
def test_monitored_barrier_reports_missing_rank(worlds, ws, missing, wait_all, via):
    results = worlds.run(ws, cases.monitored_barrier_missing, missing=list(missing),
                         timeout_s=MB_TIMEOUT_S, wait_all_ranks=wait_all, via=via, timeout=40)
    failures = []
    bound = MB_TIMEOUT_S + 10
    for r, res in enumerate(results):
        where = f"rank {r} (ranks {list(missing)} skip, world {ws})"
        out = res["outcome"]
        if r in missing:
            pass
        elif out == "returned":
            failures.append(f"{where}: monitored_barrier returned although ranks "
                            f"{list(missing)} never called it")
        else:
            _, tname, text = out
            if res["seconds"] > bound:
                failures.append(f"{where}: raised only after {res['seconds']:.1f} s "
                                f"(timeout {MB_TIMEOUT_S} s)")
            if r == 0:
                named = [k for k in missing if _names_rank(text, k)]
                want = list(missing) if wait_all else list(missing[:1])
                if not set(want) <= set(named):
                    failures.append(f"{where}: rank 0's error should name rank(s) {want} as "
                                    f"missing: {tname}: {text!r}")
                present = [k for k in range(1, ws) if k not in missing and _names_rank(text, k)]
                if present:
                    failures.append(f"{where}: rank 0's error names rank(s) {present}, which "
                                    f"did arrive: {tname}: {text!r}")
                if harness.BACKEND == "ringx" and ("ringx" not in text
                                                   or "monitored_barrier" not in text):
                    failures.append(f"{where}: error should name ringx and monitored_barrier: "
                                    f"{text!r}")
        if "destroy" in res:
            failures.append(f"{where}: destroy_process_group(subgroup) raised {res['destroy']}")
        if res["sanity"] != float(ws):
            failures.append(f"{where}: all_reduce on the default group afterwards gave "
                            f"{res['sanity']}")
    assert not failures, refs.report(failures)
