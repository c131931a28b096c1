"""torch's distributed libraries (FSDP2, DTensor, tensor parallelism, ZeRO, distributed
checkpointing, functional collectives) give on the backend under test what they give on
gloo, or what the same model computes in one process.

Tolerances: the gloo copies sum the same gradients in possibly another order, so float32
updates may differ by a few ulps per step (as in test_ddp_parity.py); 16-bit copies by a
few of their own ulps, which the optimizer's momentum carries along.
"""

import pytest
import torch

import cases_ecosystem as cases
import refs

SEED = 20261129
STEPS = 8
TOL_REL = {"float32": 2e-6, "no_reshard_after_forward": 2e-6, "bfloat16": 2e-2, "float16_reduce": 2e-3}


def _parity_failures(results, what, tol_rel):
    failures = []
    for r, res in enumerate(results):
        for step, (d, mag) in enumerate(zip(res["max_diff"], res["max_abs"])):
            if not d <= tol_rel * (1 + mag):
                failures.append(f"rank {r}: {what}: after step {step} parameters differ from the gloo copy "
                                f"by {d:.3g} (max |p| {mag:.3g}); losses so far {res['losses'][:step + 1]}")
                break
    first, last = results[0]["losses"][0][1], results[0]["losses"][-1][1]
    if not last < first:
        failures.append(f"{what}: the gloo copy's loss did not decrease ({first} -> {last})")
    return failures


@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize("variant", list(cases.FSDP_VARIANTS))
def test_fsdp2_trains_as_on_gloo(worlds, ws, variant):
    results = worlds.run(ws, cases.fsdp2_parity, seed=SEED, variant=variant, steps=STEPS, timeout=120)
    failures = _parity_failures(results, f"fully_shard {variant}", TOL_REL[variant])
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", [2, 4])
def test_zero_redundancy_optimizer_steps_as_on_gloo(worlds, ws):
    results = worlds.run(ws, cases.zero_parity, seed=SEED, steps=STEPS, timeout=120)
    failures = _parity_failures(results, "ZeroRedundancyOptimizer", 2e-6)
    if results[0]["consolidated states"] != results[0]["parameters"]:
        failures.append(f"rank 0 consolidated {results[0]['consolidated states']} parameter states, "
                        f"expected {results[0]['parameters']}")
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", [2, 4])
def test_dtensor_redistributions_keep_the_tensor(worlds, ws):
    results = worlds.run(ws, cases.dtensor_redistribute, seed=SEED, timeout=120)
    failures = [f"rank {r}: {label}: off by {d:.3g}"
                for r, res in enumerate(results) for label, d in res.items() if not d <= 1e-5]
    assert len(results[0]) == (13 if ws == 2 else 16)
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", [2, 4])
def test_tensor_parallel_matches_the_unsharded_model(worlds, ws):
    results = worlds.run(ws, cases.tensor_parallel, seed=SEED, timeout=120)
    failures = []
    for r, res in enumerate(results):
        tol = 1e-5 * (1 + res["max |output|"])
        for label in ("output", "input grad"):
            if not res[label] <= tol:
                failures.append(f"rank {r}: {label} off by {res[label]:.3g}")
        failures += [f"rank {r}: gradient of {name} off by {d:.3g}"
                     for name, d in res["weight grads"].items() if not d <= tol]
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws", [2, 4])
def test_checkpoint_of_a_sharded_model_loads_back(worlds, ws, tmp_path):
    results = worlds.run(ws, cases.checkpoint_roundtrip, seed=SEED, path=str(tmp_path / "ckpt"), timeout=120)
    for r, res in enumerate(results):
        assert res["params"] == 0.0, f"rank {r}: loaded parameters differ from the saved ones by {res['params']}"
        assert res["replicated"] == [0.0, 1.0, 2.0, 3.0, 4.0], f"rank {r}: {res['replicated']}"


@pytest.mark.parametrize("ws", [2, 3])
def test_functional_collectives_return_the_reduced_values(worlds, ws):
    results = worlds.run(ws, cases.functional_collectives, timeout=60)
    xs = [torch.arange(4, dtype=torch.float32) + 10 * r for r in range(ws)]
    stacked = torch.stack(xs)
    a2a_in = [torch.arange(2 * ws, dtype=torch.float32) + 100 * r for r in range(ws)]
    for r, res in enumerate(results):
        expected = {
            "sum": stacked.sum(0), "avg": stacked.mean(0), "max": stacked.max(0).values,
            "min": stacked.min(0).values, "product": stacked.prod(0),
            "all_gather_tensor": torch.cat(xs),
            "reduce_scatter_tensor": stacked.sum(0),
            "all_to_all_single": torch.cat([a2a_in[s][2 * r:2 * r + 2] for s in range(ws)]),
            "broadcast": xs[0],
        }
        for key, want in expected.items():
            assert torch.allclose(torch.tensor(res[key]), want), f"rank {r}: {key}: {res[key]} != {want.tolist()}"
        assert res["all_reduce_coalesced"] == [stacked.sum(0).tolist(), (2 * stacked).sum(0).tolist()]
        assert res["all_gather_into_tensor_coalesced"] == [torch.cat(xs).tolist(), torch.cat(xs).mul(2).tolist()]
        assert res["reduce_scatter_tensor_coalesced"] == [stacked.sum(0).tolist(), (2 * stacked).sum(0).tolist()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_functional_collectives_match_eager(worlds, backend):
    results = worlds.run(2, cases.compiled_functional_collectives, backend=backend, timeout=300)
    xs = [torch.arange(6, dtype=torch.float32) + 10 * r for r in range(2)]
    # all_gather of the summed 2x + 1; each rank's chunk of the summed repeat is 2z
    want = torch.cat([2 * (xs[0] + xs[1]) + 1] * 2)
    for r, (compiled, eager) in enumerate(results):
        assert eager == want.tolist(), f"rank {r}: eager {eager} != {want.tolist()}"
        assert compiled == eager, f"rank {r}: compiled {compiled} != eager {eager}"
