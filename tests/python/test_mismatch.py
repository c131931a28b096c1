"""Mismatched calls, PREMUL_SUM with per-rank factors, aliased all_to_all_single,
collectives from several threads and a root-only argument error, on the shared-memory
algorithms (the default on one host) and on the network ones (RINGX_SHM=0).

The rule checked everywhere: a call that returns without an error returned the right
data; ranks that called different things fail, with an error that names both calls.
"""

import pytest
import torch

import cases_mismatch
import harness

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="ringx's error contract and knobs")

PATHS = {"shm": {}, "net": {"RINGX_SHM": "0"}}


@pytest.fixture(scope="module", params=list(PATHS), ids=list(PATHS))
def path_worlds(request):
    """{world size: World} with the path's environment, started on first use."""
    worlds = {}

    def get(size):
        if size not in worlds:
            worlds[size] = harness.World(size, env=PATHS[request.param])
        return worlds[size]

    yield request.param, get
    for w in worlds.values():
        w.close()


def test_allreduce_against_allgather_fails_on_both_ranks(path_worlds):
    _, get = path_worlds
    res = get(2).run(cases_mismatch.allreduce_vs_allgather)
    for r, out in enumerate(res):
        assert out[0] == "error", f"rank {r} returned {out[1]} instead of failing"
        assert "all_reduce" in out[2] and "all_gather" in out[2] and f"(rank {r}," in out[2], out[2]


@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("dense,count", [("all_reduce", 16), ("all_reduce", 1 << 20), ("all_gather", 1 << 18)])
def test_sparse_against_dense_call_fails_on_every_rank(path_worlds, ws, dense, count):
    """Each rank names the sparse call at once: on the network by the identity messages,
    on one host by the identity the sparse call leaves where a shared-memory or
    single-copy collective reads its peers' headers."""
    _, get = path_worlds
    timeout_s = 4.0
    res = get(ws).run(cases_mismatch.sparse_vs_dense, timeout_s=timeout_s, dense=dense, count=count)
    for r, (out, took) in enumerate(res):
        assert out[0] == "error", f"rank {r} returned {out[1]} instead of failing"
        assert f"(rank {r}," in out[2], out[2]
        assert "sparse" in out[2] and took < timeout_s / 2, (took, out[2])
        assert ("layout" if dense == "all_reduce" else "all_gather") in out[2], out[2]


@pytest.mark.parametrize("tensor_factor", [False, True], ids=["scalar", "tensor"])
@pytest.mark.parametrize("ws,count", [(2, 4), (3, 7), (2, 300000)])
def test_premul_sum_scales_each_rank_by_its_own_factor(path_worlds, ws, count, tensor_factor):
    _, get = path_worlds
    res = get(ws).run(cases_mismatch.premul_sum, count=count, tensor_factor=tensor_factor)

    def inp(q, k):
        return (torch.arange(k) % 13).to(torch.float32) + 10 * q

    full = sum((q + 1) * inp(q, count) for q in range(ws))
    full_n = sum((q + 1) * inp(q, ws * count) for q in range(ws))
    for r in range(ws):
        want = {"all_reduce": full, "reduce_scatter_tensor": full_n[r * count:(r + 1) * count],
                "reduce_scatter": full_n[r * count:(r + 1) * count], f"reduce_root{r}": full}
        for name, w in want.items():
            assert torch.allclose(res[r][name], w), f"rank {r} {name}: {res[r][name][:4]} want {w[:4]}"


def _check_alltoall_aliased(world_for):
    for ws, block in [(2, 5), (3, 100000)]:
        with world_for(ws) as world:
            res = world.run(cases_mismatch.alltoall_aliased, block=block)
        for r in range(ws):
            want = torch.cat([s * 1000 + r * 100 + (torch.arange(block) % 100).float() for s in range(ws)])
            for form in ("even", "splits"):
                assert torch.equal(res[r][form], want), f"ws {ws} rank {r} {form}: {res[r][form][:4]}"


def test_alltoall_single_with_aliased_input_and_output(path_worlds):
    """The algorithm each path picks (single copy on shared memory, pairwise on the network)."""
    _, get = path_worlds
    _check_alltoall_aliased(lambda ws: _borrowed(get(ws)))


@pytest.mark.parametrize("algo", ["pairwise", "shm"])
def test_alltoall_single_with_aliased_input_and_output_forced(algo):
    _check_alltoall_aliased(lambda ws: harness.World(ws, env={"RINGX_ALGO": f"all_to_all:{algo}"}))


class _borrowed:
    def __init__(self, world):
        self.world = world

    def __enter__(self):
        return self.world

    def __exit__(self, *exc):
        return False


def test_collectives_from_several_threads_all_get_their_own_results(path_worlds):
    _, get = path_worlds
    res = get(2).run(cases_mismatch.threaded_collectives, threads=4, iters=40, counts=[1, 1000, 300000])
    assert res == [[], []], res


def test_root_only_argument_error_fails_every_rank_now_or_at_the_next_call(path_worlds):
    _, get = path_worlds
    res = get(3).run(cases_mismatch.root_only_rejection, timeout_s=10.0)
    assert res[0]["scatter"][0] == "error" and "tensor 2" in res[0]["scatter"][2], res[0]
    for r in (1, 2):
        out = res[r]["scatter"]
        assert out[0] == "error" and "rank 0 rejected" in out[2], (r, out)
    for r in range(3):
        out = res[r]["after"]
        assert out[0] == "error", f"rank {r}: the all_reduce after the rejected scatter returned {out}"


def _reference(spec, r, n):
    kind, count, dtype, op, root = spec
    dt = getattr(torch, dtype)

    def base(k, q):
        return ((torch.arange(k) % 11) + 3 * (q + 1)).to(dt)

    def red(ts):
        acc = ts[0].clone()
        for t in ts[1:]:
            acc = acc + t if op == "SUM" else torch.maximum(acc, t)
        return acc

    if kind == "all_reduce":
        return red([base(count, q) for q in range(n)])
    if kind == "broadcast":
        return base(count, root)
    if kind == "all_gather":
        return torch.cat([base(count, q) for q in range(n)])
    if kind == "reduce_scatter":
        return red([base(n * count, q) for q in range(n)])[r * count:(r + 1) * count]
    if kind == "reduce":
        return red([base(count, q) for q in range(n)]) if r == root else base(count, r)
    if kind == "all_to_all":
        return torch.cat([base(n * count, q)[r * count:(r + 1) * count] for q in range(n)])
    return torch.zeros(0)


def test_random_mismatched_calls_never_return_wrong_data(path_worlds):
    path, get = path_worlds
    ws, trials = 2, 80
    log = get(ws).run(cases_mismatch.random_mismatches, seed=7 if path == "shm" else 8, trials=trials,
                      timeout_s=1.0, timeout=trials * 6 + 60)
    counts = {"all correct": 0, "failed (group rebuilt)": 0, "silently wrong": 0}
    wrong = []
    for t in range(trials):
        outs = [log[r][t] for r in range(ws)]
        specs = outs[0][0]
        results = [o[1] for o in outs]
        for r, res in enumerate(results):
            if res[0] == "ok" and not torch.equal(res[1], _reference(specs[r], r, ws)):
                wrong.append(f"trial {t} rank {r} calls {specs}: {res[1][:4]}")
        if wrong and wrong[-1].startswith(f"trial {t} "):
            counts["silently wrong"] += 1
        elif any(res[0] == "error" for res in results):
            counts["failed (group rebuilt)"] += 1
        else:
            counts["all correct"] += 1
    print(f"{path}: {trials} trials: {counts}")
    assert not wrong, "\n".join(wrong)
