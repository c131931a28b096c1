"""Subgroups: new_group over subsets and permuted orders (sort_ranks=False), several
groups alive, group-local ranks, collectives and p2p inside groups, async ops on several
groups at once, destroy_process_group(group), split_group; and a world started with a
mixed backend string that routes CPU tensors to the backend under test.

split_group on torch 2.13: the public dist.split_group refuses before reaching any backend
unless the default group is bound to a device (init_process_group(device_id=...), which
only accepts an accelerator) and torch.accelerator.is_available() (or torchcomms is on),
so on a CPU-only machine it cannot work for any backend, gloo included.  What a backend
provides is Backend::split (+ supportsSplitting, getBackendOptions), reached through
ProcessGroup.split_group, which is what test_pg_split_group exercises;
test_public_split_group records the torch limitation (skip) and checks the result where
the API does work.
"""

import os
import re

import pytest
import torch

import cases_subgroups as cases
import harness
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))


def _check_group(res, name, ranks, sort_ranks, me, where):
    """Failure texts for one group's results on rank `me`."""
    order = cases.group_order(ranks, sort_ranks)
    n = len(order)
    failures = []
    if me not in ranks:
        if res["rank"] != -1 or not res["is_non_member"]:
            failures.append(f"{where}: non-member: get_rank(group) {res['rank']}, group is "
                            f"NON_GROUP_MEMBER: {res['is_non_member']}")
        return failures
    want_q = {"rank": order.index(me), "size": n, "global_ranks": order,
              "group_rank_of_me": order.index(me)}
    for k, v in want_q.items():
        if res.get(k) != v:
            failures.append(f"{where}: {k} = {res.get(k)}, expected {v} (group order {order})")
    checks = {
        "all_reduce": (torch.full((5,), sum(r + 1 for r in ranks), dtype=torch.int64), "int64"),
        "broadcast": (cases._value(SEED, name + "/bcast", order[-1]), "float32"),
        "all_gather": (torch.cat([cases._value(SEED, name + "/ag", g) for g in order]), "float32"),
        "all_to_all_single": (torch.cat([cases._value(SEED, f"{name}/a2a/{order.index(me)}", g, 3)
                                         for g in order]), "float32"),
    }
    if me == order[-1]:
        inputs = [refs.make_input(refs.seed_for(SEED, "subgroup", name + "/reduce"), g, "int64", 9)
                  for g in order]
        checks["reduce"] = (refs.reference_allreduce(inputs, "int64", "SUM")[0], "int64")
    if n >= 2 and me == order[1]:
        checks["send_recv"] = (cases._value(SEED, name + "/p2p", order[0]), "float32")
    for op, (want, dtype) in checks.items():
        if op not in res:
            continue  # not run (an earlier error is reported)
        msg = refs.compare(res[op], want, None, f"{where}: {op}", dtype)
        if msg:
            failures.append(msg)
    return failures


@pytest.mark.parametrize("ws", (2, 3, 4, 8), ids=lambda w: f"ws{w}")
def test_new_group_subsets_and_orders(worlds, ws):
    specs = cases.group_specs(ws)
    results = worlds.run(ws, cases.subgroup_ops, seed=SEED, specs=specs)
    failures = []
    for name, ranks, sort_ranks in specs:
        per_rank = [results[r][name] for r in range(ws)]
        failures += refs.errors_of(per_rank, f"group {name} {ranks} sort_ranks={sort_ranks}")
        for me in range(ws):
            failures += _check_group(per_rank[me], name, ranks, sort_ranks, me,
                                     f"rank {me}: group {name} {ranks} sort_ranks={sort_ranks} "
                                     f"world {ws}")
    for r in range(ws):
        if results[r]["__world__"] != float(ws):
            failures.append(f"rank {r}: default group all_reduce afterwards gave "
                            f"{results[r]['__world__']}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (2, 3, 4, 8), ids=lambda w: f"ws{w}")
def test_async_ops_on_several_groups_at_once(worlds, ws):
    count = 50_000
    results = worlds.run(ws, cases.concurrent_async, seed=SEED, count=count)
    failures = refs.errors_of(results, f"concurrent async all_reduce world {ws}")
    members = {"default": list(range(ws)), "world_reversed": list(range(ws)),
               "evens": list(range(0, ws, 2)), "odds": list(range(1, ws, 2))}
    for name, ranks in members.items():
        s = refs.seed_for(SEED, "concurrent", name)
        inputs = [refs.make_input(s, r, "float32", count) for r in ranks]
        if not inputs:
            continue
        expected, tol = refs.reference_allreduce(inputs, "float32", "SUM")
        for r in ranks:
            if refs.ERROR_KEY in results[r]:
                continue
            msg = refs.compare(results[r].get(name), expected, tol,
                               f"rank {r}: async all_reduce on group {name} {ranks} world {ws}",
                               "float32")
            if msg:
                failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (2, 3, 4), ids=lambda w: f"ws{w}")
