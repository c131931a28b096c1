"""DDP parity with gloo: the same model, seed and data trained 30 steps by DDP on the
backend under test and by DDP on a gloo group in the same world (4 ranks), parameters
equal within float tolerance after every step; plain, gradient_as_bucket_view=True,
static_graph=True, find_unused_parameters=True with a never-used layer and a layer
used on even steps only, and an embedding bag with sparse gradients (DDP all-reduces
them as sparse tensors, one call per parameter).  Small buckets, so each step runs
several bucket all-reduces.

Tolerance: both copies average the same float32 gradients, in possibly different
summation orders (ringx's ring or tree vs gloo's), so each step's update may differ by a
few ulps; over 30 momentum-SGD steps that stays far below TOL_REL * (1 + max|p|).
"""

import os

import pytest

import cases_ddp_parity as cases
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611")) % 100000
WS = 4
STEPS = 30
TOL_REL = 2e-6


@pytest.mark.parametrize("variant", list(cases.VARIANTS))
def test_ddp_parity_with_gloo(worlds, variant):
    results = worlds.run(WS, cases.ddp_parity, seed=SEED, variant=variant, steps=STEPS,
                         timeout=120)
    failures = []
    for r, res in enumerate(results):
        for step, (d, mag) in enumerate(zip(res["max_diff"], res["max_abs"])):
            if not d <= TOL_REL * (1 + mag):
                failures.append(f"rank {r}: {variant}: after step {step} parameters differ from "
                                f"the gloo copy by {d:.3g} (max |p| {mag:.3g}, tolerance "
                                f"{TOL_REL * (1 + mag):.3g}); losses so far "
                                f"{res['losses'][:step + 1]}")
                break
    # DDP keeps replicas identical: every rank must hold the same parameters as rank 0
    for r in range(1, WS):
        for i, (p0, pr) in enumerate(zip(results[0]["params"], results[r]["params"])):
            msg = refs.compare(pr, p0, None, f"rank {r}: {variant}: parameter {i} vs rank 0's",
                               "float32")
            if msg:
                failures.append(msg)
                break
    # training moved the parameters at all (a no-op backend would pass the parity check
    # only if gloo were broken too, but make it explicit)
    first, last = results[0]["losses"][0][1], results[0]["losses"][-1][1]
    if not last < first:
        failures.append(f"{variant}: gloo copy's loss did not decrease ({first} -> {last})")
    assert not failures, refs.report(failures)
