"""gather, scatter, reduce and barrier with each algorithm forced through RINGX_ALGO.

On one host the cost model now picks the shared-memory algorithms for these, so the
default suite (test_collectives_gather.py, test_collectives_reduce.py,
test_collectives_barrier.py) exercises them there; here each algorithm, the binomial
trees, the direct gather and scatter and dissemination included, runs every root, odd and multi-chunk counts and
non-power-of-two worlds, and the worker logs prove the forced algorithm ran.
"""

import re

import pytest

import cases_collectives_barrier
import cases_collectives_gather
import cases_collectives_reduce
import cases_forced
import harness
import refs

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="RINGX_ALGO is ringx's")

SEED = 20251123
# 2**18 + 1 elements: several shared-memory chunks at any slot size this suite sets.
COUNTS = (0, 1, 13, 2**18 + 1)
DTYPES = ("float32", "bfloat16", "int64")
ALGOS = {"tree": "gather:binomial,scatter:binomial,reduce:binomial,barrier:dissemination",
         "shm": "gather:shm,scatter:shm,reduce:shm,barrier:shm",
         # The direct gather and scatter, chosen across hosts (test_testbed.py); reduce
         # and barrier run by the model's choice beside them.
         "direct": "gather:direct,scatter:direct"}
ALGO_LINE = re.compile(r"ringx: (gather|scatter|reduce|barrier) \(rank \d+, seq \d+\): algorithm (\w+),")


def algorithms_used(world, since):
    used = {}
    for r in range(world.size):
        for m in ALGO_LINE.finditer(world.log_text(r, since[r])):
            used.setdefault(m.group(1), set()).add(m.group(2))
    return used


@pytest.mark.parametrize("ws", (2, 3, 4), ids=lambda w: f"ws{w}")
@pytest.mark.parametrize("family", sorted(ALGOS))
def test_forced_rooted_algorithm_matches_reference(forced_worlds, family, ws):
    failures = []
    world = forced_worlds(ws)

    def run(case, **kwargs):
        return world.run(cases_forced.on_forced_group, spec=ALGOS[family], case=harness.case_name(case), **kwargs)

    since = world.log_sizes()
    roots = list(range(ws))
    for dtype in DTYPES:
        gathered = run(cases_collectives_gather.gather_roots, seed=SEED, dtype=dtype, counts=COUNTS,
                       roots=roots)
        scattered = run(cases_collectives_gather.scatter_roots, seed=SEED, dtype=dtype, counts=COUNTS,
                        roots=roots)
        ops = ["SUM", "MAX"] + (["AVG"] if dtype != "int64" else [])
        reduced = run(cases_collectives_reduce.reduce_roots, seed=SEED, dtype=dtype, counts=COUNTS,
                      ops=ops, roots=roots)
        for kind, res in (("gather", gathered), ("scatter", scattered), ("reduce", reduced)):
            failures += refs.errors_of(res, f"{kind} {family} {dtype} world {ws}")
        for root in roots:
            for count in COUNTS:
                gs = refs.seed_for(SEED, "gather", root)
                ss = refs.seed_for(SEED, "scatter", root)
                for r in range(ws):
                    where = f"rank {r}, root {root}, {dtype} count {count} world {ws} ({family})"
                    if (root, count) in gathered[r]:
                        got = gathered[r][(root, count)]
                        msg = (refs.compare(got, refs.concat_inputs(gs, range(ws), dtype, count), None,
                                            f"gather {where}", dtype) if r == root else
                               refs.compare(got[1], refs.make_input(gs, r, dtype, count), None,
                                            f"gather {where}: input modified", dtype))
                        if msg:
                            failures.append(msg)
                    if (root, count) in scattered[r]:
                        got, _ = scattered[r][(root, count)]
                        msg = refs.compare(got, refs.make_input(ss, r, dtype, count), None,
                                           f"scatter {where}", dtype)
                        if msg:
                            failures.append(msg)
                for op in ops:
                    if (root, op, count) not in reduced[root]:
                        continue
                    expected, tol = refs.expected_reduction(refs.seed_for(SEED, "reduce", root), ws, dtype,
                                                            count, op)
                    msg = refs.compare(reduced[root][(root, op, count)], expected, tol,
                                       f"reduce {op} root {root}, {dtype} count {count} world {ws}", dtype)
                    if msg:
                        failures.append(msg)
    late = run(cases_collectives_barrier.barrier_waits_for_late_rank, late_rank=ws - 1, delay_s=0.2,
               repeats=3)
    failures += refs.errors_of(late, f"barrier {family} world {ws}")
    if not failures:
        for i, entered in enumerate(late[ws - 1]["enter"]):
            early = [r for r in range(ws) if late[r]["leave"][i] < entered]
            if early:
                failures.append(f"barrier {family} world {ws}: rank(s) {early} left barrier {i} before rank "
                                f"{ws - 1} entered it")
        failures += [f"rank {r}: async barrier not completed" for r in range(ws) if not late[r]["async"]]
    used = algorithms_used(world, since)
    assert not failures, refs.report(failures)
    want = dict(entry.split(":") for entry in ALGOS[family].split(","))
    named = {coll: used.get(coll) for coll in want}
    assert named == {coll: {algo} for coll, algo in want.items()}, \
        f"RINGX_ALGO={ALGOS[family]} but the logs show {used}"