def test_destroy_process_group_of_subgroup(worlds, ws):
    rounds = 4
    results = worlds.run(ws, cases.destroy_and_recreate, rounds=rounds)
    failures = refs.errors_of(results, f"destroy_process_group(group) world {ws}")
    for r, res in enumerate(results):
        if refs.ERROR_KEY in res:
            continue
        for i, (s_all, s_sub) in enumerate(res["sums"]):
            sub = [x for x in range(ws) if (x + i) % 2 == 0] or [0]
            if s_all != ws * (ws + 1) / 2:
                failures.append(f"rank {r}: round {i}: all-ranks group sum {s_all}")
            if (r in sub) and s_sub != sum(x + 1 for x in sub):
                failures.append(f"rank {r}: round {i}: subgroup {sub} sum {s_sub}")
        if res["world"] != float(ws):
            failures.append(f"rank {r}: default group after destroying subgroups gave "
                            f"{res['world']}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", (2, 3), ids=lambda w: f"ws{w}")
def test_group_destroyed_by_a_peer_as_soon_as_built(worlds, ws):
    rounds = 30
    results = worlds.run(ws, cases.built_then_destroyed_at_once, rounds=rounds)
    failures = refs.errors_of(results, f"new_group then destroy at once, world {ws}")
    for r, res in enumerate(results):
        if refs.ERROR_KEY in res:
            continue
        if res["failed"]:
            i, text = res["failed"]
            failures.append(f"rank {r}: round {i}: new_group failed: {text}")
        elif res["rounds"] != rounds:
            failures.append(f"rank {r}: stopped after {res['rounds']} of {rounds} rounds "
                            f"(another rank's new_group failed)")
        if res["world"] != float(ws):
            failures.append(f"rank {r}: default group afterwards gave {res['world']}")
    assert not failures, refs.report(failures)


SPLITS = {
    2: [0, 1],
    3: [0, 0, 1],
    4: [1, 0, 1, 0],
}


@pytest.mark.skipif(harness.BACKEND == "gloo", reason=(
    "ProcessGroupGloo::split in torch 2.13 hangs intermittently when two split groups form "
    "at once (about 1 run in 4 with plain torchrun, 4 ranks split [0,2] / [1,3]: one rank "
    "never returns from split_group); the test passes under gloo when it does not hang"))
@pytest.mark.parametrize("ws", sorted(SPLITS), ids=lambda w: f"ws{w}")
def test_pg_split_group(worlds, ws):
    colours = SPLITS[ws]
    results = worlds.run(ws, cases.pg_split_group, seed=SEED, color_of_rank=colours)
    failures = refs.errors_of(results, f"ProcessGroup.split_group {colours} world {ws}")
    for r, res in enumerate(results):
        if res.get("world") != float(ws):
            failures.append(f"rank {r}: default group after split gave {res.get('world')}")
        if refs.ERROR_KEY in res:
            continue
        mine = [x for x in range(ws) if colours[x] == colours[r]]
        want = {"rank": mine.index(r), "size": len(mine), "sum": float(sum(x + 1 for x in mine)),
                "gathered": [float(x) for x in mine]}
        for k, v in want.items():
            if res.get(k) != v:
                failures.append(f"rank {r}: split group {mine}: {k} = {res.get(k)}, expected {v}")
    assert not failures, refs.report(failures)


