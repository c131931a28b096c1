"""The single-copy (CMA, process_vm_readv) intra-host algorithms (issue 16).

* Every data-movement suite (all_gather in all its forms, gather and scatter from every
  root, broadcast from every root, all_to_all with equal, uneven and zero splits, list
  and 2-D forms) runs in worlds of 2, 3 and 4 with RINGX_ALGO=cma, every dtype of those
  suites, and the logs (RINGX_DEBUG=INFO) prove that the single copy ran.
* The single-copy reduce_scatter (forced: the cost model does not choose it) runs its whole
  suite in worlds of 2, 3 and 4; the all_reduce's runs in test_allreduce_algorithms.py.
* RINGX_CMA=0 with RINGX_ALGO=cma: the probe is skipped, the log says so, and the slot
  and UCX algorithms serve the same calls correctly.
* Ranks that disagree (element counts of all_gather, all_reduce and reduce_scatter,
  all_to_all split sizes) fail on every rank involved, quickly, and return no data.
* Faults (fresh processes, fault_scripts/cma_faults.py): a rank SIGKILLed while its peers
  copy its memory (all_gather, all_reduce, reduce_scatter; a lopsided all_to_all where it
  writes tails into its peers, and one where they write into it), or before it joins; ranks the
  kernel forbids to read each other (not dumpable, no CAP_SYS_PTRACE): RINGX_CMA=auto falls
  back and says why, RINGX_CMA=1 fails group creation with a ValueError.
"""

import os
import re
import sys

import pytest
import torch

import cases_cma
import harness
import test_broadcast
import test_collectives_alltoall
import test_collectives_gather
import test_collectives_reduce

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_scripts"))
import faultlib  # noqa: E402

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="RINGX_ALGO and RINGX_CMA are ringx's")

WORLD_SIZES = (2, 3, 4)
ALGO_LINE = re.compile(r"ringx: (\w+) \(rank \d+, seq \d+\): algorithm (\w+),")
DATA_MOVEMENT = {"broadcast", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
                 "all_gather_into_tensor_coalesced", "gather", "scatter", "all_to_all",
                 "all_to_all_single"}
FAULT_TIMEOUT = 4.0


class _OneWorld:
    """The `worlds` fixture's interface over one world, so that the suites' own checks run
    on a world with an environment of its own."""

    def __init__(self, world):
        self.world = world

    def run(self, ws, fn, **kwargs):
        assert ws == self.world.size
        return self.world.run(fn, **kwargs)


def algorithms_used(world):
    """{op name: {algorithm}} over every rank's log."""
    used = {}
    for r in range(world.size):
        for m in ALGO_LINE.finditer(world.log_text(r)):
            used.setdefault(m.group(1), set()).add(m.group(2))
    return used


def run_data_movement_suites(world):
    ws, w = world.size, _OneWorld(world)
    for dtype in test_collectives_gather.DTYPES:
        test_collectives_gather.test_all_gather(w, ws, dtype)
        test_collectives_gather.test_gather(w, ws, dtype)
        test_collectives_gather.test_scatter(w, ws, dtype)
        test_collectives_alltoall.test_all_to_all_single(w, ws, dtype)
    for dtype in ("float32", "int64", "bool"):
        for form in ("separate", "views"):
            test_collectives_alltoall.test_all_to_all_list(w, ws, dtype, form)
    test_collectives_alltoall.test_all_to_all_single_2d(w, ws)
    for dtype in test_broadcast.DTYPES:
        for count in test_broadcast.SIZES:
            test_broadcast.test_broadcast(w, ws, dtype, count)
    test_broadcast.test_broadcast(w, ws, "float32", test_broadcast.LARGE)


