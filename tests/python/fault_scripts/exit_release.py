"""A rank exits while its last async op is still completing, and the interpreter is
already past ringx's atexit hook when the op's tensors come to be released.

    exit_release.py TIMEOUT_S

Rank 1 registers, before importing torch or ringx (so that they run after ringx's own
hook), two atexit hooks: one marks that the hold begins, the other holds the GIL for
1.5 s in C (ctypes.PyDLL keeps it) and returns straight into finalization. Rank 1 posts an async
all_reduce and exits without waiting on it. Rank 0 calls its all_reduce only once rank
1's hook holds the GIL, so rank 1's op ends on its progress thread, which then drops the
op's last references to the tensor: with the GIL held by the exiting main thread, and
the interpreter finalizing by the time the main thread lets go of it. Both ranks must
exit 0, and rank 0 must get the sum.
"""

import atexit
import ctypes
import os
import sys

import faultlib as common

TIMEOUT_S = float(sys.argv[1])


if common.rank() == 1:
    # Registered first, so they run last: the mark, then the hold. The hold is the C
    # function itself: a Python function would drop the GIL when the call returns.
    atexit.register(ctypes.PyDLL(None).usleep, 1_500_000)
    atexit.register(common.file_barrier, "holding", [1], 1)


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    if common.rank() == 1:
        dist.all_reduce(torch.ones(2), async_op=True)
        common.record("done")
        return
    common.file_barrier("holding", [1], timeout=60)
    t = torch.ones(2)
    dist.all_reduce(t)
    common.record("done", value=t.tolist())


if __name__ == "__main__":
    common.main(body)
