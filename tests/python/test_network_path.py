"""The correctness suite's collectives on the network algorithms: RINGX_SHM=0 sends
everything through UCX (ring, recursive doubling, Rabenseifner, binomial trees,
pairwise all_to_all) even on one host, where the default picks the shared-memory
algorithms.  Every collective at a small count and at >= 1 MiB, through the same test
bodies and references as the default suite (called here with worlds of their own)."""

import re

import pytest

import harness
import test_allreduce as t_allreduce
import test_broadcast as t_broadcast
import test_collectives_alltoall as t_alltoall
import test_collectives_barrier as t_barrier
import test_collectives_coalesced as t_coalesced
import test_collectives_gather as t_gather
import test_collectives_reduce as t_reduce

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="RINGX_SHM is ringx's")


class NetworkWorlds:
    """The `worlds` interface of conftest.py over worlds started with RINGX_SHM=0."""

    def __init__(self, env=None):
        self.worlds = {}
        self.env = {"RINGX_SHM": "0", **(env or {})}

    def run(self, size, fn, *, timeout=None, **kwargs):
        if size not in self.worlds:
            self.worlds[size] = harness.World(size, env=self.env)
        return self.worlds[size].run(fn, timeout=timeout, **kwargs)

    def close(self):
        for w in self.worlds.values():
            w.close()


@pytest.fixture(scope="module")
def net():
    pool = NetworkWorlds()
    yield pool
    pool.close()


@pytest.mark.parametrize("ws,dtype,count", [(2, "float32", 7), (3, "bfloat16", 1000),
                                            (3, "float32", t_allreduce.LARGE),
                                            (4, "int64", t_allreduce.LARGE)])
def test_allreduce(net, ws, dtype, count):
    t_allreduce.test_allreduce(net, ws, dtype, count)


@pytest.mark.parametrize("ws,dtype,count", [(3, "float64", 7), (3, "float32", t_broadcast.LARGE)])
def test_broadcast(net, ws, dtype, count):
    t_broadcast.test_broadcast(net, ws, dtype, count)


# (3, "float32") also runs each test's count of 2**18 + 1 (1 MiB and 4 bytes).
@pytest.mark.parametrize("ws,dtype", [(2, "int64"), (3, "float32")])
def test_reduce(net, ws, dtype):
    t_reduce.test_reduce(net, ws, dtype)


@pytest.mark.parametrize("ws,dtype", [(2, "int64"), (3, "float32")])
def test_reduce_scatter(net, ws, dtype):
    t_reduce.test_reduce_scatter(net, ws, dtype)


@pytest.mark.parametrize("ws,dtype", [(2, "bool"), (3, "float32")])
def test_all_gather(net, ws, dtype):
    t_gather.test_all_gather(net, ws, dtype)


@pytest.fixture(scope="module")
def bruck():
    pool = NetworkWorlds({"RINGX_ALGO": "all_gather:bruck"})
    yield pool
    pool.close()


# Forced only (the cost model keeps the ring); 5 ranks wrap runs past the last block.
@pytest.mark.parametrize("ws,dtype", [(3, "float32"), (5, "int64")])
def test_all_gather_by_bruck_when_forced(bruck, ws, dtype):
    t_gather.test_all_gather(bruck, ws, dtype)


@pytest.mark.parametrize("ws,dtype", [(3, "float32")])
def test_gather(net, ws, dtype):
    t_gather.test_gather(net, ws, dtype)


@pytest.mark.parametrize("ws,dtype", [(3, "float32")])
def test_scatter(net, ws, dtype):
    t_gather.test_scatter(net, ws, dtype)


@pytest.mark.parametrize("ws,dtype", [(2, "int64"), (3, "float32")])
def test_all_to_all_single(net, ws, dtype):
    t_alltoall.test_all_to_all_single(net, ws, dtype)


def test_all_to_all_list(net):
    for form in ("separate", "views"):
        t_alltoall.test_all_to_all_list(net, 3, "float32", form)


def test_barriers(net):
    t_barrier.test_many_barriers(net, 3)
    t_barrier.test_barrier_waits_for_late_rank(net, 3)


def test_all_reduce_coalesced(net):
    t_coalesced.test_all_reduce_coalesced(net, 3, "float32", "SUM")
    t_coalesced.test_coalescing_manager_reduce_scatter(net, 3, True)


def test_info_log_names_the_ucx_in_use_and_each_peers_transports():
    with harness.World(3, env={"RINGX_SHM": "0", "RINGX_DEBUG": "INFO"}) as world:
        info = world.run(_ucx_version)
        text = world.log_text(1)
    line = re.search(r"ringx: rank 1 on UCX ([\d.]+): ranks 0,2 over ([^;\n]+)", text)
    assert line, text[-4000:]
    assert line.group(1) == info[1]
    # Whatever UCX picked between processes of one host, or why it cannot say.
    assert re.match(r"(\w+/\S+|\(UCX before 1\.14)", line.group(2)), line.group(0)


def _ucx_version():
    import ringx

    return ringx._C._ucx()["version"]


@pytest.mark.parametrize("env,asked,link", [({}, "^tcp", r"(?!tcp)\w+/"), ({"UCX_TLS": "tcp,self"}, None, r"tcp/"),
                                            ({"UCX_UNIFIED_MODE": "y"}, None, r"\w+/")])
def test_a_group_on_one_host_leaves_tcp_out_of_ucx_unless_the_user_chose(env, asked, link):
    # Shared memory carries a one-host group's UCX traffic anyway; TCP only
    # costs start-up. A user's UCX_TLS (or RINGX_TLS) stands.
    with harness.World(2, env=dict(env, RINGX_DEBUG="INFO")) as world:
        world.run(_all_reduce_of_ranks)
        text = world.log_text(1)
    line = re.search(r"ringx: rank 1 on UCX [\d.]+( \(transports ([^)]*)\))?: ranks? 0 over ([^;\n]+)", text)
    assert line, text[-4000:]
    assert line.group(2) == asked, line.group(0)
    assert re.match(link, line.group(3)) or line.group(3).startswith("(UCX before 1.14"), line.group(0)


def test_spin_auto_is_logged_and_gauges_waits_on_a_slow_peer():
    # RINGX_SPIN_US=auto stops spinning on waits for the network that outlast
    # the spin (a peer that sends late here); the data must still arrive.
    with harness.World(2, env={"RINGX_SPIN_US": "auto", "RINGX_DEBUG": "INFO"}) as world:
        world.run(_late_sends)
        text = world.log_text(0)
    line = re.search(r"ringx: rank 0 (spins|sleeps)[^\n]*RINGX_SPIN_US=auto[^\n]*", text)
    assert line, text[-4000:]
    said = line.group(0)
    assert "on the network alone only while" in said or "sleeps at once" in said, said


def _late_sends():
    import time

    import torch
    import torch.distributed as dist

    for k in range(12):
        t = torch.full((4,), float(k if dist.get_rank() == 1 else -1))
        if dist.get_rank() == 1:
            time.sleep(0.003)
            dist.send(t, 0)
        else:
            dist.recv(t, 1)
            assert t.tolist() == [float(k)] * 4


def _all_reduce_of_ranks():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    assert t.item() == 3.0
