"""A call rejected by argument checks on one rank must not put that rank out of step.

    rejected_call.py TIMEOUT_S

Rank 0 first calls all_reduce with an unsupported reduce op for its dtype (BAND on
float32; rejected before anything is sent, "rejected"), then every rank issues the
same valid all_reduce ("after"), which must succeed with the right values: the
rejected call must not have consumed a sequence number on rank 0 only.  The other
ranks never make the bad call, as happens when only one rank's input is wrong.
"""

import sys

import faultlib as common

TIMEOUT_S = float(sys.argv[1])


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    r, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(3))
    common.record("warm")
    if r == 0:
        common.attempt("rejected", lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND))
    y = torch.full((5,), float(r + 1))

    def after():
        dist.all_reduce(y)
        assert torch.equal(y, torch.full((5,), float(n * (n + 1) // 2))), y

    common.attempt("after", after)
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
