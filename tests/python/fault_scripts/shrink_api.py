"""dist.shrink_group on ringx with every rank alive: torch's shrink tests, ringx's way.

    shrink_api.py TIMEOUT_S        (world 4)

Each step is recorded by label (faultlib.attempt); later steps run whatever earlier
ones did.  Ranks outside a shrink never call it; they destroy what they hold at the
end, which must not wait on the survivors.

  validation      torch's checks and ringx's own (a direct Backend.shrink call)
  disagree        on a group of all 4, ranks 0 and 1 exclude [3], rank 2 excludes
                  [1, 3]: every caller fails naming both lists, at once
  retry           the same group, all excluding [3]: the second attempt works
  properties      what users see of the shrunk group, a split of it, its store
  in_flight       an all_reduce pending on a group, SHRINK_DEFAULT: refused
  abort           then SHRINK_ABORT: shrinks, and the pending op fails saying so
  multi           two groups shrunk apart (one by ranks 1-3 excluding 0, one by ranks
                  0 and 3 excluding [1, 2])
  after_abort     a group aborted before: refused, saying why
  default_1/2     the default group 4 -> 3 -> 2, with new_group on the shrunk world
"""

import os
import sys
import time

import faultlib as common

TIMEOUT_S = float(sys.argv[1])


def body():
    import datetime

    import torch

    dist = common.setup(TIMEOUT_S)
    import ringx

    r = dist.get_rank()
    timeout = datetime.timedelta(seconds=TIMEOUT_S)

    def check_all_reduce(group, size):
        t = torch.ones(4)
        dist.all_reduce(t, group=group)
        assert torch.equal(t, torch.full((4,), float(size))), t

    def expect(label, fn, exc):
        def run():
            try:
                fn()
            except exc as e:
                common.record("raised", label=label, type=type(e).__name__, msg=str(e))
                return
            raise AssertionError(f"{label}: nothing raised")

        common.attempt(label, run)

    # validation
    if r == 3:
        expect("self_excluded", lambda: dist.shrink_group([3]), RuntimeError)
    expect("empty", lambda: dist.shrink_group([]), ValueError)
    expect("out_of_range", lambda: dist.shrink_group([4]), ValueError)
    expect("bad_flags", lambda: dist.shrink_group([3], shrink_flags=7), ValueError)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    common.record("supports", value=bool(backend.supports_shrinking))
    expect("direct_out_of_range", lambda: backend.shrink([9], 0, None), ValueError)
    common.attempt("world_still_works", lambda: check_all_reduce(None, 4))

    # disagree, then retry
    g1 = dist.new_group([0, 1, 2, 3], timeout=timeout)
    if r < 3:
        mine = [1, 3] if r == 2 else [3]
        expect("disagree", lambda: dist.shrink_group(mine, group=g1), ValueError)
        s1 = {}

        def retry():
            s1["g"] = dist.shrink_group([3], group=g1)
            check_all_reduce(s1["g"], 3)

        common.attempt("retry", retry)

        def properties():
            g = s1["g"]
            seen = {
                "get_backend": str(dist.get_backend(g)),
                "backend_is_ringx": isinstance(g._get_backend(torch.device("cpu")), ringx._C.ProcessGroupRingx),
                "rank": g.rank(),
                "size": g.size(),
                "ranks": dist.get_process_group_ranks(g),
                "desc": g.group_desc,
                "name": g._get_backend_name(),
            }
            common.record("properties", parent_name=dist.group.WORLD._get_backend_name(), **seen)
            # dist.split_group wants a default group bound to a device: the C++ split.
            sub = g.split_group([0, 1] if r < 2 else [2], timeout=timeout)
            if r < 2:
                t = torch.ones(4)
                sub.allreduce([t]).wait()
                assert torch.equal(t, torch.full((4,), 2.0)), t
                common.record("split", size=sub.size(), name=sub._get_backend_name())

        common.attempt("properties", properties)

    # in_flight, then abort
    g2 = dist.new_group([0, 1, 2, 3], timeout=timeout)
    if r < 3:
        pending = dist.all_reduce(torch.ones(4), group=g2, async_op=True)  # rank 3 never joins
        expect("in_flight", lambda: dist.shrink_group([3], group=g2), dist.DistBackendError)

        def abort():
            s2 = dist.shrink_group([3], group=g2, shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
            check_all_reduce(s2, 3)

        common.attempt("abort", abort)
        expect("pending_after_abort", lambda: pending.wait(), dist.DistBackendError)

    # multi
    g3 = dist.new_group([0, 1, 2, 3], timeout=timeout)
    g4 = dist.new_group([0, 1, 2, 3], timeout=timeout)
    if r != 0:
        common.attempt("multi_a", lambda: check_all_reduce(dist.shrink_group([0], group=g3), 3))
    if r in (0, 3):
        common.attempt("multi_b", lambda: check_all_reduce(dist.shrink_group([1, 2], group=g4), 2))

    # after_abort: a group aborted first has no connections left to shrink with.
    g5 = dist.new_group([0, 1, 2, 3], timeout=timeout)
    g5._get_backend(torch.device("cpu")).abort()
    if r < 3:
        expect("after_abort", lambda: dist.shrink_group([3], group=g5), dist.DistBackendError)

    # The default group, twice.  Rank 3, then world rank 2 of the shrunk world
    # (global rank 2), leave: each destroys what it holds at once.
    common.file_barrier("before_default", range(4), timeout=60)
    if r == 3:
        common.finish(dist)
        return

    def default_1():
        t0 = time.perf_counter()
        dist.shrink_group([3])
        check_all_reduce(None, 3)
        common.record("latency", label="default_1", seconds=time.perf_counter() - t0)
        assert dist.get_world_size() == 3 and dist.get_rank() == r
        assert str(dist.get_backend()) == "ringx"
        sub = dist.new_group([0, 1])
        if r < 2:
            check_all_reduce(sub, 2)

    common.attempt("default_1", default_1)
    if r == 2:
        common.finish(dist)
        return

    def default_2():
        dist.shrink_group([2])
        check_all_reduce(None, 2)
        assert dist.get_world_size() == 2

    common.attempt("default_2", default_2)
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
