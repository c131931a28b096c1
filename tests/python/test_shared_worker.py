"""Groups that share each process's one UCX worker: interleaved collectives on
several groups over the same processes, destroying one while the others go on,
groups made and destroyed by the hundred without leaking, a dead peer that
fails every group it was in and no other, and a child forked while a thread
makes groups."""

from __future__ import annotations

import json
import os
import subprocess
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


def test_a_child_forked_while_a_thread_makes_groups_makes_its_own_world():
    """fault_scripts/fork_churn.py: forks land while another thread is making the
    process's UCX worker under ringx's locks; every child must make a world of its own
    and all_reduce on it instead of waiting forever on a lock the fork copied held."""
    forks, child_limit = 12, 30.0
    script = os.path.join(os.path.dirname(__file__), "fault_scripts", "fork_churn.py")
    proc = subprocess.run([sys.executable, script, str(forks), str(child_limit)], capture_output=True, text=True,
                          timeout=LAUNCH_LIMIT + forks * child_limit)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    log(f"fork churn: {result}")
    assert result["hung"] == 0 and not result["failed"], f"{result}\n{proc.stderr[-3000:]}"


def _memory_events_in_child(env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_MEM_")}
    env.update(env_extra)
    code = ("import json, os, ringx; print(json.dumps([ringx._C._ucx_memory_events(), "
            "sorted(k for k in os.environ if k.startswith('UCX_MEM_'))]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=LAUNCH_LIMIT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_wheels_ucx_loads_without_memory_hooks_unless_the_user_sets_them():
    """Without UCX's mmap/munmap hooks a child forked while another thread was in
    munmap cannot wait forever on the parent's registration cache (the hang
    fork_churn.py found); the variables are set only while UCX loads."""
    from ringx import _build_info

    site = os.environ.get("RINGX_UCX_LIBRARY_PATH") or getattr(_build_info, "ucx", "wheel") == "system"
    events, left = _memory_events_in_child({})
    assert left == []
    # A site's UCX (RDMA, whose registration caches need the hooks) keeps its defaults.
    assert events is (True if site else False)
    assert _memory_events_in_child({"UCX_MEM_EVENTS": "yes"}) == [True, ["UCX_MEM_EVENTS"]]
