"""torchft on ringx (issue 43): ringx.torchft's process groups under torchft's own
process-group tests, and a Manager run that loses a replica and heals a new one.

torchft's MultiPgBaseTest (torchft/process_group_test.py, shipped in its wheel) runs
every rank of a group as a thread of one process: each collective on every rank,
then "with resiliency": the last rank drops its group, the others must raise from
the same collective within a 1 s timeout and reconfigure. Here its subclasses build
ringx's groups instead of gloo's.

The Manager test starts a lighthouse and three replica processes
(tools/torchft_replicas.py, DDP on a small model), SIGKILLs one mid-training, checks
the other two commit steps without it, starts a replacement that heals from them, and
compares every replica's final model and optimizer state: they must be equal to the
bit.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import pytest
import torch
from parameterized import parameterized
from torchft.process_group_test import _ALL_COLLECTIVES, MultiPgBaseTest

import harness
from ringx.torchft import ProcessGroupBabyRingx, ProcessGroupRingx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import torchft_replicas  # noqa: E402

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="ringx's torchft process groups")


def _multi_pg_tests(name, make_pg, resiliency):
    """torchft's MultiPgBaseTest on groups from `make_pg`: every collective, then
    "with resiliency" for those in `resiliency`."""

    class Tests(MultiPgBaseTest):
        WORLD_SIZE = 3

        @classmethod
        def _create_pg(cls, backend):
            return make_pg()

        @parameterized.expand(_ALL_COLLECTIVES)
        def test_collective(self, collective):
            self._run_parallel(collective, device="cpu")

        @parameterized.expand(resiliency)
        def test_collective_with_resiliency(self, collective):
            self._run_with_resiliency(collective, device="cpu")

    Tests.__name__ = Tests.__qualname__ = name
    return Tests


RingxMultiPgTest = _multi_pg_tests("RingxMultiPgTest", lambda: ProcessGroupRingx(timeout=timedelta(seconds=10)),
                                   _ALL_COLLECTIVES)
# Each resiliency case of the Baby group starts three fresh subprocesses (8-10 s
# on the 2-core VM), so two collectives stand for the rest there.
BabyRingxMultiPgTest = _multi_pg_tests("BabyRingxMultiPgTest",
                                       lambda: ProcessGroupBabyRingx(timeout=timedelta(seconds=30)),
                                       ["allreduce", "broadcast"])


def test_a_killed_replica_is_replaced_heals_and_ends_equal(tmp_path):
    out = str(tmp_path)
    run = torchft_replicas.run_kill_and_heal(out, "ringx", n_steps=14, kill_at=4)
    print(f"[torchft] ringx: from the kill to the survivors' next committed step: {run.recovery_s:.2f} s")
    states = [torch.load(os.path.join(out, f"replica{r}.pt")) for r in range(3)]
    for r in (1, 2):
        torch.testing.assert_close(states[r], states[0], rtol=0, atol=0, msg=lambda m: f"replica {r}: {m}")
    # The replacement healed (its first step is the survivors' next, not step 1)
    # and trained with all three.
    first = run.rejoined[0][0]
    assert first > 8 and run.rejoined[-1][0] == 14, run.rejoined
    assert any(p == 3 for _, _, p in run.rejoined), run.rejoined
