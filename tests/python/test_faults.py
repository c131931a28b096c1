"""Faults, timeouts and bad input (issue 6): ringx fails fast and clearly, recovers, and
never corrupts.

Killing, stopping or desynchronising ranks does not fit the persistent worlds of
harness.py, so each scenario here launches a standalone script from fault_scripts/ as
fresh processes (torchrun-like environment; see fault_scripts/faultlib.py), bounded by a
wall-clock limit after which every rank is killed.  Each rank records what its calls
raised and when; the assertions below run in pytest on those records, on every
surviving rank: the exception type, the words of its message, and the time it took.

Time bounds: the group timeout is FAULT_TIMEOUT (RINGX_FAULT_TIMEOUT, 4 s); a survivor
of a dead peer must raise within 2 x FAULT_TIMEOUT of the death (gloo's bar), a timeout
no earlier than 0.9 x FAULT_TIMEOUT; later calls on a failed group must fail at once
(within LATE_S).  The measured times are printed (pytest -s shows them; the table in
docs/failure-semantics.md was filled from them).

Which survivors see "closed" and which "Timed out" after a peer dies: a rank whose
pending operation exchanges data with the dead rank must get "connection to rank V
closed" (V the dead rank); on one host that takes the victim's exit, 10-50 ms (peers
are watched by pidfd; by pid every 100 ms where pidfd_open is refused).  That is enforced per rank where who talks to whom does not depend on the
algorithm chosen (the broadcast root, p2p sender and receiver); for all_reduce at
least one survivor must say it.  A rank that waits only on another survivor (which has already failed and stopped
sending) gets "Timed out ... waiting for data from rank(s) X" at the group timeout.
Survivors wait for each other before exiting, so no "closed" cascades from a survivor's
exit.  Every survivor must raise within 2 x the timeout.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_scripts"))
import faultlib as common  # noqa: E402  (fault_scripts/faultlib.py)

import cases_faults  # noqa: E402



pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx",
                                reason="fault injection tests exercise the ringx backend's error contract")

FAULT_TIMEOUT = float(os.environ.get("RINGX_FAULT_TIMEOUT", "4"))
LATE_S = 2.0  # a call on an already failed group must fail within this
# A rank that raises is seen to die only when its process ends, after Python
# has torn torch down: 0.5-0.8 s on this 2-core VM, and 1.7-3.9 s while another
# process writes gigabytes to disk (as make test's later-venvs stage does),
# with ringx's own transport teardown taking 6-24 ms of it (measured with
# timestamps in the transport's destructor). Its group timeout leaves room.
EXIT_TIMEOUT = max(FAULT_TIMEOUT, 10.0)
LAUNCH_LIMIT = 60 + 6 * FAULT_TIMEOUT  # per launch: start-up (torch import) + scenario

DIST_ERR = "DistBackendError"


def log(msg):
    print(f"[faults] {msg}", flush=True)


def launch(script, world_size, *args, timeout=LAUNCH_LIMIT, env=None, wait_for=None):
    out = common.launch(script, world_size, [str(a) for a in args], timeout=timeout, env=env, wait_for=wait_for)
    log(f"{script} {' '.join(map(str, args))}: launch took {out.wall:.1f} s")
    return out


def assert_clean_exit(result: common.RankResult, launch_out):
    """The rank neither crashed nor hung: exit 0 and its last record is "done"."""
    assert result.returncode == 0, (f"rank {result.rank} exited with {result.returncode} "
                                    f"(negative: killed by that signal)\n{launch_out.report()}")
    assert result.event("done"), f"rank {result.rank} did not finish\n{launch_out.report()}"


def assert_error(rec, launch_out, types=(DIST_ERR,), words=(), any_of=None):
    """rec is a "result" record: it must be a failure of one of `types` whose message holds
    all of `words` and, if given, matches one of the regexes `any_of`."""
    where = f"rank {rec['rank']} {rec['label']}"
    assert not rec["ok"], f"{where}: returned, expected {types}\n{launch_out.report()}"
    assert rec["type"] in types or any(t in rec["mro"] for t in types), (
        f"{where}: raised {rec['type']}: {rec['msg']}\nexpected one of {types}\n{launch_out.report()}")
    for w in words:
        assert w in rec["msg"], f"{where}: message lacks {w!r}: {rec['msg']}\n{launch_out.report()}"
    if any_of is not None:
        assert any(re.search(p, rec["msg"]) for p in any_of), (
            f"{where}: message matches none of {any_of}: {rec['msg']}\n{launch_out.report()}")


def assert_ok(rec, launch_out):
    assert rec["ok"], f"rank {rec['rank']} {rec['label']}: raised {rec.get('type')}: {rec.get('msg')}\n" \
                      f"{launch_out.report()}"


def duration(rec):
    return rec["end"] - rec["start"]


# ------------------------------------------------------------------------------ timeouts


def test_group_timeout_names_op_seq_and_awaited_rank():
    """Rank 1 skips an all_reduce: ranks 0 and 2 raise "Timed out" after the group timeout."""
    out = launch("timeouts.py", 3, "group", FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    named = set()
    for r in (0, 2):
        rec = out[r].result("skipped")
        assert_error(rec, out, words=("ringx: all_reduce", f"rank {r}, seq ", "Timed out after",
                                      f"{int(FAULT_TIMEOUT * 1000)} ms"),
                     any_of=(r"waiting for (data from )?rank\(s\) \d",))
        took = duration(rec)
        log(f"group timeout: rank {r} raised after {took:.2f} s: {rec['msg'][:160]}")
        assert 0.9 * FAULT_TIMEOUT <= took <= 2 * FAULT_TIMEOUT, f"rank {r}: took {took:.2f} s\n{out.report()}"
        named |= {int(x) for x in re.findall(r"rank\(s\) ([\d, ]+)", rec["msg"])[0].split(", ")}
        later = out[r].result("later")
        assert_error(later, out, words=("ringx: all_reduce", "failed earlier", "Timed out"))
        assert duration(later) <= LATE_S, f"rank {r}: later call took {duration(later):.2f} s"
    assert 1 in named, f"no survivor named the rank that skipped (rank 1)\n{out.report()}"


def test_subgroup_timeout_is_its_own_and_world_goes_on():
    """new_group(timeout=T) bounds the subgroup's ops by T even though the world's is 10 T."""
    out = launch("timeouts.py", 3, "subgroup", FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    rec = out[0].result("sub_skipped")
    assert_error(rec, out, words=("ringx: all_reduce", "Timed out after", f"{int(FAULT_TIMEOUT * 1000)} ms",
                                  "rank(s) 1"))
    log(f"subgroup timeout: rank 0 raised after {duration(rec):.2f} s")
    assert 0.9 * FAULT_TIMEOUT <= duration(rec) <= 2 * FAULT_TIMEOUT, out.report()
    for r in range(3):
        assert_ok(out[r].result("world_after"), out)


def test_work_wait_timeout_then_completes():
    """Work.wait(timeout) raises "Timed out ... in Work.wait(timeout)"; the op goes on and
    completes once the late rank joins; the group stays usable."""
    out = launch("timeouts.py", 3, "wait", FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    rec = out[0].result("short_wait")
    assert_error(rec, out, words=("ringx: all_reduce", "Timed out after", "Work.wait(timeout)"))
    log(f"Work.wait(timeout={FAULT_TIMEOUT / 4:.2f} s) raised after {duration(rec):.2f} s")
    assert 0.9 * FAULT_TIMEOUT / 4 <= duration(rec) <= FAULT_TIMEOUT, out.report()
    assert_ok(out[0].result("second_wait"), out)
    for r in range(3):
        assert_ok(out[r].result("after"), out)


# ----------------------------------------------------------------------------- dead peer

DEAD_PEER_CASES = [
    # mode, when, op, count, world size, victim, survivors that must report "closed"
    # (they exchange data with the victim directly in this operation), survivors whose
    # operation does not need the victim at all and so may complete
    ("sigkill", "pending", "all_reduce", 1, 3, 2, (), ()),
    ("exit", "pending", "all_reduce", 1, 3, 1, (), ()),
    ("exception", "pending", "all_reduce", 1, 3, 2, (), ()),
    ("sigkill", "idle", "all_reduce", 1, 3, 2, (), ()),
    ("sigkill", "pending", "all_reduce", 1 << 20, 3, 1, (), ()),
    # Binomial tree from root 0 over 3 ranks (forced in CASE_ENV).
    ("sigkill", "pending", "broadcast", 1 << 20, 3, 1, (0,), (2,)),
    # Chain 0 -> 1 -> 2 -> 3 (forced in CASE_ENV): the middle rank 2 dies; 1 sends to
    # it, 3 receives from it, the root never talks to it.
    ("sigkill", "pending", "broadcast", 1 << 20, 4, 2, (1, 3), (0,)),
    # Direct gather to root 0 (forced in CASE_ENV): the root receives from the victim,
    # rank 1 only sends to the root.
    ("sigkill", "pending", "gather", 1 << 20, 3, 2, (0,), (1,)),
    ("sigkill", "pending", "send_recv", 1 << 20, 3, 1, (0, 2), ()),  # 0 sends to it, 2 receives from it
    # Dies as soon as its sparse all_reduce's call returns (16 MiB of values per rank),
    # its counts or its data in flight to every survivor.
    ("sigkill", "pending", "sparse_all_reduce", 1 << 16, 3, 2, (), ()),
    ("exit", "pending", "sparse_all_reduce", 1 << 16, 2, 1, (), ()),
    # Dies first: the survivors' calls return, and their waits lose it.
    ("sigkill", "idle", "sparse_all_reduce", 1 << 16, 3, 1, (), ()),
]
# Settings for the cases of one (mode, op, world size).
CASE_ENV = {
    # The shared-memory broadcast lets the root finish once its data is in its slots,
    # which a buffer of two slots or less is: with the binomial tree the root sends to
    # ranks 1 and 2 itself.
    ("sigkill", "broadcast", 3): {"RINGX_ALGO": "broadcast:binomial"},
    ("sigkill", "broadcast", 4): {"RINGX_ALGO": "broadcast:chain"},
    ("sigkill", "gather", 3): {"RINGX_ALGO": "gather:direct"},
}


def _op_name(op, r):
    if op == "send_recv":
        return "send" if r == 0 else "recv"
    if op == "sparse_all_reduce":
        return "all_reduce"
    return op


@pytest.mark.parametrize("mode,when,op,count,ws,victim,direct,independent", DEAD_PEER_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}-w{c[4]}" for c in DEAD_PEER_CASES])
def test_dead_peer(mode, when, op, count, ws, victim, direct, independent):
    """A rank dies (SIGKILL / os._exit / uncaught exception) with the survivors' op pending
    (or before they issue it): every survivor's pending and later calls fail within
    2 x the timeout, except a pending op that never needed the dead rank, which may
    complete; the ones that talk to the dead rank directly say "connection to rank V
    closed" (a single-copy algorithm adds why: "its process exited, or left the group, ...")."""
    env = CASE_ENV.get((mode, op, ws))
    timeout = EXIT_TIMEOUT if mode == "exception" else FAULT_TIMEOUT
    out = launch("dead_peer.py", ws, mode, victim, timeout, when, op, count, env=env)
    dying = out[victim].event("dying")
    assert dying, f"the victim never got to die\n{out.report()}"
    expected_exit = {"sigkill": -9, "exit": 7, "exception": 1}[mode]
    assert out[victim].returncode == expected_exit, out.report()
    if mode == "exception":
        # The rank that raised must exit promptly, not hang in interpreter shutdown.
        lag = out[victim].exit_time - dying["t"]
        log(f"exception-then-exit: the victim's process ended {lag:.2f} s after raising")
        assert lag <= timeout, f"victim took {lag:.2f} s to exit\n{out.report()}"
    # The single-copy algorithms say why after it: the victim exited while this rank
    # copied its memory, or before it finished this collective.
    closed_re = rf"connection to rank {victim} closed"
    closed_seen = False
    for r in range(ws):
        if r == victim:
            continue
        res = out[r]
        assert_clean_exit(res, out)
        pending = res.result("pending")
        labels = ["later_all_reduce", "later_broadcast"]
        causes = (closed_re,)
        if pending["ok"] and r in independent:
            log(f"dead peer ({mode}, {when}, {op}, {count}): rank {r} completed: its op never needed rank {victim}")
            kind = "closed"
            first = res.result(labels.pop(0))
            # Or a survivor that had failed, destroyed its group and left before this
            # call ended: its close can come first (seen with UCX_TLS=^cma).
            gone = [q for q in range(ws) if q not in (victim, r) and out[q].event("destroyed")
                    and out[q].event("destroyed")["t"] < first["end"]]
            causes = (closed_re,) + tuple(rf"connection to rank {q} closed" for q in gone)
            assert_error(first, out, words=("ringx: all_reduce",), any_of=causes)
            assert first["end"] - dying["t"] <= 2 * timeout, out.report()
        else:
            assert_error(pending, out, words=(f"ringx: {_op_name(op, r)} (rank {r}, seq ",),
                         any_of=(closed_re,) if r in direct else (closed_re, r"Timed out after"))
            since_death = pending["end"] - dying["t"]
            kind = "closed" if re.search(closed_re, pending["msg"]) else "timed out"
            closed_seen |= kind == "closed"
            log(f"dead peer ({mode}, {when}, {op}, {count}): rank {r} {kind} {since_death:.2f} s after the death: "
                f"{pending['msg'][:140]}")
            assert since_death <= 2 * timeout, f"rank {r}: {since_death:.2f} s after the death\n{out.report()}"
        for label in labels:
            later = res.result(label)
            assert_error(later, out, words=("failed earlier",), any_of=causes + (r"Timed out after",))
            assert duration(later) <= LATE_S, f"rank {r} {label}: {duration(later):.2f} s\n{out.report()}"
        ge = res.event("get_error")
        if ge["available"]:
            want = "REMOTE_ERROR" if kind == "closed" else "TIMEOUT"
            assert want in ge["value"], f"rank {r}: get_error() = {ge['value']}, expected {want}\n{out.report()}"
        destroyed = res.event("destroyed")
        assert destroyed and destroyed["seconds"] <= LATE_S, \
            f"rank {r}: destroy_process_group after the failure took too long\n{out.report()}"
    assert closed_seen, f"no survivor reported the connection to rank {victim} closed\n{out.report()}"


