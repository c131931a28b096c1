"""Results land in the caller's tensors whatever the caller's autograd state (issue 10,
item 7): ringx copies results into non-contiguous outputs on its progress thread, whose
grad mode and inference mode are its own, not the caller's."""

import pytest

import cases_thread_state
import harness

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="ringx's progress thread")

WS = 2


def test_results_reach_tensors_made_under_inference_mode_and_tensors_that_require_grad():
    with harness.World(WS) as world:
        results = world.run(cases_thread_state.results_under_inference_mode_and_requires_grad)
    total = WS * (WS + 1) / 2
    for r, res in enumerate(results):
        want_rows = [[total if c % 2 == 0 else float(r + 1) for c in range(6)] for _ in range(4)]
        assert res["inference_all_reduce"] == want_rows, f"rank {r}: {res['inference_all_reduce']}"
        assert res["requires_grad_all_reduce"] == want_rows, f"rank {r}: {res['requires_grad_all_reduce']}"
        assert res["requires_grad_still"] is True
        assert res["non_leaf_all_reduce"] == [[total] * 4] * 3, f"rank {r}: {res['non_leaf_all_reduce']}"
        want_gather = [[[float(q + 1)] * 3] * 2 for q in range(WS)]
        assert res["inference_all_gather"] == want_gather, f"rank {r}: {res['inference_all_gather']}"
        assert res["inference_broadcast"] == [float(i) for i in range(6)], f"rank {r}: {res['inference_broadcast']}"
        assert res["grad_mode_after"] is True and res["inference_mode_after"] is False
