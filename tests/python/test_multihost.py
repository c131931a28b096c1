"""Ranks on two "hosts": each host is a network, pid and UTS namespace of its own
with a /dev/shm of its own (`ip netns` + a veth pair, `unshare --pid --uts
--mount-proc`, a tmpfs on /dev/shm), so ringx and UCX see different
machines: no shared memory between them, traffic over TCP on the veth link, remote
peer failure detected by UCX rather than by watching pids.

World 4: ranks 0 and 1 on host A (10.77.x.1), ranks 2 and 3 on host B, so every
collective mixes intra-host (shared memory) and inter-host (TCP) pairs.

The fault matrix at the end kills a peer before or during every collective kind in
three layouts (see multihost_fault_matrix.py and docs/failure-semantics.md).

Needs root (namespaces) and iproute2, which `make test` installs.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "multihost_rank.py")
TIMEOUT_S = 4.0
RANKS_PER_HOST = 2
HOSTS = 2

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network and pid namespaces need root")


def run(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def hosts():
    """Two namespaces joined by a veth pair; yields [(netns, address), ...]."""
    assert shutil.which("ip"), "iproute2 is missing (make test installs it)"
    tag = f"rx{os.getpid() % 100000}"
    subnet = f"10.77.{os.getpid() % 250}"
    names = [f"{tag}h{i}" for i in range(HOSTS)]
    links = [f"{tag}v{i}" for i in range(HOSTS)]
    try:
        for ns in names:
            run("ip", "netns", "add", ns)
        run("ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for i, (ns, link) in enumerate(zip(names, links)):
            run("ip", "link", "set", link, "netns", ns)
            run("ip", "-n", ns, "addr", "add", f"{subnet}.{i + 1}/24", "dev", link)
            run("ip", "-n", ns, "link", "set", link, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        yield [(ns, f"{subnet}.{i + 1}") for i, ns in enumerate(names)]
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def collect(out, world):
    """The ranks' reports (of those that wrote one, with "rc", the exit status, where the
    rank exited) and the tails of their logs."""
    reports, logs = {}, ""
    for r in range(world):
        path = os.path.join(out, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                reports[r] = json.load(f)
            if os.path.exists(os.path.join(out, f"rank{r}.rc")):
                with open(os.path.join(out, f"rank{r}.rc")) as f:
                    reports[r]["rc"] = int(f.read())
        with open(os.path.join(out, f"rank{r}.log"), errors="replace") as f:
            logs += f"--- rank {r}\n{f.read()[-3000:]}\n"
    return reports, logs


def launch(hosts, mode, victim=-1, limit=120, setup=None):
    """Starts RANKS_PER_HOST ranks in each host namespace; returns {rank: report}.
    `setup` maps a host's index to a shell command run in its namespaces first."""
    out = tempfile.mkdtemp(prefix="ringx-multihost-")
    master_addr = hosts[0][1]
    port = free_port()
    world = HOSTS * RANKS_PER_HOST
    procs = []
    try:
        for h, (ns, _addr) in enumerate(hosts):
            ranks = range(h * RANKS_PER_HOST, (h + 1) * RANKS_PER_HOST)
            starts = " & ".join(
                f"(RANK={r} LOCAL_RANK={r % RANKS_PER_HOST} {sys.executable} {RANK_SCRIPT} {out} {mode} {victim} "
                f"{TIMEOUT_S} > {out}/rank{r}.log 2>&1; echo $? > {out}/rank{r}.rc)" for r in ranks)
            env = dict(os.environ, MASTER_ADDR=master_addr, MASTER_PORT=str(port), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(RANKS_PER_HOST), TORCH_CPP_LOG_LEVEL="ERROR")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--pid", "--uts", "--mount-proc", "--fork", "sh", "-c",
                 f"hostname host{h}; {OWN_DEV_SHM}; {(setup or {}).get(h, 'true')}; {starts} & wait"], env=env,
                start_new_session=True))
        deadline = time.time() + limit
        while time.time() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        hung = [p for p in procs if p.poll() is None]
        for p in hung:
            os.killpg(p.pid, 9)
        reports, logs = collect(out, world)
        assert not hung, f"a host's ranks did not finish within {limit} s\n{logs}"
        return reports, logs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
        shutil.rmtree(out, ignore_errors=True)