def _pidfd_available():
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):
        return False


DETECTION_LAUNCHES = 3
DETECTION_LAG_S = 0.03


@pytest.mark.skipif(not _pidfd_available(),
                    reason="pidfd_open is unavailable (Linux before 5.3, Python before 3.9, or a seccomp "
                           "filter): peers are watched by the 100 ms pid poll alone")
def test_a_sigkilled_peer_is_heard_of_as_its_exit_completes_not_at_the_next_pid_check():
    """fault_scripts/detection.py at world 2, the victim killed 10 ms after the survivor's
    pid check, which ran as its all_reduce began: the pid poll alone hears of the death
    at the next check, 100 ms later (90 ms after the kill); with the pidfd watch the
    survivor raises as the victim's exit completes (its pidfd readable, seen by another
    thread of the survivor). The kernel's share, the exit itself, takes 10-50 ms on this
    VM and is not ringx's to bound, so the bound is on what comes after it: the median
    over DETECTION_LAUNCHES launches, loose enough for a loaded host."""
    lags, detects = [], []
    for _ in range(DETECTION_LAUNCHES):
        out = launch("detection.py", 2, 1, FAULT_TIMEOUT, "wait", "after-check")
        killed = out[0].event("killed")
        assert killed and killed["exited"] is not None, out.report()
        pending = out[0].result("pending")
        assert_error(pending, out, words=("ringx: all_reduce (rank 0, seq ", "connection to rank 1 closed"))
        lags.append(pending["end"] - killed["exited"])
        detects.append(pending["end"] - killed["at"])
    log(f"detection: kill -> exception {', '.join(f'{d * 1000:.0f}' for d in detects)} ms; "
        f"exit complete -> exception {', '.join(f'{x * 1000:.0f}' for x in lags)} ms")
    lags.sort()
    assert lags[len(lags) // 2] <= DETECTION_LAG_S, (
        f"the survivor raised {lags[len(lags) // 2] * 1000:.0f} ms (median) after the victim's exit completed")


