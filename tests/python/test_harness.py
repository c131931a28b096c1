"""The harness reports hangs, crashes and exceptions quickly, and recovers."""

import os
import time

import pytest

import cases_harness
import harness
import refs


@pytest.fixture(scope="module")
def private_world(tmp_path_factory):
    """A world of 2 of our own, so killing it does not disturb the shared pool."""
    w = harness.World(2, harness.BACKEND, log_dir=str(tmp_path_factory.mktemp("world2logs")))
    try:
        yield w
    finally:
        w.close()
        w.kill()


def _sum_ok(w):
    res = w.run(cases_harness.environment, seed=1, dtype="int8", count=3)
    assert [r["sum_of_ranks"] for r in res] == [1, 1]
    return res


def test_hung_case_times_out_and_world_restarts(private_world):
    w = private_world
    _sum_ok(w)
    gen = w.generation
    t0 = time.monotonic()
    with pytest.raises(harness.CaseTimeout) as info:
        w.run(cases_harness.only_rank0_allreduce, timeout=3)
    elapsed = time.monotonic() - t0
    assert elapsed < 15, f"the timeout took {elapsed:.1f} s"
    text = str(info.value)
    assert "rank 0 did not answer within 3 s" in text, text
    assert "rank 1 answered normally" in text, text
    assert not w.alive
    _sum_ok(w)
    assert w.generation == gen + 1


def test_crash_is_reported_with_output(private_world):
    w = private_world
    with pytest.raises(harness.CaseCrashed) as info:
        w.run(cases_harness.rank1_exits, code=7, timeout=30)
    text = str(info.value)
    assert "rank 1 died (exit code 7)" in text, text
    assert "about to exit on purpose" in text, text
    _sum_ok(w)


def test_exception_is_reported_with_traceback(private_world):
    w = private_world
    with pytest.raises(harness.CaseFailed) as info:
        w.run(cases_harness.rank1_raises, marker="xyzzy")
    text = str(info.value)
    assert "rank 1 raised ValueError: boom xyzzy" in text, text
    assert "cases_harness.py" in text and "Traceback" in text, text
    _sum_ok(w)


@pytest.mark.parametrize("ws", (3,), ids=lambda w: f"ws{w}")
def test_worker_environment_and_inputs(worlds, backend, ws):
    res = worlds.run(ws, cases_harness.environment, seed=5, dtype="bfloat16", count=11)
    ports = {r["env"]["MASTER_PORT"] for r in res}
    assert len(ports) == 1
    for rank, r in enumerate(res):
        env = r["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank) == str(r["rank"])
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == str(ws)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["OMP_NUM_THREADS"] == "1" and r["threads"] == 1
        assert env["RINGX_TEST_BACKEND"] == backend
        assert r["ringx_imported"] == (backend == "ringx")
        assert r["ppid"] != os.getpid()  # forked by the forkserver, not by pytest
        # inputs are the same function of (seed, rank, dtype, count) in parent and worker
        assert refs.compare(r["input"], refs.make_input(5, rank, "bfloat16", 11), None,
                            f"rank {rank} input", "bfloat16") is None