def test_collectives_across_two_hosts(hosts):
    reports, logs = launch(hosts, "check")
    assert sorted(reports) == [0, 1, 2, 3], logs
    for r, rep in reports.items():
        assert rep["host"] == f"host{r // RANKS_PER_HOST}", logs
        assert len(rep["checked"]) == 10 and rep["checked"][-1] == "barrier", f"rank {r}: {rep}\n{logs}"


# Ranks that can open each other's segments in /dev/shm share a host, whatever
# their pid namespaces: each host gets its own.
OWN_DEV_SHM = "mount -t tmpfs -o mode=1777 tmpfs /dev/shm"

# Room for one rank's segment (two 512 KiB slots and a page) and not two: the second rank
# to reserve is refused, as a container's 64 MiB /dev/shm refuses the segments of many
# groups of many ranks. The slots are set, not left to their default, which follows the
# CPU's L2: with a 512 KiB L2 (an EPYC VM) two segments of 128 KiB slots fitted.
SMALL_DEV_SHM = "mount -t tmpfs -o size=1600k tmpfs /dev/shm"
SHM_REFUSED = "could not reserve"
SLOT_BYTES = str(512 << 10)


def test_one_host_with_a_full_dev_shm_makes_every_host_take_the_flat_algorithms(hosts, monkeypatch):
    """Host 1's ranks cannot reserve their shared memory: they warn, and every rank, host
    0's too, leaves the hierarchical algorithms (which need each host's area), so all
    ranks run the same algorithms and every result is right; before, host 1's ranks died
    of SIGBUS at the first collective that wrote past what /dev/shm held."""
    monkeypatch.setenv("RINGX_SHM_BYTES", SLOT_BYTES)
    reports, logs = launch(hosts, "check", setup={1: SMALL_DEV_SHM})
    assert sorted(reports) == [0, 1, 2, 3], logs
    for r, rep in reports.items():
        assert len(rep["checked"]) == 10 and rep["checked"][-1] == "barrier", f"rank {r}: {rep}\n{logs}"
    per_rank = logs.split("--- rank ")[1:]
    for r in (2, 3):
        assert SHM_REFUSED in per_rank[r] and "/dev/shm" in per_rank[r], logs


def test_a_full_dev_shm_on_one_host_gives_a_warning_not_a_crash():
    """Two ranks on one host whose /dev/shm holds one segment: both warn, naming the rank
    refused and /dev/shm, and every collective of the check runs right without shared
    memory."""
    out = tempfile.mkdtemp(prefix="ringx-devshm-")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2", TORCH_CPP_LOG_LEVEL="ERROR", RINGX_SHM_BYTES=SLOT_BYTES)
    starts = " & ".join(f"RANK={r} LOCAL_RANK={r} {sys.executable} {RANK_SCRIPT} {out} check -1 {TIMEOUT_S} "
                        f"> {out}/rank{r}.log 2>&1" for r in range(2))
    try:
        proc = subprocess.run(["unshare", "--mount", "sh", "-c", f"{SMALL_DEV_SHM}; {starts} & wait"], env=env,
                              timeout=120)
        reports, logs = collect(out, 2)
        assert proc.returncode == 0, logs
        assert sorted(reports) == [0, 1], logs
        for r, rep in reports.items():
            assert len(rep["checked"]) == 10 and rep["checked"][-1] == "barrier", f"rank {r}: {rep}\n{logs}"
        assert logs.count(SHM_REFUSED) == 2 and "RINGX_SHM=0" in logs, logs
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_dead_rank_on_the_other_host_fails_every_survivor_fast(hosts):
    """Rank 3 (host 1) exits with an all_reduce pending everywhere: ranks 0 and 1 learn it
    through UCX's peer-failure detection across hosts, rank 2 through its pid watch."""
    victim = 3
    reports, logs = launch(hosts, "kill", victim)
    for r in range(HOSTS * RANKS_PER_HOST):
        if r == victim:
            continue
        pending = reports.get(r, {}).get("pending")
        assert pending and not pending["ok"], f"rank {r}: {pending}\n{logs}"
        assert pending["type"] == "DistBackendError", f"rank {r}: {pending}\n{logs}"
        assert f"ringx: all_reduce (rank {r}, seq " in pending["msg"], pending["msg"]
        assert f"connection to rank {victim} closed" in pending["msg"], f"rank {r}: {pending['msg']}\n{logs}"
        print(f"[multihost] rank {r} (host{r // RANKS_PER_HOST}): closed after {pending['seconds']:.2f} s")
        assert pending["seconds"] <= 2 * TIMEOUT_S, f"rank {r}: {pending}\n{logs}"


