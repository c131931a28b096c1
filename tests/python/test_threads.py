"""Where ringx's progress and completion threads run.

When the ranks on a host have no core to spare (LOCAL_WORLD_SIZE >= the CPUs a
process may use), ringx pins rank r's threads to CPU r (mod the CPUs), unless
RINGX_PIN_THREADS=0; with cores to spare it leaves them to the scheduler.  The
expectation is computed from the CPUs the workers see, so the test checks the
branch the machine it runs on takes.
"""

import pytest

import cases_threads
import harness

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="ringx's threads")

WS = 2


@pytest.mark.parametrize("setting", ["auto", "off"])
def test_progress_threads_pinned_only_when_ranks_fill_the_cpus(setting):
    env = {"RINGX_PIN_THREADS": "0"} if setting == "off" else {}
    with harness.World(WS, env=env) as world:
        results = world.run(cases_threads.pinned_threads)
    for r, res in enumerate(results):
        assert res["sum"] == WS, f"rank {r}: all_reduce gave {res['sum']}"
        cpus = res["cpus"]
        pins = set(res["pinned"].values())
        if setting == "auto" and 2 <= len(cpus) <= WS:
            # the progress and the completion thread
            assert len(res["pinned"]) >= 2 and pins == {cpus[r % len(cpus)]}, (
                f"rank {r}: expected ringx's threads on CPU {cpus[r % len(cpus)]}, pinned: {res['pinned']}")
        else:
            assert not res["pinned"], f"rank {r}: threads pinned {res['pinned']} (cpus {cpus})"