@pytest.mark.parametrize("ws", WORLD_SIZES, ids=lambda w: f"ws{w}")
def test_forced_single_copy_matches_every_data_movement_suite(ws):
    with harness.World(ws, env={"RINGX_ALGO": "cma", "RINGX_DEBUG": "INFO"}) as world:
        run_data_movement_suites(world)
        used = algorithms_used(world)
        logs = "".join(world.log_text(r) for r in range(ws))
    assert "single-copy (CMA) on" in logs
    wrong = {op: algs for op, algs in used.items() if op in DATA_MOVEMENT and algs != {"cma"}}
    assert not wrong, f"RINGX_ALGO=cma but the logs show {wrong}"
    assert DATA_MOVEMENT - {"all_gather_coalesced", "all_gather_into_tensor_coalesced"} <= set(used), used


def test_cma_off_falls_back_to_the_slot_and_network_algorithms():
    with harness.World(3, env={"RINGX_ALGO": "cma", "RINGX_CMA": "0", "RINGX_DEBUG": "INFO"}) as world:
        w = _OneWorld(world)
        for dtype in ("float32", "uint8"):
            test_collectives_gather.test_all_gather(w, 3, dtype)
            test_collectives_gather.test_gather(w, 3, dtype)
            test_collectives_alltoall.test_all_to_all_single(w, 3, dtype)
        test_broadcast.test_broadcast(w, 3, "float32", test_broadcast.LARGE)
        used = algorithms_used(world)
        logs = "".join(world.log_text(r) for r in range(3))
    assert logs.count("single-copy (CMA) off: RINGX_CMA=0") == 3, logs[-2000:]
    assert not any("cma" in algs for algs in used.values()), used


@pytest.mark.parametrize("case,arg", [(cases_cma.all_gather_sizes_differ, 1000),
                                      (cases_cma.all_gather_sizes_differ, 2_000_000),
                                      (cases_cma.all_reduce_sizes_differ, 1000),
                                      (cases_cma.all_reduce_sizes_differ, 2_000_000),
                                      (cases_cma.reduce_scatter_sizes_differ, 2_000_000),
                                      (cases_cma.all_to_all_splits_disagree, 10),
                                      (cases_cma.all_to_all_splits_disagree, 1_000_000)],
                         ids=["all_gather-small", "all_gather-large", "all_reduce-small", "all_reduce-large",
                              "reduce_scatter-large", "all_to_all-small", "all_to_all-large"])
def test_disagreeing_ranks_fail_quickly_without_data(case, arg):
    ws, timeout_s = 3, 20.0
    with harness.World(ws, env={"RINGX_ALGO": "cma"}) as world:
        out = world.run(case, timeout_s=timeout_s, **({"base": arg} if "base" in case.__code__.co_varnames
                                                       else {"scale": arg}))
    # all_gather: every rank sees counts that differ from its own. all_to_all: the pair
    # (0, 1) disagrees and both of them must say so; rank 2 must too, small call or large:
    # every rank's split table lies in its slot, so it checks every pair.
    for r in range(ws):
        assert out[r][0] == "error", f"rank {r} returned {out[r]}"
        _, etype, msg, seconds = out[r]
        assert etype == "DistBackendError", out[r]
        assert re.match(rf"ringx: \w+ \(rank {r}, seq \d+\): ", msg), msg
        assert "Timed out" not in msg and seconds < timeout_s / 2, out[r]
        if case is cases_cma.all_to_all_splits_disagree and r == 2:
            assert "ranks 0 and 1 disagree on their split sizes" in msg, msg
        elif case is cases_cma.all_to_all_splits_disagree:
            assert f"rank {1 - r}" in msg and "split sizes disagree" in msg, msg
        else:
            assert "element count" in msg, msg


@pytest.mark.parametrize("ws", WORLD_SIZES, ids=lambda w: f"ws{w}")
def test_forced_single_copy_reduce_scatter_matches_its_suite(ws):
    """all_reduce's single copy runs the whole all_reduce matrix in
    test_allreduce_algorithms.py; reduce_scatter's here, every dtype, op and form.
    PREMUL_SUM takes the slot algorithm (each rank scales its own input as it copies it)."""
    with harness.World(ws, env={"RINGX_ALGO": "reduce_scatter:cma", "RINGX_DEBUG": "INFO"}) as world:
        w = _OneWorld(world)
        for dtype in test_collectives_reduce.DTYPES:
            test_collectives_reduce.test_reduce_scatter(w, ws, dtype)
        used = algorithms_used(world)
    algs = set().union(*(a for op, a in used.items() if op.startswith("reduce_scatter")))
    assert "cma" in algs and algs <= {"cma", "shm"}, used


