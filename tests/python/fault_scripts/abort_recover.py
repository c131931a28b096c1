"""abort() and shutdown() with work pending, then a new process group in the same process.

    abort_recover.py HOW TIMEOUT_S

HOW    abort: rank 0 issues an all_reduce that rank 1 never joins, then (0.5 s later)
             torch.distributed.distributed_c10d._abort_process_group(); the pending
             work must fail with an "abort" error at once ("pending"), and a later
             call on the aborted group must fail too ("after_abort").
       destroy: the same, but rank 0 calls destroy_process_group() (which shuts the
             backend down) with the work pending ("destroy" records how long it took;
             "pending" what the work's wait() raised).
       subgroup: rank 0 and rank 1 build new_group([0, 1]); rank 0 issues an
             all_reduce on it that rank 1 never joins and aborts only that subgroup;
             the world group must still work ("world_after").
Then (abort, destroy) every rank builds a new default group on a fresh store and
all_reduces on it ("recovered"); for subgroup, the world all_reduce is the check.
"""

import os
import sys
import threading
import time

import faultlib as common

HOW, TIMEOUT_S = sys.argv[1], float(sys.argv[2])


def body():
    import datetime

    import torch
    from torch.distributed import distributed_c10d as c10d

    dist = common.setup(TIMEOUT_S)
    r, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(torch.ones(3))
    common.record("warm")

    if HOW == "subgroup":
        sub = dist.new_group(ranks=[0, 1])
        dist.barrier()  # both members connected before rank 0 can abort the subgroup
        if r == 0:
            work = dist.all_reduce(torch.ones(5), group=sub, async_op=True)
            time.sleep(0.5)
            t0 = time.time()
            c10d._abort_process_group(sub)
            common.record("aborted", seconds=time.time() - t0)
            common.attempt("pending", work.wait)
        y = torch.ones(4)

        def world_after():
            dist.all_reduce(y)
            assert torch.equal(y, torch.full((4,), float(n))), y

        common.attempt("world_after", world_after)
        common.finish(dist)
        return

    if r == 0:
        x = torch.ones(5)
        work = dist.all_reduce(x, async_op=True)
        time.sleep(0.5)
        t0 = time.time()
        if HOW == "abort":
            c10d._abort_process_group()
            common.record("aborted", seconds=time.time() - t0)
            common.attempt("pending", work.wait)
            common.attempt("after_abort", lambda: work.wait())  # still the same error
        elif HOW == "destroy":
            waiter = {}

            def wait_in_thread():
                waiter["e"] = common.attempt("pending", work.wait)

            th = threading.Thread(target=wait_in_thread)
            th.start()
            common.attempt("destroy", dist.destroy_process_group)
            th.join(TIMEOUT_S * 3)
            common.record("waiter_joined", alive=th.is_alive())
        else:
            raise SystemExit(f"unknown how {HOW}")
    else:
        # Never joins the pending all_reduce; leaves the group the same way.
        time.sleep(1.0)
        if HOW == "abort":
            c10d._abort_process_group()
        else:
            common.attempt("destroy", dist.destroy_process_group)

    # A new default group on a fresh store (new port from the environment's, agreed via
    # a file the launcher's output dir gives every rank).
    port_file = os.path.join(os.environ["FAULT_OUT"], "port2")
    if r == 0:
        port = common.free_port()
        with open(port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.rename(port_file + ".tmp", port_file)
    else:
        deadline = time.time() + 30
        while not os.path.exists(port_file) and time.time() < deadline:
            time.sleep(0.05)
    with open(port_file) as f:
        os.environ["MASTER_PORT"] = f.read().strip()

    def recovered():
        dist.init_process_group("ringx", timeout=datetime.timedelta(seconds=TIMEOUT_S))
        z = torch.full((6,), float(r))
        dist.all_reduce(z)
        assert torch.equal(z, torch.full((6,), float(n * (n - 1) // 2))), z

    common.attempt("recovered", recovered)
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
