"""all_reduce correctness with each algorithm forced through RINGX_ALGO.

The cost model picks one algorithm per size, so the default suite exercises each
algorithm only where it wins.  Here every all_reduce algorithm runs the whole
dtype x op matrix, odd and large counts and non-power-of-two worlds, and the
worker logs (RINGX_DEBUG=INFO names the algorithm of every call) prove the forced
algorithm is the one that ran.
"""

import re

import pytest

import cases_allreduce
import cases_forced
import harness
import refs
from test_allreduce import (LARGE, LARGE_DTYPES, LARGE_OPS, SEED, SWEEP_COUNTS, SWEEP_DTYPES,
                            check_allreduce, check_count_sweep)

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="RINGX_ALGO is ringx's")

ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "shm", "oneshot", "cma")
WORLD_SIZES = (2, 3, 4)
COUNTS = (0, 1, 7, 1000)
ALGO_LINE = re.compile(r"ringx: all_reduce \(rank \d+, seq \d+\): algorithm (\w+), (\d+) bytes")


def algorithms_used(world, since):
    """{algorithm: number of all_reduce calls} over every rank's log from offsets `since` on."""
    used = {}
    for r in range(world.size):
        for m in ALGO_LINE.finditer(world.log_text(r, since[r])):
            used[m.group(1)] = used.get(m.group(1), 0) + 1
    return used


# The one-shot is for many ranks on few cores: it runs oversubscribed too.
@pytest.mark.parametrize("algo, ws", [(a, ws) for a in ALGORITHMS for ws in WORLD_SIZES] + [("oneshot", 8)],
                         ids=[f"{a}-ws{ws}" for a in ALGORITHMS for ws in WORLD_SIZES] + ["oneshot-ws8"])
def test_forced_algorithm_matches_reference(forced_worlds, algo, ws):
    world = forced_worlds(ws)
    spec = f"all_reduce:{algo}"

    def run(case, **kwargs):
        return world.run(cases_forced.on_forced_group, spec=spec, case=harness.case_name(case), **kwargs)

    since = world.log_sizes()
    # The whole matrix in one call of the case: a round trip to every rank costs more
    # than a small all_reduce when ranks outnumber cores. At world 8 the small cells
    # are test_allreduce.py's, where the cost model picks the one-shot on this VM.
    cells = [] if ws > max(WORLD_SIZES) else [(d, n, refs.ops_for(d)) for d in refs.DTYPES for n in COUNTS]
    cells += [(d, LARGE, list(LARGE_OPS)) for d in LARGE_DTYPES]
    results = run(cases_allreduce.allreduce_cells, seed=SEED, cells=cells)
    failures = []
    for dtype, count, ops in cells:
        failures += check_allreduce([r[(dtype, count)] for r in results], ws, SEED, count, dtype, ops)
    results = run(cases_allreduce.allreduce_counts, seed=SEED, counts=SWEEP_COUNTS, dtypes=SWEEP_DTYPES)
    failures += check_count_sweep(results, ws)
    assert not failures, refs.report(failures)

    used = algorithms_used(world, since)
    assert set(used) == {algo}, f"RINGX_ALGO=all_reduce:{algo} but the logs show {used}"