def _fault(world_size, *args):
    env = {"RINGX_ALGO": "cma", "RINGX_DEBUG": "INFO"}
    return faultlib.launch("cma_faults.py", world_size, [str(a) for a in args], timeout=60 + 6 * FAULT_TIMEOUT,
                           env=env)


@pytest.mark.parametrize("ws,scenario,count,coll",
                         [(2, "dies_reading", 1 << 26, "all_gather"), (3, "dies_reading", 1 << 24, "all_gather"),
                          (3, "dies_reading", 1 << 24, "all_reduce"), (3, "dies_reading", 1 << 24, "reduce_scatter"),
                          (3, "dies_reading", 1 << 24, "all_to_all_from"),
                          (3, "dies_reading", 1 << 24, "all_to_all_to"),
                          (3, "dies_before", 1000, "all_gather")],
                         ids=["ws2-reading-256MiB", "ws3-reading-64MiB", "ws3-all_reduce-reading-192MiB",
                              "ws3-reduce_scatter-reading-64MiB", "ws3-all_to_all-victim-writes-64MiB",
                              "ws3-all_to_all-victim-written-64MiB", "ws3-before"])
def test_peer_killed_while_its_memory_is_read_fails_survivors_naming_it(ws, scenario, count, coll):
    out = _fault(ws, scenario, FAULT_TIMEOUT, count, coll)
    victim = ws - 1
    assert out[victim].event("dying") and out[victim].returncode == -9, out.report()
    for r in range(ws - 1):
        assert out[r].returncode == 0 and out[r].event("done"), out.report()
        rec = out[r].result("pending")
        assert not rec["ok"] and "DistBackendError" in rec["mro"], out.report()
        assert re.search(rf"rank {victim} closed", rec["msg"]), rec["msg"]
        assert rec["end"] - out[victim].event("dying")["t"] <= 2 * FAULT_TIMEOUT, out.report()
        print(f"[cma] {scenario} ws {ws}: rank {r} after "
              f"{rec['end'] - out[victim].event('dying')['t']:.2f} s: {rec['msg']}")


def test_unreadable_peers_fall_back_with_the_reason_logged():
    out = _fault(2, "refused", FAULT_TIMEOUT, "auto")
    for r in range(2):
        assert out[r].returncode == 0, out.report()
        assert out[r].result("init")["ok"] and out[r].result("fallback")["ok"], out.report()
        assert re.search(r"single-copy \(CMA\) off: rank \d could not read the memory of rank \d "
                         r"\(pid \d+\): process_vm_readv: Operation not permitted", out[r].log), out.report()


def test_cma_forced_on_between_unreadable_peers_fails_group_creation():
    out = _fault(2, "refused", FAULT_TIMEOUT, "1")
    for r in range(2):
        rec = out[r].result("init")
        assert not rec["ok"] and rec["type"] == "ValueError", out.report()
        assert rec["msg"].startswith(f"ringx: creating the process group (rank {r}): RINGX_CMA=1"), rec["msg"]
        assert "Operation not permitted" in rec["msg"], rec["msg"]


def _check_views(results, ws, count):
    for root in range(ws):
        want_rows = torch.stack([torch.arange(count, dtype=torch.float32) + 1000.0 * q + 100000.0 * root
                                 for q in range(ws)])
        sent = torch.arange(ws * count, dtype=torch.float32).view(ws, count) + 7.0 * root
        for r in range(ws):
            gathered, in_place, got, sent_after = results[r][root]
            assert torch.equal(got, sent[r]), f"rank {r} root {root}: scatter from row views"
            if r == root:
                assert torch.equal(gathered, want_rows), f"root {root}: gather into row views"
                assert torch.equal(in_place, want_rows), f"root {root}: gather into views, own row as input"
                assert torch.equal(sent_after, sent), f"root {root}: scatter modified its rows"


