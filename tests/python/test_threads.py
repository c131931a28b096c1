"""Where ringx's progress and completion threads run.

With RINGX_PIN_THREADS=1, when the ranks on a host have no core to spare
(LOCAL_WORLD_SIZE >= the CPUs a process may use), ringx pins rank r's threads to
CPU r (mod the CPUs); by default, or with cores to spare, it leaves them to the
scheduler.  The
expectation is computed from the CPUs the workers see, so the test checks the
branch the machine it runs on takes.
"""

import pytest

import cases_threads
import harness

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="ringx's threads")

WS = 2


@pytest.mark.parametrize("setting", ["on", "default", "off"])
def test_progress_threads_pinned_only_when_asked_and_ranks_fill_the_cpus(setting):
    env = {"on": {"RINGX_PIN_THREADS": "1"}, "default": {}, "off": {"RINGX_PIN_THREADS": "0"}}[setting]
    with harness.World(WS, env=env) as world:
        results = world.run(cases_threads.pinned_threads)
    for r, res in enumerate(results):
        assert res["sum"] == WS, f"rank {r}: all_reduce gave {res['sum']}"
        cpus = res["cpus"]
        pins = set(res["pinned"].values())
        if setting == "on" and 2 <= len(cpus) <= WS:
            # the progress and the completion thread
            assert len(res["pinned"]) >= 2 and pins == {cpus[r % len(cpus)]}, (
                f"rank {r}: expected ringx's threads on CPU {cpus[r % len(cpus)]}, pinned: {res['pinned']}")
        else:
            assert not res["pinned"], f"rank {r}: threads pinned {res['pinned']} (cpus {cpus})"


def test_synchronous_collectives_do_not_wake_the_progress_thread():
    # The caller drives its own op; the progress thread, idle, wakes only at its
    # nap's limit (100 ms) to look at deadlines. A hand-off per call would be
    # a switch per call.
    iters = 2000
    with harness.World(WS) as world:
        results = world.run(cases_threads.progress_thread_switches, iters=iters)
    for r, res in enumerate(results):
        assert res["threads"] == 1, f"rank {r}: {res['threads']} threads named ringx-progress"
        allowed = 20 * res["seconds"] + 10
        assert res["switches"] <= allowed, (
            f"rank {r}: the progress thread switched {res['switches']} times in {iters} synchronous "
            f"all_reduces ({res['seconds']:.2f} s)")
