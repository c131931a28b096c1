"""barrier and monitored_barrier case bodies."""

import datetime
import time

import torch
import torch.distributed as dist

import refs


def barrier_waits_for_late_rank(late_rank, delay_s, repeats, group=None):
    """`late_rank` sleeps delay_s before each barrier.  Every rank records, on the
    system-wide monotonic clock, when it entered and left each barrier; no rank may leave
    a barrier before the late rank entered it.  Also runs an async barrier.
    {"enter": [t], "leave": [t], "async": bool}."""
    rank = dist.get_rank()

    def run(_):
        enter, leave = [], []
        for _ in range(repeats):
            if rank == late_rank:
                time.sleep(delay_s)
            enter.append(time.monotonic())
            dist.barrier(group=group)
            leave.append(time.monotonic())
        w = dist.barrier(async_op=True, group=group)
        ok = w.wait()
        return {"enter": enter, "leave": leave, "async": ok is not False and w.is_completed()}

    res = refs.run_until_error(["barrier"], run)
    return res.get("barrier", res)


def many_barriers(n):
    """n barriers back to back, then an all_reduce that must still line up."""
    def run(_):
        for _ in range(n):
            dist.barrier()
        t = torch.tensor([dist.get_rank() + 1], dtype=torch.int64)
        dist.all_reduce(t)
        return int(t.item())

    res = refs.run_until_error(["barriers"], run)
    return res.get("barriers", res)


def _monitored_barrier(group, timeout_s, wait_all_ranks, via):
    timeout = datetime.timedelta(seconds=timeout_s)
    if via == "public":
        return dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
    # ProcessGroup.monitored_barrier: what dist.monitored_barrier calls after its checks
    pg = group if group is not None else dist.group.WORLD
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def monitored_barrier_all_arrive(timeout_s, via, repeats=3, wait_all_ranks=False):
    """Every rank calls monitored_barrier `repeats` times; ("ok", seconds) or the error."""
    def run(_):
        t0 = time.monotonic()
        for _ in range(repeats):
            _monitored_barrier(None, timeout_s, wait_all_ranks, via)
        return time.monotonic() - t0

    res = refs.run_until_error(["monitored_barrier"], run)
    return res.get("monitored_barrier", res)


def monitored_barrier_missing(missing, timeout_s, wait_all_ranks, via):
    """Ranks in `missing` skip a monitored_barrier that the others call, on a fresh
    subgroup of every rank (so the default group stays clean).  Then the subgroup is
    destroyed and the default group must still work.

    Returns {"outcome": "skipped" | "returned" | ("raised", type, message),
             "seconds": time in the call, "sanity": all_reduce SUM of 1s afterwards}.
    """
    rank, ws = dist.get_rank(), dist.get_world_size()

    def stage(what):  # shows in the harness's report if this rank dies or hangs
        print(f"[monitored_barrier_missing] rank {rank}: {what}", flush=True)

    group = dist.new_group(list(range(ws)))
    out = {}
    t0 = time.monotonic()
    if rank in missing:
        out["outcome"] = "skipped"
    else:
        stage("calling monitored_barrier")
        try:
            _monitored_barrier(group, timeout_s, wait_all_ranks, via)
            out["outcome"] = "returned"
        except Exception as e:  # noqa: BLE001 - inspected by the parent
            out["outcome"] = ("raised", type(e).__name__, str(e))
    out["seconds"] = time.monotonic() - t0
    stage(f"monitored_barrier: {str(out['outcome'])[:80]}; destroying the subgroup")
    try:
        dist.destroy_process_group(group)
    except Exception as e:  # noqa: BLE001
        out["destroy"] = f"{type(e).__name__}: {e}"
    stage("subgroup destroyed; all_reduce on the default group")
    t = torch.ones(1)
    dist.all_reduce(t)
    stage("done")
    out["sanity"] = float(t.item())
    return out
