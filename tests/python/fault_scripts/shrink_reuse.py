"""A shrunk ringx group is its parent's connections and shared memory re-indexed.

    shrink_reuse.py TIMEOUT_S        (world 4)

  no_connection   ranks 0-2 shrink a group of all 4, excluding 3: no survivor but the
                  first opens a socket during shrink_group (no store is asked, and
                  the store for the new group's subgroups connects on first use)
  parent_gone     the parent, destroyed and collected, leaves the shrunk group
                  working: all_reduce small (over UCX) and large (shared-memory slots
                  in chunks, single copy), broadcast, all_gather
  excluded_alive  rank 3, excluded but alive, destroys the parent without waiting
  second          the shrunk group shrinks again (2 excluded): 3 -> 2 over the same
                  connections, then its subgroups' store serves a new_group
  store_gone      rank 0 hosts the default group's store and dies (SIGKILL); ranks
                  1-3 shrink the default group and all_reduce on it
"""

import gc
import os
import signal
import sys
import time

import faultlib as common

TIMEOUT_S = float(sys.argv[1])


def sockets() -> int:
    fds = "/proc/self/fd"
    n = 0
    for fd in os.listdir(fds):
        try:
            n += os.readlink(os.path.join(fds, fd)).startswith("socket:")
        except OSError:
            pass
    return n


def body():
    import datetime

    import torch

    dist = common.setup(TIMEOUT_S)
    r = dist.get_rank()
    timeout = datetime.timedelta(seconds=TIMEOUT_S)

    def check_collectives(group, size, ranks):
        for n in (4, 1 << 20):  # a few bytes, and 4 MiB through the slots in chunks
            t = torch.full((n,), float(group.rank() + 1))
            dist.all_reduce(t, group=group)
            assert torch.equal(t, torch.full((n,), float(size * (size + 1) / 2))), t[:4]
        b = torch.full((1 << 18,), float(group.rank()))
        dist.broadcast(b, group_src=size - 1, group=group)
        assert torch.equal(b, torch.full((1 << 18,), float(size - 1))), b[:4]
        out = [torch.empty(3) for _ in range(size)]
        dist.all_gather(out, torch.full((3,), float(ranks[group.rank()])), group=group)
        assert [o[0].item() for o in out] == [float(x) for x in ranks], out

    g = dist.new_group([0, 1, 2, 3], timeout=timeout)
    check_collectives(g, 4, [0, 1, 2, 3])
    common.file_barrier("warm", range(4), timeout=60)
    if r < 3:
        shrunk = {}

        def no_connection():
            before = sockets()
            shrunk["g"] = dist.shrink_group([3], group=g)
            common.record("sockets", opened=sockets() - before)

        common.attempt("no_connection", no_connection)

        def parent_gone():
            nonlocal g
            g = None
            gc.collect()
            for _ in range(3):
                check_collectives(shrunk["g"], 3, [0, 1, 2])

        common.attempt("parent_gone", parent_gone)
    else:

        def excluded_alive():
            t0 = time.perf_counter()
            dist.destroy_process_group(g)
            common.record("excluded_destroy", seconds=time.perf_counter() - t0)

        common.attempt("excluded_alive", excluded_alive)
    common.file_barrier("first", range(4), timeout=60)
    if r < 2:

        def second():
            s2 = dist.shrink_group([2], group=shrunk["g"])
            check_collectives(s2, 2, [0, 1])
            sub = dist.new_group([0, 1], timeout=timeout)
            check_collectives(sub, 2, [0, 1])

        common.attempt("second", second)
    common.file_barrier("second", range(4), timeout=60)

    if r == 0:
        common.record("dying")
        os.kill(os.getpid(), signal.SIGKILL)

    def store_gone():
        # Rank 0 may be gone before or during the shrink; the survivors never wait
        # on its store.
        time.sleep(0.2)
        dist.shrink_group([0])
        check_collectives(dist.group.WORLD, 3, [1, 2, 3])

    common.attempt("store_gone", store_gone)
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
