"""dist.shrink_group on ringx (issue 43): torch's shrink tests in ringx's terms, and DDP
that survives two SIGKILLs, 4 -> 3 -> 2 ranks, with parameters checked against a plain
torch run of the same steps on as many ranks.

Like test_faults.py, each scenario is a script of fault_scripts/ launched as fresh
processes (faultlib.launch); the assertions read what each rank recorded.
"""

from __future__ import annotations

import os
import sys

import pytest

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_scripts"))
import faultlib as common  # noqa: E402  (fault_scripts/faultlib.py)

from test_faults import (FAULT_TIMEOUT, LAUNCH_LIMIT, assert_clean_exit, assert_ok,  # noqa: E402
                         launch, log)

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="shrink_group is ringx's")

# What leaving a group may cost a rank that is not in its shrunk successor: it must
# not wait for the survivors (nor they for it).
DESTROY_S = 2.0
# shrink_group to a completed collective on the shrunk group: far above what it takes
# (0.15-0.4 s at world 8 on 2 cores), low enough to catch a wait on the dead.
LATENCY_BOUND_S = 3.0


def raised(res, label, out):
    found = [r for r in res.records if r["event"] == "raised" and r["label"] == label]
    assert found, f"rank {res.rank}: {label} raised nothing\n{out.report()}"
    return found[0]