@pytest.mark.parametrize("count", (1, 1000, 300_001))
def test_gather_and_scatter_use_row_views_directly(worlds, count):
    _check_views(worlds.run(3, cases_cma.gather_scatter_views, count=count), 3, count)


def test_forced_single_copy_gather_and_scatter_use_row_views_directly():
    with harness.World(4, env={"RINGX_ALGO": "cma"}) as world:
        for count in (1, 1000, 300_001):
            _check_views(world.run(cases_cma.gather_scatter_views, count=count), 4, count)


@pytest.mark.parametrize("ws", (2, 3), ids=lambda w: f"ws{w}")
def test_forced_single_copy_copies_separate_tensors_in_place_and_packs_lists_it_cannot(ws):
    count = 3001
    with harness.World(ws, env={"RINGX_ALGO": "cma", "RINGX_DEBUG": "INFO"}) as world:
        results = world.run(cases_cma.separate_tensor_lists, count=count)
        logs = [world.log_text(r) for r in range(ws)]

    def value(q, dtype, length=count):
        v = torch.arange(length, dtype=torch.float32) + 1000.0 * q
        return torch.complex(v, -v).to(dtype) if dtype.is_complex else v.to(dtype)

    for r in range(ws):
        got = results[r]
        for dtype in (torch.float32, torch.complex64):
            for q in range(ws):
                assert torch.equal(got[("all_gather", str(dtype))][q], value(q, dtype)), (r, dtype, q)
            for root in range(ws):
                rows = got[("gather", str(dtype), root)]
                if r == root:
                    for q in range(ws):
                        assert torch.equal(rows[q], value(q, dtype)), ("gather", r, dtype, q)
                assert torch.equal(got[("scatter", str(dtype), root)], value(r + 7, dtype)), ("scatter", r, root)
        for key in ("all_gather strided", "all_gather own input"):
            for q in range(ws):
                assert torch.equal(got[key][q], value(q, torch.float32)), (key, r, q)
        mine, root_row = got["scatter into own row"]
        assert torch.equal(mine, root_row if r == 0 else value(r + 7, torch.float32)), ("scatter into own row", r)
        for key, dtype in [(("all_to_all", str(d)), d) for d in (torch.float32, torch.complex64)] + \
                [("all_to_all strided", torch.float32)]:
            for q in range(ws):
                want = value(q, dtype, count + q + 2 * r) + 10 * r
                assert torch.equal(got[key][q], want), (key, r, q)

    # Per rank: 2 dtypes x (1 all_gather + a gather and a scatter as root + 1 all_to_all of
    # 2 ws tensors) in place.
    in_place = [re.findall(r"ringx: (\w+) \(rank \d+, seq \d+\): algorithm cma, \d+ bytes, "
                           r"(\d+) separate tensors in place", log) for log in logs]
    want = sorted([("all_gather", str(ws))] * 2 + [("gather", str(ws))] * 2 + [("scatter", str(ws))] * 2 +
                  [("all_to_all", str(2 * ws))] * 2)
    for r in range(ws):
        assert sorted(in_place[r]) == want, (r, in_place[r])


def test_cost_model_takes_slots_for_small_calls_and_the_single_copy_for_large_ones():
    with harness.World(2, env={"RINGX_DEBUG": "INFO"}) as world:
        world.run(cases_cma.sizes_for_selection)
        lines = ALGO_LINE_WITH_BYTES.findall(world.log_text(0))
    chosen = [(op, alg, int(nbytes)) for op, alg, nbytes in lines if op in DATA_MOVEMENT]
    for op, alg, nbytes in chosen:
        if op == "all_to_all_single":
            # at every size, with split sizes or without: a rank may pass them where another
            # passes none, so both forms must choose alike
            assert alg == "cma", (op, alg, nbytes)
        else:
            assert alg == ("cma" if nbytes >= 1 << 20 else "shm"), (op, alg, nbytes)
    assert len(chosen) == 7, chosen


ALGO_LINE_WITH_BYTES = re.compile(r"ringx: (\w+) \(rank \d+, seq \d+\): algorithm (\w+), (\d+) bytes")