def test_what_a_peer_sent_before_it_exited_is_still_received():
    """fault_scripts/finished_peer.py: rank 1 sends two small tensors to rank 0 and exits
    before rank 0 receives them, while rank 0's engine, with another receive pending,
    watches its peers and records the death first. The messages arrived before the
    death: rank 0's receives get them (ringx used to fail them with "connection to rank
    1 closed", and a collective that a fast peer had finished and left could fail the
    same way)."""
    out = launch("finished_peer.py", 3, 2 * FAULT_TIMEOUT)
    assert out[1].event("sent") and out[1].returncode == 0, out.report()
    res = out[0]
    assert_clean_exit(res, out)
    assert res.event("peer_gone"), out.report()
    assert_ok(res.result("recv_small"), out)
    assert_ok(res.result("recv_large"), out)
    got = res.event("received")
    assert got["small"] == [7.0] * 4 and got["large_ok"], out.report()
    assert_clean_exit(out[2], out)


def test_stopped_peer_makes_survivors_time_out():
    """SIGSTOP: the process is alive but silent; survivors raise "Timed out" naming a rank."""
    ws, victim = 3, 1
    out = launch("dead_peer.py", ws, "stop", victim, FAULT_TIMEOUT, "pending", "all_reduce", 1,
                 wait_for=[r for r in range(ws) if r != victim])
    assert out[victim].event("dying"), out.report()
    named = set()
    for r in (0, 2):
        assert_clean_exit(out[r], out)
        rec = out[r].result("pending")
        assert_error(rec, out, words=("ringx: all_reduce", "Timed out after"),
                     any_of=(r"waiting for (data from )?rank\(s\) \d",))
        named |= {int(x) for x in re.findall(r"rank\(s\) ([\d, ]+)", rec["msg"])[0].split(", ")}
        took = duration(rec)
        log(f"stopped peer: rank {r} timed out after {took:.2f} s: {rec['msg'][:140]}")
        assert 0.9 * FAULT_TIMEOUT <= took <= 2 * FAULT_TIMEOUT, out.report()
        for label in ("later_all_reduce", "later_broadcast"):
            assert_error(out[r].result(label), out, words=("failed earlier", "Timed out"))
    assert victim in named, f"no survivor named the stopped rank {victim}\n{out.report()}"


