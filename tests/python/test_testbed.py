"""The multi-host test bed (tools/testbed.py, `make testbed`): hosts as namespaces on a
bridge, links shaped with tc, torchrun with c10d rendezvous on every host. Checks that
a job spanning the hosts runs and computes right, that ringx sees the hosts as the
test bed lays them out (RINGX_DEBUG=INFO's topology line), and that nothing is left
behind.

Needs root (namespaces) and iproute2, which `make test` installs.
"""

import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))

import testbed  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network and pid namespaces need root")


def namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_torchrun_job_spans_shaped_hosts_and_leaves_nothing_behind():
    before = namespaces()
    with testbed.Testbed(2, rate="1gbit") as tb:
        for ns in tb.names + [tb.switch]:
            assert ns in namespaces()
        qdisc = subprocess.run(["tc", "-n", tb.names[0], "qdisc", "show", "dev", "eth0"], capture_output=True,
                               text=True).stdout
        assert "tbf" in qdisc and "1Gbit" in qdisc, qdisc
        codes, logs = tb.torchrun(2, os.path.join(HERE, "testbed_rank.py"), env={"RINGX_DEBUG": "INFO"},
                                  timeout=300)
    text = "\n".join(logs)
    assert codes == [0, 0], text[-6000:]
    for r in range(4):
        assert f"testbed rank {r}/4 on host{r // 2}: ok" in text, text[-6000:]
    assert ("2 hosts: host 0 = ranks 0-1 (shared memory, two-copy); host 1 = ranks 2-3 (shared memory, two-copy)"
            in text), text[-6000:]
    # Two ranks on each host: these run hierarchically (broadcast from rank 3, whose flat
    # tree would cross its host's link twice).
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert re.search(rf"{coll}\w* \(rank \d, seq \d+\): algorithm hier", text), (coll, text[-6000:])
    # The other host's ranks are reached over TCP on the test bed's link.
    assert re.search(r"rank 0 on UCX [\d.]+: .*ranks 2,3 over [^;]*tcp/eth0", text), text[-6000:]
    assert namespaces() == before


def quick_job(hosts, per_host, **bed):
    """testbed_rank.py --quick on `hosts` hosts of `per_host` ranks, every call's algorithm
    logged: checks that every rank computed right and returns the logs."""
    with testbed.Testbed(hosts, **bed) as tb:
        codes, logs = tb.torchrun(per_host, os.path.join(HERE, "testbed_rank.py"), ["--quick"],
                                  env={"RINGX_DEBUG": "INFO"}, timeout=120)
    text = "\n".join(logs)
    assert codes == [0] * hosts, text[-6000:]
    world = hosts * per_host
    for r in range(world):
        assert f"testbed rank {r}/{world} on host{r // per_host}: ok" in text, text[-6000:]
    return text


def test_four_hosts_of_two_ranks_run_the_hierarchical_all_reduce_broadcast_and_all_gather():
    """The wide layout of issue 45, 4 hosts x 2 ranks (8 ranks on the machine's cores):
    ringx sees four hosts of two, chooses the hierarchical algorithms (and the direct
    gather and scatter), and they compute right. Kept short (--quick: three sizes of
    all_reduce, all_gather, broadcast, gather, scatter)."""
    text = quick_job(4, 2)
    assert re.search(r"4 hosts: " + "; ".join(rf"host {h} = ranks {2 * h}-{2 * h + 1} \(shared memory, [\w -]+\)"
                                                for h in range(4)), text), text[-6000:]
    # broadcast is from rank 7, on the last host; 1.2 MB of it crosses among the four
    # hosts along a chain.
    for coll in ("all_reduce", "all_gather", "broadcast"):
        assert re.search(rf"{coll}\w* \(rank \d, seq \d+\): algorithm hier", text), (coll, text[-6000:])
    assert re.search(r"broadcast \(rank \d, seq \d+\): algorithm hier\(chain\), 1200000 bytes", text), text[-6000:]
    # gather and scatter go straight between each rank and the root, into and out of the
    # root's separate tensors.
    for coll in ("gather", "scatter"):
        assert re.search(rf"\b{coll} \(rank 1, seq \d+\): algorithm direct, 1200000 bytes, 8 separate tensors in place",
                         text), (coll, text[-6000:])