def test_public_split_group(worlds):
    ws = 4
    colours = SPLITS[ws]
    results = worlds.run(ws, cases.public_split_group, color_of_rank=colours)
    raised = [r for r in results if r[0] == "raised"]
    if raised and not torch.accelerator.is_available() and all(
            "No device associated with the default pg" in r[2] for r in raised):
        pytest.skip("torch 2.13's dist.split_group needs a device-bound default group and an "
                    f"accelerator; on this CPU-only machine it refuses first: {raised[0][2]}")
    failures = []
    for r, res in enumerate(results):
        mine = [x for x in range(ws) if colours[x] == colours[r]]
        want = ("ok", mine.index(r), len(mine), float(sum(x + 1 for x in mine)))
        if tuple(res) != want:
            failures.append(f"rank {r}: dist.split_group gave {res}, expected {want}")
    assert not failures, refs.report(failures)


# ------------------------------------------------------------------ mixed backend string


class MixedBackendWorld(harness.World):
    """A World whose init_process_group gets a mixed backend string.

    harness.World starts workers with harness._worker_main, which imports ringx only for
    backend == "ringx"; this copy of World._start_once differs only in the worker target.
    (A `worker_target` hook in harness.World would make the copy unnecessary.)
    """

    def _start_once(self):
        saved = harness._worker_main
        harness._worker_main = cases.worker_main_importing_ringx
        try:
            super()._start_once()
        finally:
            harness._worker_main = saved


def mixed_backend_string(backend):
    other = "gloo"
    return f"cpu:{backend},cuda:{other}"


@pytest.fixture(scope="module")
def mixed_world():
    w = MixedBackendWorld(3, mixed_backend_string(harness.BACKEND))
    try:
        yield w
    finally:
        w.close()


def test_mixed_backend_string_routes_cpu(mixed_world):
    ws = mixed_world.size
    spec = mixed_world.backend
    results = mixed_world.run(cases.backend_routing)
    failures = refs.errors_of(results, f"world initialised with {spec!r}")
    want_type = {"ringx": "ProcessGroupRingx", "gloo": "ProcessGroupGloo"}[harness.BACKEND]
    for r, res in enumerate(results):
        where = f"rank {r} ({spec!r})"
        if harness.BACKEND not in res["get_backend"]:
            failures.append(f"{where}: dist.get_backend() = {res['get_backend']!r}")
        if f"cpu:{harness.BACKEND}" not in res["backend_config"]:
            failures.append(f"{where}: dist.get_backend_config() = {res['backend_config']!r}, "
                            f"expected it to map cpu to {harness.BACKEND}")
        if res["cpu_backend_type"] != want_type:
            failures.append(f"{where}: the backend for device cpu is {res['cpu_backend_type']}, "
                            f"expected {want_type}")
        want = {"all_reduce": ws * (ws + 1) / 2, "broadcast": 13.0 * (ws - 1),
                "all_gather": [v for x in range(ws) for v in (x, x * x)], "barrier": True}
        for op, v in want.items():
            if op in res and res[op] != v:
                failures.append(f"{where}: {op} gave {res[op]}, expected {v}")
    assert not failures, refs.report(failures)


@pytest.mark.skipif(harness.BACKEND != "ringx", reason="counts ringx's own log lines")
def test_pg_split_group_builds_one_communicator_per_rank():
    """torch calls Backend.split once per device type ringx serves (cpu, cuda); the
    second call must reuse the first group, not build another."""
    with harness.World(4, env={"RINGX_DEBUG": "INFO"}) as world:
        results = world.run(cases.pg_split_group, seed=SEED, color_of_rank=SPLITS[4])
        failures = refs.errors_of(results, "ProcessGroup.split_group world 4")
        for r in range(world.size):
            ups = re.findall(r"ringx: rank \d+/2 up", world.log_text(r))
            if len(ups) != 1:
                failures.append(f"rank {r}: {len(ups)} communicators built for its split group")
    assert not failures, refs.report(failures)


@pytest.mark.skipif(harness.BACKEND != "ringx", reason="checks ringx's own error text")
def test_pg_split_group_rejects_bad_ranks(worlds):
    results = worlds.run(2, cases.pg_split_group_bad_ranks, ranks=[0, 7])
    for r, res in enumerate(results):
        assert res["raised"] is not None, f"rank {r}: split_group([0, 7]) returned"
        etype, msg = res["raised"]
        assert etype == "ValueError", f"rank {r}: {etype}: {msg}"
        assert f"ringx: split_group (rank {r}): rank 7 is out of range for a group of size 2" in msg, msg
        assert res["world_ok"], f"rank {r}: the default group broke after the rejected split"