# The shared-memory broadcast's ring of small slots: how many calls its root may run
# ahead of the slowest receiver (ShmArea::kEagerSlots).
EAGER_SLOTS = 16
SHM_BROADCAST = {"RINGX_ALGO": "broadcast:shm"}


def test_small_broadcast_root_runs_ahead_of_a_stopped_receiver_which_then_gets_every_call():
    """Rank 0 makes 8 small broadcasts while rank 1 is stopped (SIGSTOP), returning from
    each once its data is in shared memory; continued, rank 1 gets each call's data."""
    ws, calls = 3, EAGER_SLOTS // 2
    out = launch("runahead.py", ws, "ahead", calls, FAULT_TIMEOUT, env=SHM_BROADCAST)
    for res in out:
        assert_clean_exit(res, out)
    assert_ok(out[0].result("ahead"), out)
    took = out[0].event("returned")
    log(f"run ahead: the root returned from {took['calls']} broadcasts in {took['seconds']:.3f} s, rank 1 stopped")
    assert took["calls"] == calls and took["seconds"] < FAULT_TIMEOUT, out.report()
    for r in (1, 2):
        assert out[r].event("data")["wrong"] == [], f"rank {r}: calls with wrong data\n{out.report()}"
    for r in range(ws):
        assert_ok(out[r].result("after"), out)
        assert out[r].event("after_value")["value"] == ws, out.report()


def test_small_broadcast_root_out_of_slots_times_out_naming_the_stopped_receiver():
    """Rank 1 is stopped and never continued: rank 0's broadcasts return until every slot
    holds a call rank 1 has not read, then the next one raises "Timed out" naming rank 1."""
    out = launch("runahead.py", 2, "stuck", 3 * EAGER_SLOTS, FAULT_TIMEOUT, env=SHM_BROADCAST, wait_for=[0])
    assert_clean_exit(out[0], out)
    rec = out[0].result("stuck")
    assert_error(rec, out, words=("ringx: broadcast", "Timed out after", "rank(s) 1"))
    returned = out[0].event("returned")["calls"]
    log(f"out of slots: {returned} broadcasts returned, then after {duration(rec):.2f} s: {rec['msg'][:160]}")
    assert EAGER_SLOTS // 2 <= returned <= EAGER_SLOTS, out.report()
    assert duration(rec) <= 2 * FAULT_TIMEOUT + 5, out.report()


# -------------------------------------------------------------------------------- desync