def test_monitored_barrier_across_hosts_waits_for_a_late_rank_and_names_only_the_one_that_left(hosts):
    """Rank 3 (host 1) exits instead of entering the monitored barrier, rank 1 (host 0)
    enters it 0.4 T late: rank 0 hears rank 3's connection close through UCX, waits for
    rank 1 as gloo does, and names rank 3 alone."""
    reports, logs = launch(hosts, "monitored", victim=3)
    rec = reports.get(0, {}).get("pending")
    assert rec and not rec["ok"] and rec["type"] == "DistBackendError", f"{rec}\n{logs}"
    assert "rank(s) 3 failed to pass monitored_barrier" in rec["msg"], f"{rec}\n{logs}"
    assert "connection to rank 3 closed" in rec["msg"], f"{rec}\n{logs}"
    print(f"[multihost] monitored_barrier: rank 0 after {rec['seconds']:.2f} s: {rec['msg']}")
    assert 0.35 * TIMEOUT_S <= rec["seconds"] < 0.9 * TIMEOUT_S, f"{rec}\n{logs}"


def test_a_rank_that_destroys_a_group_but_keeps_another_fails_its_peer_on_the_other_host_fast(hosts):
    """Rank 1 (host 0) destroys the group it shares with rank 3 (host 1) and keeps the
    world group, so its endpoint to rank 3's process stays open: rank 3, in an all_reduce
    on the group, must hear that group rank 0 left at once, not after the group's limit
    of 4 T, and every rank's world all_reduce must work after it."""
    reports, logs = launch(hosts, "leave", victim=1)
    left_at = reports.get(1, {}).get("left_at")
    rec = reports.get(3, {}).get("pending")
    assert left_at and rec and not rec["ok"], f"{reports}\n{logs}"
    assert rec["type"] == "DistBackendError", f"{rec}\n{logs}"
    assert "connection to rank 0 closed" in rec["msg"], f"{rec}\n{logs}"
    delay = rec["at"] - left_at
    print(f"[multihost] leave: rank 3 raised {delay:.2f} s after rank 1 destroyed the group: {rec['msg'][:160]}")
    assert delay < 2.0, f"rank 3 raised {delay:.2f} s after the destroy: {rec}\n{logs}"
    for r in range(HOSTS * RANKS_PER_HOST):
        after = reports.get(r, {}).get("after")
        assert after and after["ok"], f"rank {r}: world all_reduce after the destroy: {after}\n{logs}"


def test_destroying_the_last_group_returns_at_once_while_a_peer_on_the_other_host_is_stopped(hosts):
    """Rank 3 (host 1) is SIGSTOPped by rank 2 while rank 0 destroys the world, its
    process's last group: the teardown's bounded wait for rank 3's endpoint (2 s) is
    not the caller's, and every rank still exits 0 through the interpreter's exit."""
    reports, logs = launch(hosts, "stopped", victim=3)
    took = reports.get(0, {}).get("destroy_s")
    assert took is not None, f"{reports}\n{logs}"
    print(f"[multihost] stopped peer: rank 0's destroy_process_group took {took:.3f} s")
    assert took < 1.0, f"destroy_process_group took {took:.2f} s\n{logs}"
    for r in range(HOSTS * RANKS_PER_HOST):
        assert reports.get(r, {}).get("rc") == 0, f"rank {r}: {reports.get(r)}\n{logs}"


# --- Fault matrix (issue 10): a peer on another host, or on this one, is SIGKILLed before
# or during every kind of collective (a sparse all_reduce included), at 8 B and at 4 MiB
# (many receives in flight per peer); no survivor may crash, and each must raise
# DistBackendError naming the dead rank within 2x the timeout. See
# multihost_fault_matrix.py for how one launch runs hundreds of trials.

MATRIX_SCRIPT = os.path.join(HERE, "multihost_fault_matrix.py")
MATRIX_TIMEOUT_S = 2.0
SURVIVORS = {"s0": 0, "s1": 0, "s2": 1}  # role: host
MATRIX_CONFIGS = ["remote2", "mixed4", "mixed4-noshm"]


