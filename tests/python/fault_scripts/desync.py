"""Desynchronised ranks: an extra collective, a different collective, a different shape
or dtype.  Run it with or without TORCH_DISTRIBUTED_DEBUG=DETAIL (the launcher sets it).

    desync.py SCENARIO TIMEOUT_S

extra      rank 0 issues one all_reduce more than the others ("extra" on rank 0); the
           others do nothing more.
different  rank 0 all_reduces, every other rank broadcasts a tensor of the same size
           and dtype ("different" on every rank).
shape      rank 0 all_reduces 8 elements, the others 9 ("shape").
dtype      rank 0 all_reduces float32, the others float64 ("dtype").

Every rank then calls destroy_process_group (recorded as "destroyed").  Whatever each
rank's call raised (or returned) is recorded; the test decides what is acceptable.
"""

import sys
import time

import faultlib as common

SCENARIO, TIMEOUT_S = sys.argv[1], float(sys.argv[2])


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    r = dist.get_rank()
    x = torch.ones(4)
    dist.all_reduce(x)
    common.record("warm")

    if SCENARIO == "extra":
        if r == 0:
            common.attempt("extra", lambda: dist.all_reduce(torch.ones(4)))
        else:
            time.sleep(TIMEOUT_S * 1.5)
    elif SCENARIO == "different":
        t = torch.full((16,), float(r + 1))
        if r == 0:
            common.attempt("different", lambda: dist.all_reduce(t))
        else:
            common.attempt("different", lambda: dist.broadcast(t, src=0))
        common.record("values", head=t[:4].tolist())
    elif SCENARIO == "shape":
        t = torch.ones(8 if r == 0 else 9)
        common.attempt("shape", lambda: dist.all_reduce(t))
    elif SCENARIO == "dtype":
        t = torch.ones(8, dtype=torch.float32 if r == 0 else torch.float64)
        common.attempt("dtype", lambda: dist.all_reduce(t))
    else:
        raise SystemExit(f"unknown scenario {SCENARIO}")
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
