"""World 64 on one host, on however few cores: group creation, shared memory for 64
ranks (each maps every peer's segment), UCX connections, file descriptors and
threads, then small and chunked collectives checked on every rank."""

import time

import pytest

import cases_many_ranks
import harness

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="ringx's limits")

WS = 64
# What one rank may hold open: well inside the usual soft limit of 1024.
MAX_FDS = 512


def test_world_64_on_one_host_runs_all_reduce_broadcast_and_barrier():
    start = time.monotonic()
    with harness.World(WS, start_timeout=600, pg_timeout=600) as world:
        world.start()
        started = time.monotonic()
        results = world.run(cases_many_ranks.small_and_chunked_collectives, iters=20, timeout=600)
    for r, res in enumerate(results):
        assert not res["wrong"], f"rank {r}: {res['wrong'][:5]}"
        assert res["fds"] <= MAX_FDS, f"rank {r} holds {res['fds']} file descriptors"
    print(f"world {WS}: started in {started - start:.1f} s, 20 rounds of all_reduce, 2 broadcasts and "
          f"a barrier plus one chunked all_reduce in {max(r['seconds'] for r in results):.1f} s; per rank "
          f"at most {max(r['fds'] for r in results)} fds, {max(r['threads'] for r in results)} threads")