def _matrix_literal(name):
    """A literal the script defines, read from its source (the script runs at import):
    its default op list, OPS, has one source."""
    with open(MATRIX_SCRIPT) as f:
        tree = ast.parse(f.read(), MATRIX_SCRIPT)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no {name} in {MATRIX_SCRIPT}")


MATRIX_OPS = _matrix_literal("OPS")


def launch_matrix(hosts, env, limit):
    """Runs the fault matrix once; returns ({role: [trial records]}, logs, {role: exit code}, hung).

    Each configuration runs as a stream of its own (its own store, survivors and
    factory, started at once): a trial mostly waits (the grace before a survivor that
    no longer needs the dead peer gives up, detection, the group's set-up), so the
    streams overlap on 2 cores where one after another they took three times as long."""
    configs = env.get("RINGX_FM_CONFIGS", ",".join(MATRIX_CONFIGS)).split(",")
    out = tempfile.mkdtemp(prefix="ringx-faultmatrix-")
    roles = {0: ["s0", "s1"], 1: ["s2", "factory"]}
    procs = []
    try:
        for config in configs:
            port = free_port()
            sub = os.path.join(out, config)
            os.mkdir(sub)
            for h, (ns, _addr) in enumerate(hosts):
                starts = " & ".join(
                    f"( {sys.executable} {MATRIX_SCRIPT} {sub} {role} {MATRIX_TIMEOUT_S} > {sub}/{role}.log 2>&1; "
                    f"echo $? > {sub}/{role}.rc )" for role in roles[h])
                penv = dict(os.environ, MASTER_ADDR=hosts[0][1], MASTER_PORT=str(port), TORCH_CPP_LOG_LEVEL="ERROR",
                            LOCAL_WORLD_SIZE="2", **dict(env, RINGX_FM_CONFIGS=config))
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns, "unshare", "--pid", "--uts", "--mount-proc", "--fork", "sh", "-c",
                     f"hostname host{h}; {OWN_DEV_SHM}; {starts} & wait"], env=penv, start_new_session=True))
        deadline = time.time() + limit
        while time.time() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.2)
        hung = [p for p in procs if p.poll() is None]
        for p in hung:
            os.killpg(p.pid, 9)
        reports, logs, codes = {}, "", {}
        for config in configs:
            sub = os.path.join(out, config)
            for role in ["s0", "s1", "s2", "factory"]:
                path = os.path.join(sub, f"{role}.json")
                if os.path.exists(path):
                    with open(path) as f:
                        reports.setdefault(role, []).extend(json.load(f))
                rc = os.path.join(sub, f"{role}.rc")
                key = f"{config}/{role}"
                codes[key] = int(open(rc).read()) if os.path.exists(rc) else None
                with open(os.path.join(sub, f"{role}.log"), errors="replace") as f:
                    logs += f"--- {key} (exit {codes[key]})\n{f.read()[-3000:]}\n"
        return reports, logs, codes, bool(hung)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
        shutil.rmtree(out, ignore_errors=True)


