"""A small broadcast's root runs ahead of a stopped receiver (MPI's eager protocol).

    runahead.py SCENARIO CALLS TIMEOUT_S

Rank 0 broadcasts; once every rank is past a warm-up all_reduce, rank 0 stops rank 1
with SIGSTOP and makes CALLS broadcasts of 16 floats, each call's data its own.

ahead  rank 0 must return from all CALLS while rank 1 is stopped ("ahead", with how
       long they took), then continues it with SIGCONT; every rank checks each call's
       data ("data") and an all_reduce after them ("after").
stuck  CALLS is more than the root's slots hold: the call that finds them all taken
       must fail after TIMEOUT_S naming rank 1 ("stuck", with how many calls returned
       before); rank 0 then kills rank 1, which never came back.
"""

import os
import signal
import sys
import time

import faultlib as common

SCENARIO, CALLS, TIMEOUT_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
COUNT = 16


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    r = dist.get_rank()
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    x = torch.ones(4)
    dist.all_reduce(x)
    dist.barrier()
    common.record("warm")

    def payload(call):
        return torch.arange(COUNT, dtype=torch.float32) + 1000 * call

    if r == 0:
        os.kill(pids[1], signal.SIGSTOP)
        done = 0
        start = time.time()

        def calls():
            nonlocal done
            for call in range(CALLS):
                dist.broadcast(payload(call), src=0)
                done += 1

        if SCENARIO == "ahead":
            common.attempt("ahead", calls)
            common.record("returned", calls=done, seconds=time.time() - start)
            os.kill(pids[1], signal.SIGCONT)
        else:
            common.attempt("stuck", calls)
            common.record("returned", calls=done, seconds=time.time() - start)
            os.kill(pids[1], signal.SIGKILL)
            common.finish(dist, destroy=False)
            return
    else:
        wrong = []
        for call in range(CALLS):
            t = torch.full((COUNT,), -1.0)
            dist.broadcast(t, src=0)
            if not torch.equal(t, payload(call)):
                wrong.append(call)
        common.record("data", wrong=wrong)
    y = torch.ones(4)
    common.attempt("after", lambda: dist.all_reduce(y))
    common.record("after_value", value=y[0].item())
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
