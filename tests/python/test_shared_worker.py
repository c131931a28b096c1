"""Groups that share each process's one UCX worker: interleaved collectives on
several groups over the same processes, destroying one while the others go on,
groups made and destroyed by the hundred without leaking, and a dead peer that
fails every group it was in and no other."""

from __future__ import annotations

import os
import sys

import pytest

import harness

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fault_scripts"))
import faultlib as common  # noqa: E402

from test_faults import FAULT_TIMEOUT, LAUNCH_LIMIT, assert_clean_exit, assert_error, assert_ok, duration, launch, log  # noqa: E402,E501

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="the ringx backend's UCX worker")

GROUP_CYCLES = int(os.environ.get("RINGX_GROUP_CYCLES", "200"))


def test_groups_over_the_same_processes_interleave_and_outlive_each_other():
    out = launch("shared_worker.py", 3, "groups", FAULT_TIMEOUT)
    for r in range(3):
        assert_clean_exit(out[r], out)
        for label in ("interleaved", "after_destroy", "new_after_destroy"):
            assert_ok(out[r].result(label), out)


def test_a_dead_peer_fails_every_group_it_was_in_and_no_other():
    out = launch("shared_worker.py", 3, "kill", FAULT_TIMEOUT)
    for r in (0, 1):
        assert_clean_exit(out[r], out)
        rec = out[r].result("world")
        assert_error(rec, out, words=("connection to rank 2 closed",))
        log(f"kill: rank {r}: world failed after {duration(rec):.2f} s")
        assert duration(rec) < 0.5 * FAULT_TIMEOUT, out.report()
        assert_ok(out[r].result("a"), out)
    rec = out[1].result("b")
    assert_error(rec, out, words=("connection to rank 1 closed",))
    assert duration(rec) < 0.5 * FAULT_TIMEOUT, out.report()


def test_groups_made_and_destroyed_by_the_hundred_leak_no_threads_or_fds():
    warmup = 3
    out = launch("shared_worker.py", 2, "cycles", FAULT_TIMEOUT, GROUP_CYCLES + warmup, warmup,
                 timeout=LAUNCH_LIMIT + GROUP_CYCLES)
    for r in range(2):
        assert_clean_exit(out[r], out)
        base, final = out[r].event("baseline"), out[r].event("final")
        log(f"group cycles: rank {r}: {final['cycles']} in {final['seconds']:.1f} s "
            f"({final['seconds'] / final['cycles'] * 1000:.0f} ms each); threads {base['threads']} -> "
            f"{final['threads']}, fds {base['fds']} -> {final['fds']}")
        assert final["threads"] == base["threads"], f"{base['thread_names']} -> {final['thread_names']}"
        assert final["fds"] == base["fds"], f"{base['fd_kinds']} -> {final['fd_kinds']}"