def test_shrink_api():
    """Validation, a disagreement and its retry, what the shrunk group looks like, the
    flags with an op in flight, two groups shrunk apart, an aborted group, the default
    group 4 -> 3 -> 2."""
    out = launch("shrink_api.py", 4, FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
        for label in ("empty", "out_of_range", "bad_flags", "direct_out_of_range", "world_still_works"):
            assert_ok(res.result(label), out)
        assert res.event("supports")["value"] is True
        msg = raised(res, "direct_out_of_range", out)["msg"]
        assert msg.startswith(f"ringx: shrink_group (rank {res.rank}): "), msg
        assert "outside the group of size 4" in msg, msg
        destroyed = res.event("destroyed")
        assert destroyed, out.report()
        log(f"rank {res.rank}: destroy_process_group took {destroyed['seconds']:.3f} s")
        assert destroyed["seconds"] <= DESTROY_S, out.report()
    assert_ok(out[3].result("self_excluded"), out)
    for r in range(3):
        res = out[r]
        for label in ("disagree", "retry", "properties", "in_flight", "abort", "pending_after_abort"):
            assert_ok(res.result(label), out)
        disagree = raised(res, "disagree", out)
        assert disagree["msg"].startswith(f"ringx: shrink_group (rank {r}): the survivors disagree"), disagree
        assert "[1, 3]" in disagree["msg"] and "[3]" in disagree["msg"], disagree
        took = res.result("disagree")["end"] - res.result("disagree")["start"]
        assert took < FAULT_TIMEOUT / 2, f"rank {r}: the disagreement took {took:.2f} s\n{out.report()}"
        props = res.event("properties")
        # _get_backend_name() says "custom" for every ringx group (torch names the type).
        assert props["get_backend"] == "ringx" and props["name"] == props["parent_name"], props
        assert props["backend_is_ringx"], props
        assert (props["rank"], props["size"], props["ranks"]) == (r, 3, [0, 1, 2]), props
        assert props["desc"].endswith(":shrunk"), props
        if r < 2:
            assert res.event("split")["size"] == 2, out.report()
        in_flight = raised(res, "in_flight", out)["msg"]
        assert in_flight.startswith(f"ringx: shrink_group (rank {r}): 1 operation(s) still in flight"), in_flight
        assert "SHRINK_ABORT" in in_flight, in_flight
        pending = raised(res, "pending_after_abort", out)["msg"]
        assert "shrunk by shrink_group (SHRINK_ABORT)" in pending, pending
        assert_ok(res.result("after_abort"), out)
        assert "aborted or shut down before" in raised(res, "after_abort", out)["msg"], out.report()
        assert_ok(res.result("default_1"), out)
        log(f"rank {r}: shrink 4 -> 3 to a completed all_reduce: "
            f"{1000 * res.event('latency')['seconds']:.0f} ms")
    for r in (1, 2, 3):
        assert_ok(out[r].result("multi_a"), out)
    for r in (0, 3):
        assert_ok(out[r].result("multi_b"), out)
    for r in (0, 1):
        assert_ok(out[r].result("default_2"), out)


def test_shrunk_group_reuses_its_parents_connections():
    """A shrunk group is its parent's connections and shared memory re-indexed: no
    survivor but the first opens a socket in shrink_group; the group outlives its
    destroyed parent; an excluded rank that lives destroys the parent at once; it
    shrinks again over the same connections; and the default group shrinks after the
    rank that hosts its store died."""
    out = launch("shrink_reuse.py", 4, FAULT_TIMEOUT)
    for r in (1, 2, 3):
        assert_clean_exit(out[r], out)
        assert_ok(out[r].result("store_gone"), out)
    for r in (0, 1, 2):
        res = out[r]
        assert_ok(res.result("no_connection"), out)
        assert_ok(res.result("parent_gone"), out)
        # Rank 0 serves that store: its listening socket is its own.
        opened = res.event("sockets")["opened"]
        assert r == 0 or opened == 0, f"rank {r} opened {opened} socket(s)\n{out.report()}"
    for r in (0, 1):
        assert_ok(out[r].result("second"), out)
    assert_ok(out[3].result("excluded_alive"), out)
    assert out[3].event("excluded_destroy")["seconds"] <= DESTROY_S, out.report()


def test_ddp_survives_two_deaths():
    """DDP at world 4: global rank 2 is SIGKILLed mid-step, the survivors shrink and go on;
    then global rank 0 (the store's host) dies too and the last two go on.  Their
    parameters equal a plain torch run of the same steps on 3, then 2, ranks."""
    out = launch("shrink_ddp.py", 4, FAULT_TIMEOUT, 3, timeout=LAUNCH_LIMIT)
    assert out[2].returncode == -9 and out[2].event("dying"), out.report()
    assert out[0].returncode == -9 and out[0].event("dying"), out.report()
    for r in (1, 3):
        res = out[r]
        assert_clean_exit(res, out)
        caught = [e for e in res.records if e["event"] == "caught"]
        assert len(caught) == 2, out.report()
        for e in caught:
            assert e["msg"].startswith("ringx: "), e
        shrunk = [e for e in res.records if e["event"] == "shrunk"]
        assert [e["size"] for e in shrunk] == [3, 2], out.report()
        for e in shrunk:
            log(f"rank {r}: shrink to {e['size']} ranks: {1000 * e['shrink_s']:.0f} ms, to the first "
                f"all_reduce done {1000 * e['first_collective_s']:.0f} ms")
        for cmp in [e for e in res.records if e["event"] == "compare"]:
            log(f"rank {r}: {cmp['label']}: max difference from the reference {cmp['max_diff']:.2e}")
            assert cmp["ok"], f"rank {r}: {cmp}\n{out.report()}"
        assert len([e for e in res.records if e["event"] == "compare"]) == 2, out.report()
    # Rank 0 survived the first death: it shrank once and compared nothing before dying.
    assert [e["size"] for e in out[0].records if e["event"] == "shrunk"] == [3], out.report()


def test_shrink_latency_world_8():
    """From shrink_group to the first all_reduce done on the shrunk group, 8 -> 7 ranks:
    twice on a group of every rank, then on the default group (torch then aborts every
    other group too).  Logged for docs/surviving-failures.md; bounded loosely here: the
    issue's 50 ms is met on a quiet machine (8-30 ms) and not under make test's load."""
    out = launch("shrink_latency.py", 8, FAULT_TIMEOUT, 2)
    for res in out:
        assert_clean_exit(res, out)
    for r in range(7):
        lat = {e["label"]: e["seconds"] for e in out[r].records if e["event"] == "latency"}
        assert set(lat) == {"group_0", "group_1", "default"}, out.report()
        log(f"rank {r}: " + ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in lat.items()))
        assert max(lat.values()) < LATENCY_BOUND_S, out.report()