def test_hosts_of_one_rank_each_broadcast_a_large_buffer_along_a_chain_and_a_small_one_by_the_tree():
    """Three hosts of one rank: no host shares memory, so broadcast is flat; the
    binomial tree for 4 KB, the chain, which crosses every link once, for 1.2 MB."""
    text = quick_job(3, 1, rate="1gbit")
    assert re.search(r"broadcast \(rank \d, seq \d+\): algorithm binomial, 4000 bytes", text), text[-6000:]
    assert re.search(r"broadcast \(rank \d, seq \d+\): algorithm chain, 1200000 bytes", text), text[-6000:]


def test_ranks_in_pid_namespaces_of_their_own_share_their_hosts_memory_and_compute_right():
    """The "containers" layout: each rank in a pid namespace of its own, a host's ranks
    sharing its network namespace and /dev/shm. ringx finds the hosts by what the ranks
    can map, so each host's ranks share memory (two-copy: a peer's process is not
    visible for a single copy) and the hierarchical algorithms run, as in one pid
    namespace per host."""
    with testbed.Testbed(2) as tb:
        codes, logs = tb.torchrun(2, os.path.join(HERE, "testbed_rank.py"), env={"RINGX_DEBUG": "INFO"},
                                  timeout=300, layout="containers")
    text = "\n".join(logs)
    assert codes == [0, 0], text[-6000:]
    pidns = set()
    for r in range(4):
        seen = re.search(rf"testbed rank {r}/4 on host{r // 2}: ok \((pid:\[\d+\])\)", text)
        assert seen, text[-6000:]
        pidns.add(seen.group(1))
    assert len(pidns) == 4, pidns
    assert ("2 hosts: host 0 = ranks 0-1 (shared memory, two-copy); host 1 = ranks 2-3 (shared memory, two-copy)"
            in text), text[-6000:]
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        assert re.search(rf"{coll}\w* \(rank \d, seq \d+\): algorithm hier", text), (coll, text[-6000:])


@pytest.mark.parametrize("layout,path", [("hosts", "shared memory, single copy"),
                                         ("containers", "shared memory, two-copy")])
def test_ranks_of_one_host_share_memory_with_single_copy_only_where_they_see_each_others_processes(layout, path):
    """One host of two ranks: in one pid namespace they read each other's memory (CMA);
    each in a pid namespace of its own, they still share /dev/shm but not their
    processes, so the group takes the two-copy slots. --quick: the path is what is
    checked here; the whole battery runs on the two-copy path in the tests above, and
    test_cma.py's suites on the single copy."""
    with testbed.Testbed(1) as tb:
        codes, logs = tb.torchrun(2, os.path.join(HERE, "testbed_rank.py"), ["--quick"],
                                  env={"RINGX_DEBUG": "INFO"}, timeout=300, layout=layout)
    text = "\n".join(logs)
    assert codes == [0], text[-6000:]
    for r in range(2):
        assert f"testbed rank {r}/2 on host0: ok" in text, text[-6000:]
    assert f"1 host: host 0 = ranks 0-1 ({path})" in text, text[-6000:]


def test_uneven_hosts_run_the_hierarchical_all_reduce_and_the_others_flat():
    with testbed.Testbed(2) as tb:
        codes, logs = tb.torchrun([3, 1], os.path.join(HERE, "testbed_rank.py"),
                                  env={"RINGX_DEBUG": "INFO"}, timeout=300)
    text = "\n".join(logs)
    assert codes == [0, 0], text[-6000:]
    for r in range(4):
        assert re.search(rf"testbed rank {r}/4 on host\d: ok", text), text[-6000:]
    assert "2 hosts: host 0 = ranks 0-2 (shared memory, two-copy); host 1 = ranks 3 (network)" in text, text[-6000:]
    # all_reduce cuts its chunks into as many portions as the largest host
    # has ranks; the others need the same number of ranks on every host.
    assert re.search(r"all_reduce\w* \(rank \d, seq \d+\): algorithm hier", text), text[-6000:]
    for coll in ("all_gather", "reduce_scatter"):
        assert not re.search(rf"{coll}\w* \(rank \d, seq \d+\): algorithm hier", text), (coll, text[-6000:])


def test_testbed_removes_its_namespaces_when_the_body_raises():
    before = namespaces()
    with pytest.raises(RuntimeError, match="body failed"):
        with testbed.Testbed(3):
            raise RuntimeError("body failed")
    assert namespaces() == before