def test_desync_extra_collective_times_out_cleanly():
    out = launch("desync.py", 2, "extra", FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    rec = out[0].result("extra")
    assert_error(rec, out, words=("ringx: all_reduce", "Timed out after", "rank(s) 1"))
    log(f"desync extra: rank 0 timed out after {duration(rec):.2f} s")
    assert 0.9 * FAULT_TIMEOUT <= duration(rec) <= 2 * FAULT_TIMEOUT, out.report()


def test_desync_different_collective_fails_on_both_and_corrupts_nothing():
    """Rank 0 all_reduces while rank 1 broadcasts: neither may succeed (and rank 1 must
    not receive rank 0's all_reduce traffic as its broadcast)."""
    out = launch("desync.py", 2, "different", FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    for r in range(2):
        rec = out[r].result("different")
        assert_error(rec, out)
        log(f"desync different: rank {r} after {duration(rec):.2f} s: {rec['msg'][:140]}")
        assert duration(rec) <= 2 * FAULT_TIMEOUT, out.report()


DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


@pytest.mark.parametrize("scenario,words", [
    ("different", ("Detected mismatch between collectives on ranks", "OpType=ALLREDUCE", "OpType=BROADCAST")),
    ("shape", ("Detected mismatch between collectives on ranks", "TensorShape=[8]", "TensorShape=[9]")),
    ("dtype", ("Detected mismatch between collectives on ranks", "TensorDtypes=Float", "TensorDtypes=Double")),
])
def test_desync_detail_reports_mismatch(scenario, words):
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps ringx's Backend in its
    ProcessGroupWrapper, which compares op, shape and dtype across ranks first."""
    out = launch("desync.py", 2, scenario, FAULT_TIMEOUT, env=DETAIL)
    for res in out:
        assert_clean_exit(res, out)
    for r in range(2):
        rec = out[r].result(scenario)
        assert_error(rec, out, types=("RuntimeError",), words=words)
        log(f"DETAIL {scenario}: rank {r} after {duration(rec):.2f} s: {rec['msg'][:200]!r}")
        assert duration(rec) <= 2 * FAULT_TIMEOUT, out.report()


def test_desync_detail_extra_collective():
    """DETAIL, extra collective: the wrapper's check on rank 0 waits for rank 1 on its
    gloo helper group and reports that rank 1 never arrived."""
    out = launch("desync.py", 2, "extra", FAULT_TIMEOUT, env=DETAIL)
    for res in out:
        assert_clean_exit(res, out)
    rec = out[0].result("extra")
    assert_error(rec, out, types=("RuntimeError",), any_of=(r"[Rr]anks? 1 failed", r"rank\(s\) 1"))
    log(f"DETAIL extra: rank 0 after {duration(rec):.2f} s: {rec['msg'][:200]!r}")
    assert duration(rec) <= 2 * FAULT_TIMEOUT, out.report()


# ------------------------------------------------------------------------- size mismatch

SIZE_CASES = [
    # op, base count, delta per rank, world size
    ("all_reduce", 8, 1, 2),
    ("all_reduce", 3, 2, 3),
    ("all_reduce", 300_000, -1000, 3),
    ("broadcast", 8, 1, 2),
    ("broadcast", 300_000, -5000, 3),
    ("reduce", 1000, 7, 3),
    ("send_recv", 100, 1, 2),   # the receiver's buffer is larger than the message
    ("send_recv", 100, -1, 2),  # the receiver's buffer is smaller than the message
    ("send_recv", 300_000, -100, 2),
]


@pytest.mark.parametrize("op,base,delta,ws", SIZE_CASES, ids=[f"{o}-{b}{d:+d}-ws{w}" for o, b, d, w in SIZE_CASES])
def test_size_mismatch(op, base, delta, ws):
    out = launch("size_mismatch.py", ws, op, base, delta, FAULT_TIMEOUT)
    size_words = ("different sizes", "disagree on the size")
    saw_size_error = False
    for r in range(ws):
        res = out[r]
        assert_clean_exit(res, out)
        guards = res.event("guards")
        assert guards["ok"], f"rank {r}: wrote outside its tensor: {guards}\n{out.report()}"
        rec = res.result("mismatch")
        if rec["ok"]:
            # Acceptable only for a rank that cannot see the mismatch: a sender whose data
            # went out whole (the broadcast root, the reduce's leaves, the p2p sender).
            log(f"size mismatch {op}: rank {r} returned")
            continue
        assert_error(rec, out, any_of=tuple(map(re.escape, size_words)) + (r"Timed out after", r"closed"))
        saw_size_error |= any(w in rec["msg"] for w in size_words)
        log(f"size mismatch {op} {base}{delta:+d}: rank {r} after {duration(rec):.2f} s: {rec['msg'][:150]}")
        assert duration(rec) <= 2 * FAULT_TIMEOUT, out.report()
    assert saw_size_error, f"no rank reported the size mismatch\n{out.report()}"


# --------------------------------------------------------------------- abort and recovery


def test_abort_fails_pending_work_and_a_new_group_works():
    out = launch("abort_recover.py", 2, "abort", FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    aborted = out[0].event("aborted")
    log(f"_abort_process_group took {aborted['seconds']:.3f} s")
    assert aborted["seconds"] <= LATE_S, out.report()
    rec = out[0].result("pending")
    assert_error(rec, out, words=("ringx: all_reduce", "abort"))
    assert duration(rec) <= LATE_S, out.report()
    assert_error(out[0].result("after_abort"), out, words=("abort",))
    for r in range(2):
        assert_ok(out[r].result("recovered"), out)


def test_destroy_with_pending_work_then_a_new_group_works():
    """destroy_process_group shuts the backend down: pending work ends (with the
    timeout at the latest) and destroy returns; a new group then works."""
    out = launch("abort_recover.py", 2, "destroy", FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    d = out[0].result("destroy")
    assert_ok(d, out)
    log(f"destroy_process_group with work pending took {duration(d):.2f} s")
    assert duration(d) <= 2 * FAULT_TIMEOUT, out.report()
    rec = out[0].result("pending")
    # Rank 1 destroys its group while rank 0's destroy waits: where UCX's
    # transports let rank 0 hear that close (UCX_TLS=^cma does), it ends the work.
    assert_error(rec, out, any_of=(r"abort", r"shut down", r"Timed out after", r"connection to rank 1 closed"))
    assert not out[0].event("waiter_joined")["alive"], out.report()
    for r in range(2):
        assert_ok(out[r].result("recovered"), out)


def test_abort_one_subgroup_leaves_world_working():
    out = launch("abort_recover.py", 3, "subgroup", FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    rec = out[0].result("pending")
    assert_error(rec, out, words=("abort",))
    assert duration(rec) <= LATE_S, out.report()
    for r in range(3):
        assert_ok(out[r].result("world_after"), out)


CYCLES = int(os.environ.get("RINGX_FAULT_CYCLES", "200"))
CYCLE_WARMUP = 3


def test_init_destroy_cycles_leak_no_threads_or_fds():
    """CYCLES x (init_process_group -> all_reduce -> destroy_process_group) on 2 ranks:
    after the first CYCLE_WARMUP, thread and fd counts must not move."""
    out = launch("cycles.py", 2, CYCLES + CYCLE_WARMUP, CYCLE_WARMUP, timeout=LAUNCH_LIMIT + 3 * CYCLES)
    for r in range(2):
        res = out[r]
        assert res.returncode == 0 and res.event("done"), out.report()
        base, final = res.event("baseline"), res.event("final")
        log(f"cycles: rank {r}: {CYCLES} cycles in {final['seconds']:.1f} s "
            f"({final['seconds'] / CYCLES * 1000:.0f} ms each); threads {base['threads']} -> {final['threads']}, "
            f"fds {base['fds']} -> {final['fds']}")
        assert final["threads"] == base["threads"], (
            f"rank {r}: threads {base['thread_names']} -> {final['thread_names']}\n{out.report()}")
        assert final["fds"] == base["fds"], f"rank {r}: fds {base['fd_kinds']} -> {final['fd_kinds']}\n{out.report()}"


# -------------------------------------------------------------------- monitored_barrier


@pytest.mark.parametrize("ws,missing,wait_all", [(3, "2", 0), (4, "1,3", 1)])
def test_monitored_barrier_names_ranks_that_left(ws, missing, wait_all):
    """Missing ranks whose processes end instead of arriving: rank 0 hears their
    connections close and fails at once, naming them as gloo names the ranks that
    failed to pass, with the closed connection as the cause."""
    out = launch("monitored.py", ws, missing, FAULT_TIMEOUT, wait_all, "exit")
    missing_ranks = [int(x) for x in missing.split(",")]
    for r in range(ws):
        if r not in missing_ranks:
            assert_clean_exit(out[r], out)
    named = ", ".join(map(str, missing_ranks if wait_all else missing_ranks[:1]))
    rec = out[0].result("barrier")
    assert_error(rec, out, words=("monitored_barrier", f"rank(s) {named} failed to pass"),
                 any_of=(r"connection to rank \d+ closed",))
    log(f"monitored_barrier: rank 0 after {duration(rec):.2f} s: {rec['msg']}")
    assert duration(rec) < 0.9 * FAULT_TIMEOUT, out.report()


@pytest.mark.parametrize("wait_all", [0, 1])
def test_monitored_barrier_waits_for_late_ranks_after_one_left(wait_all):
    """Rank 3 leaves while rank 1 arrives late but within the timeout: as in gloo, rank 0
    waits for rank 1 and names only rank 3."""
    out = launch("monitored.py", 4, "3", FAULT_TIMEOUT, wait_all, "exit", "1")
    for r in range(3):
        assert_clean_exit(out[r], out)
    rec = out[0].result("barrier")
    assert_error(rec, out, words=("monitored_barrier", "rank(s) 3 failed to pass", "connection to rank 3 closed"))
    log(f"monitored_barrier: rank 0 after {duration(rec):.2f} s: {rec['msg']}")
    assert 0.35 * FAULT_TIMEOUT <= duration(rec) < 0.9 * FAULT_TIMEOUT, out.report()


@pytest.mark.parametrize("ws,missing,wait_all", [(3, "2", 0), (4, "1,3", 1)])
def test_monitored_barrier_names_missing_ranks(ws, missing, wait_all):
    out = launch("monitored.py", ws, missing, FAULT_TIMEOUT, wait_all)
    missing_ranks = [int(x) for x in missing.split(",")]
    for r in range(ws):
        assert_clean_exit(out[r], out)
        assert_ok(out[r].result("all_present"), out)
    named = ", ".join(map(str, missing_ranks if wait_all else missing_ranks[:1]))
    rec = out[0].result("barrier")
    # ringx's words, then gloo's (torch's own tests match those).
    gloo = f"{'Ranks' if wait_all else 'Rank'} {named} failed to pass monitoredBarrier in"
    assert_error(rec, out, words=("monitored_barrier", f"rank(s) {named} failed to pass", gloo,
                                  "Rank 0 timed out in monitoredBarrier"))
    log(f"monitored_barrier: rank 0 after {duration(rec):.2f} s: {rec['msg']}")
    assert 0.9 * FAULT_TIMEOUT <= duration(rec) <= 2 * FAULT_TIMEOUT, out.report()
    for r in range(1, ws):
        if r in missing_ranks:
            continue
        # The others wait for rank 0's release, which never comes: they time out, or
        # see rank 0's process end first where rank 0 timed out and left before them.
        rec = out[r].result("barrier")
        assert_error(rec, out, words=(f"Rank {r} successfully reached monitoredBarrier",),
                     any_of=("Timed out", "connection to rank 0 closed"))
        assert duration(rec) <= 2 * FAULT_TIMEOUT, out.report()


# ---------------------------------------------------------------------------- bad input


def test_bad_input_rejected_on_every_rank_keeps_group_usable(worlds):
    """Every "all" misuse case of cases_faults raises the expected type and words on
    every rank, before anything is sent: the same world then all_reduces correctly."""
    ws = 2
    results = worlds.run(ws, cases_faults.misuse_all)
    failures = []
    for r in range(ws):
        got = results[r]
        for key, what, where, _fn, types, words in cases_faults.MISUSE:
            if where != "all":
                continue
            out = got[key]
            if out is None:
                failures.append(f"rank {r} {key} ({what}): did not raise")
                continue
            etype, mro, msg = out
            if not any(t in mro for t in types):
                failures.append(f"rank {r} {key} ({what}): raised {etype}: {msg}; expected {types}")
            for w in words:
                if w not in msg:
                    failures.append(f"rank {r} {key} ({what}): message lacks {w!r}: {msg}")
        if got["__after__"] is not True:
            failures.append(f"rank {r}: the all_reduce after the rejected calls was wrong")
    assert not failures, "\n".join(failures)


def test_bad_input_on_one_side_of_rooted_collectives():
    """Misuse only the root (or only the others) can see: those ranks get the
    ValueError, the rest time out on the subgroup; nobody crashes; the world group,
    untouched, still works."""
    ws = 2
    out = launch("bad_input.py", ws, FAULT_TIMEOUT, timeout=LAUNCH_LIMIT + 4 * FAULT_TIMEOUT * len(cases_faults.MISUSE))
    for res in out:
        assert_clean_exit(res, out)
        assert_ok(res.result("after"), out)
    for key, what, where, _fn, types, words in cases_faults.MISUSE:
        if where == "all":
            continue
        rejecting = [0] if where == "root" else list(range(1, ws))
        for r in range(ws):
            rec = [m for m in out[r].records if m["event"] == "misuse" and m["key"] == key]
            assert rec, f"rank {r}: no record of {key}\n{out.report()}"
            res = rec[0]["outcome"]
            if r in rejecting:
                assert res is not None, f"rank {r} {key} ({what}) did not raise\n{out.report()}"
                etype, mro, msg = res
                assert any(t in mro for t in types), f"rank {r} {key}: {etype}: {msg}"
                for w in words:
                    assert w in msg, f"rank {r} {key}: message lacks {w!r}: {msg}"
            elif res is not None:
                # A rank that exchanges data with the rejecting rank is told at once
                # ("rank 0 rejected its arguments"); one that waits on another rank
                # times out, or hears the rejecting rank close the subgroup where
                # UCX's transports pass that on (UCX_TLS=^cma does); one that only
                # sends may finish.
                etype, mro, msg = res
                left = any(f"connection to rank {q} closed" in msg for q in rejecting)
                assert DIST_ERR in mro and ("Timed out" in msg or "rejected its arguments" in msg or left), \
                    f"rank {r} {key}: {etype}: {msg}"
            assert rec[0]["seconds"] <= 2 * FAULT_TIMEOUT, f"rank {r} {key}: took {rec[0]['seconds']:.1f} s"


def test_rejected_call_on_one_rank_does_not_desync_it():
    """A call that rank 0 alone makes and that its argument checks reject (nothing sent)
    must not consume a sequence number there: the next collective must still match."""
    out = launch("rejected_call.py", 2, FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
    assert_error(out[0].result("rejected"), out, types=("TypeError",), words=("BAND",))
    for r in range(2):
        assert_ok(out[r].result("after"), out)


# ------------------------------------------------------------------------ torchrun restart

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "examples", "resume_after_restart.py")


def _torchrun(tmp, name, max_restarts, extra, env=None):
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", EXAMPLE,
           "--ckpt-dir", str(tmp / f"{name}-ckpt"), "--result", str(tmp / f"{name}.json"),
           "--timeout", "30", *extra]
    log = open(tmp / f"{name}.log", "wb")
    return subprocess.Popen(cmd, env=common.base_env(env), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True), log


def _read_lines(path):
    import json

    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_torchrun_restart_resumes_from_checkpoint(tmp_path):
    """torchrun --max-restarts 1: SIGKILL rank 1 at step >= 12 of 30 (checkpoints every 5):
    rank 0 stops at once, torchrun restarts both, they resume from the step-10 checkpoint
    and end with exactly the parameters of an uninterrupted run."""
    import json
    import signal
    import time

    steps = ["--steps", "30", "--ckpt-every", "5"]
    ref, ref_log = _torchrun(tmp_path, "ref", 0, steps)
    try:
        ref.wait(timeout=LAUNCH_LIMIT)
    finally:
        common._kill_session(ref)
        ref_log.close()
    assert ref.returncode == 0, (tmp_path / "ref.log").read_text()[-4000:]
    want = json.loads((tmp_path / "ref.json").read_text())

    progress = tmp_path / "progress"
    run, run_log = _torchrun(tmp_path, "run", 1, steps + ["--step-sleep", "0.15", "--progress", str(progress)])
    killed_at = kill_step = None
    try:
        deadline = time.time() + LAUNCH_LIMIT
        while time.time() < deadline and killed_at is None and run.poll() is None:
            lines = [p for p in _read_lines(f"{progress}.rank1") if p["attempt"] == 0 and p["step"] >= 12]
            if lines:
                os.kill(lines[0]["pid"], signal.SIGKILL)
                killed_at, kill_step = time.time(), lines[0]["step"]
            time.sleep(0.02)
        assert killed_at, f"rank 1 never reached step 12\n{(tmp_path / 'run.log').read_text()[-4000:]}"
        run.wait(timeout=2 * LAUNCH_LIMIT)
    finally:
        common._kill_session(run)
        run_log.close()
    text = (tmp_path / "run.log").read_text()
    assert run.returncode == 0, f"torchrun exited {run.returncode}\n{text[-6000:]}"
    got = json.loads((tmp_path / "run.json").read_text())
    rank0 = _read_lines(f"{progress}.rank0")
    first_restarted = min((p["t"] for p in rank0 if p["attempt"] == 1), default=None)
    last_before = max((p["t"] for p in rank0 if p["attempt"] == 0), default=None)
    log(f"torchrun restart: rank 1 killed after step {kill_step}; rank 0's last step of attempt 0 "
        f"{(last_before or 0) - killed_at:+.2f} s from the kill; first step of attempt 1 "
        f"{(first_restarted or 0) - killed_at:.2f} s after the kill; resumed after step {got['resumed_from']}")
    assert got["attempt"] == 1, f"{got}\n{text[-4000:]}"
    assert got["resumed_from"] == 5 * ((kill_step - 1) // 5) or got["resumed_from"] == 5 * (kill_step // 5), got
    assert got["resumed_from"] >= 10, got
    assert got["checksum"] == want["checksum"], f"resumed run {got} != uninterrupted run {want}"
    # The survivor of attempt 0 stopped at once: torchrun's agent (monitor interval 0.1 s)
    # SIGTERMs it as soon as it sees rank 1's death, usually before ringx's own "connection
    # to rank 1 closed" (which the dead-peer tests check) reaches it.
    assert last_before is not None and last_before - killed_at <= 2 * FAULT_TIMEOUT, text[-4000:]
    assert first_restarted is not None, text[-4000:]


# ------------------------------------------------------------------- exit with an op in flight

def test_rank_exiting_while_its_op_completes_releases_nothing_into_a_finalizing_interpreter():
    """fault_scripts/exit_release.py: rank 1's last async op ends on its progress thread
    while the exiting main thread holds the GIL past ringx's atexit hook. Before the fix
    the progress thread waited for the GIL to drop the tensor, was ended by the
    finalizing interpreter, and the rank aborted ("terminate called without an active
    exception", as CI saw in the teardown case of the callbacks test)."""
    out = launch("exit_release.py", 2, FAULT_TIMEOUT)
    for res in out:
        assert_clean_exit(res, out)
        assert "terminate called" not in res.log, out.report()
    assert out[0].event("done")["value"] == [2.0, 2.0], out.report()


# ------------------------------------------------------------------- completion callbacks

def test_completion_callbacks_bounded_ordered_never_after_destroy_and_fork_safe():
    """Issue 10, item 8, in one launch (fault_scripts/callbacks.py): callbacks that block
    use a bounded number of threads and start in completion order; none runs after
    destroy_process_group returns; dropping a group's last reference inside its own
    callback is safe; a forked child touching the parent's group gets an error, not a
    hang; a callback pending at interpreter exit runs before teardown, and the rank exits 0."""
    out = launch("callbacks.py", 2, FAULT_TIMEOUT)
    rep = out.report()
    for res in out:
        assert res.returncode == 0, f"rank {res.rank} exited with {res.returncode}\n{rep}"
        assert res.event("done"), rep
        d = res.event("destroy")
        assert d and all(t <= d["returned"] for t in d["ran"]), (
            f"rank {res.rank}: a callback ran after destroy_process_group returned: {d}\n{rep}")
        f = res.event("fork")
        assert f and not f["hung"], f"rank {res.rank}: the forked child hung\n{rep}"
        assert len(f["child"].splitlines()) == 2, rep
        for line in f["child"].splitlines():
            assert "DistBackendError" in line and "forked child" in line, f"rank {res.rank}: child: {line}\n{rep}"
        assert res.event("after_fork")["value"] == [2.0, 2.0], rep
    r0 = out[0]
    b = r0.event("blocking")
    assert b and b["correct"] and b["last_ran"], rep
    assert b["order"] == list(range(16)), f"callbacks ran in order {b['order']}\n{rep}"
    assert 2 <= b["threads"] <= 4, f"callbacks used {b['threads']} threads\n{rep}"
    assert b["peak"] - b["baseline"] <= 4, f"threads grew {b['baseline']} -> {b['peak']}\n{rep}"
    drop = r0.event("drop_in_callback")
    assert drop and drop["finished"] and drop["value"] == [2.0] * 4, rep
    late = r0.event("teardown_callback")
    assert late is None or late["value"] == [2.0, 2.0], rep
    log(f"callbacks: blocking used {b['threads']} callback threads (threads {b['baseline']} -> {b['peak']}); "
        f"destroy ran {len(d['ran'])} callbacks before returning; teardown callback "
        f"{'ran' if late else 'was dropped'}")
