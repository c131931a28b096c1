"""Ranks on two "hosts": each host is a network, pid and UTS namespace of its own
(`ip netns` + a veth pair, `unshare --pid --uts`), so ringx and UCX see different
machines: no shared memory between them, traffic over TCP on the veth link, remote
peer failure detected by UCX rather than by watching pids.

World 4: ranks 0 and 1 on host A (10.77.x.1), ranks 2 and 3 on host B, so every
collective mixes intra-host (shared memory) and inter-host (TCP) pairs.

Needs root (namespaces) and iproute2, which `make test` installs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

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


def launch(hosts, mode, victim=-1, limit=120):
    """Starts RANKS_PER_HOST ranks in each host namespace; returns {rank: report}."""
    out = tempfile.mkdtemp(prefix="ringx-multihost-")
    master_addr = hosts[0][1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = HOSTS * RANKS_PER_HOST
    procs = []
    try:
        for h, (ns, _addr) in enumerate(hosts):
            ranks = range(h * RANKS_PER_HOST, (h + 1) * RANKS_PER_HOST)
            starts = " & ".join(
                f"RANK={r} LOCAL_RANK={r % RANKS_PER_HOST} {sys.executable} {RANK_SCRIPT} {out} {mode} {victim} "
                f"{TIMEOUT_S} > {out}/rank{r}.log 2>&1" for r in ranks)
            env = dict(os.environ, MASTER_ADDR=master_addr, MASTER_PORT=str(port), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(RANKS_PER_HOST), TORCH_CPP_LOG_LEVEL="ERROR")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--pid", "--uts", "--mount-proc", "--fork", "sh", "-c",
                 f"hostname host{h}; {starts} & wait"], env=env, start_new_session=True))
        deadline = time.time() + limit
        while time.time() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        hung = [p for p in procs if p.poll() is None]
        for p in hung:
            os.killpg(p.pid, 9)
        reports, logs = {}, ""
        for r in range(world):
            path = os.path.join(out, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    reports[r] = json.load(f)
            with open(os.path.join(out, f"rank{r}.log"), errors="replace") as f:
                logs += f"--- rank {r}\n{f.read()[-3000:]}\n"
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