def check_matrix(reports, logs, codes, hung, expected_trials):
    """Every survivor exited cleanly after every trial; in each trial it raised DistBackendError
    naming the dead rank (in the collective, or, where its part only sends and the send
    completed, in the barrier after it) well before the timeout. Returns a summary per case."""
    crashed = {r: c for r, c in codes.items() if c != 0}
    assert not crashed and not hung, f"processes crashed or hung: {crashed} hung={hung}\n{logs}"
    summary = {}
    for role, records in reports.items():
        assert len(records) == expected_trials[role], f"{role}: {len(records)} trials recorded\n{logs}"
        for rec in records:
            victim, call, bar = rec["victim"], rec["call"], rec["barrier"]
            where = (f"{role} (rank {rec['rank']}) {rec['config']} {rec['op']} {rec['bytes']} B {rec['when']} "
                     f"rep {rec['rep']}")
            remote = SURVIVORS[role] == 0
            key = (rec["config"], "remote" if remote else "local", rec["op"], rec["bytes"], rec["when"])
            s = summary.setdefault(key, {"runs": 0, "raised": 0, "raised_at_call": 0,
                                         "completed_then_barrier_raised": 0, "max_s": 0.0})
            s["runs"] += 1
            if call["ok"]:
                # A call may complete where this rank's part did not need the victim (it
                # only sends, or its data came from survivors: a broadcast subtree), or,
                # during, where the victim's part had arrived before it died; its result
                # must then be right. A barrier cannot pass without the victim.
                assert call["correct"], f"{where}: returned a wrong result\n{logs}"
                assert rec["when"] == "during" or rec["op"] != "barrier", \
                    f"{where}: a barrier passed although the victim died before it\n{logs}"
                failure = bar
                s["completed_then_barrier_raised"] += 1
            else:
                failure = call
                s["raised"] += 1
                s["raised_at_call"] += call.get("raised_in") == "call"
            assert not failure["ok"], f"{where}: the barrier after the victim's death returned\n{logs}"
            assert failure["type"] == "DistBackendError", f"{where}: {failure}\n{logs}"
            # "connection to rank V closed", in a single-copy algorithm (same host) followed
            # by ": its process exited, or left the group, while this rank copied its
            # memory ..." or "... before it finished this collective".
            assert "closed" in failure["msg"] and f"rank {victim}" in failure["msg"], f"{where}: {failure}\n{logs}"
            # Issue 10 allows 2x the timeout; a closed connection is seen long before
            # the deadline (at most 0.76 s of the 2 s here), so an error that came
            # near the timeout was held back after the death was known.
            assert failure["seconds"] < 0.75 * MATRIX_TIMEOUT_S, \
                f"{where}: the death was reported only at the group's timeout: {failure}\n{logs}"
            s["max_s"] = max(s["max_s"], failure["seconds"])
    return summary


def print_summary(title, summary):
    print(f"[multihost matrix] {title}")
    for key, s in sorted(summary.items()):
        at_call = f" ({s['raised_at_call']} at the call, before any Work)" if s["raised_at_call"] else ""
        print(f"  {' '.join(map(str, key))}: {s['runs']} runs, {s['raised']} raised in the call{at_call}, "
              f"{s['completed_then_barrier_raised']} completed correctly (without needing the victim, or "
              f"with its part delivered) then raised in the barrier, max {s['max_s']:.2f} s, 0 crashes")


def expected_trials(env):
    configs = env.get("RINGX_FM_CONFIGS", ",".join(MATRIX_CONFIGS)).split(",")
    per_config = (len(env.get("RINGX_FM_OPS", ",".join(MATRIX_OPS)).split(",")) *
                  len(env.get("RINGX_FM_SIZES", "8,4194304").split(",")) *
                  len(env.get("RINGX_FM_WHEN", "before,during").split(",")) * int(env.get("RINGX_FM_REPS", "5")))
    mixed = sum(c.startswith("mixed4") for c in configs)
    return {"s0": per_config * len(configs), "s1": per_config * mixed, "s2": per_config * mixed}


@pytest.mark.parametrize("algo", ["", "all_reduce:ring"], ids=["default", "ring"])
def test_survivor_does_not_crash_when_remote_peer_dies_during_4mib_all_reduce(hosts, algo):
    """The reproduction of issue 10: world 2 across hosts, a 4 MiB all_reduce pending on
    rank 0 (many receives from rank 1 in flight) while rank 1 is killed. It crashed rank 0
    with SIGSEGV in most runs (peer failure handling re-entered itself)."""
    env = {"RINGX_FM_CONFIGS": "remote2", "RINGX_FM_OPS": "all_reduce", "RINGX_FM_SIZES": "4194304",
           "RINGX_FM_WHEN": "during", "RINGX_FM_REPS": "10", "RINGX_ALGO": algo}
    reports, logs, codes, hung = launch_matrix(hosts, env, limit=180)
    print_summary(f"RINGX_ALGO={algo!r}", check_matrix(reports, logs, codes, hung, expected_trials(env)))


def test_fault_matrix_every_collective_remote_and_local_victims(hosts):
    """Every collective kind x {8 B, 4 MiB} x {killed before, during the call} x {world 2
    across hosts, world 4 with remote and local survivors over shared memory, the same
    with RINGX_SHM=0}, 2 runs each, the three layouts side by side. (5 runs each cost
    190 cpu-s and 3 runs 125, a tenth of make test's py-test stage, whose CPU is CI's
    limit; the issue-10 reproduction above repeats its case 10 times.)"""
    env = {"RINGX_FM_REPS": "2"}
    reports, logs, codes, hung = launch_matrix(hosts, env, limit=900)
    print_summary("all collectives", check_matrix(reports, logs, codes, hung, expected_trials(env)))
