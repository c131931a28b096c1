"""Completion callbacks (issue 10, item 8), one scenario after another in one launch.

    callbacks.py TIMEOUT_S

A callback attached to a future that is already complete runs at once on the attaching
thread, so in the scenarios that look at callback threads rank 1 issues its part only
after rank 0 has attached every callback (common.file_barrier), and only rank 0's
callbacks are checked.

"blocking": 16 async all_reduces whose future callbacks record their thread and order;
the first callback blocks until the last one has run (a PowerSGD-style hook waiting on
a later future). Records the callbacks' order, their distinct threads, and the peak
number of threads in the process while they ran.

"destroy": 8 async all_reduces on a new group whose callbacks sleep 20 ms each and
record when they ran; destroy_process_group(group) right after; records the times of
the callbacks and when destroy returned.

"drop_in_callback": the last reference to a new group is dropped inside a callback of
that group's own collective (destroy_process_group first, then the closure's reference).

"fork": a forked child calls all_reduce on the parent's default group and waits on a
Work the parent created; records what each raised (or "hung" from the parent, after
5 s).

"teardown": an async all_reduce whose callback sleeps then touches Python, left pending
when the interpreter exits normally (no destroy; rank 1 joins it late): the rank must
exit 0. The callback runs before teardown or not at all.
"""

import os
import signal
import sys
import threading
import time

import faultlib as common

TIMEOUT_S = float(sys.argv[1])


def threads_now():
    return len(os.listdir("/proc/self/task"))


def rank0_first(name):
    """Rank 1 goes on only once rank 0 has passed this point."""
    if common.rank() == 0:
        common.file_barrier(name, [0], timeout=1)
    else:
        common.file_barrier(name, [0, 1], timeout=60)


def rank1_arrived(name):
    if common.rank() == 0:
        common.file_barrier(name, [0, 1], timeout=60)
    else:
        common.file_barrier(name, [1], timeout=1)


def blocking(dist, torch, n):
    count = 16
    if common.rank() == 1:
        rank0_first("blocking")
        tensors = [torch.full((4,), float(i)) for i in range(count)]
        for w in [dist.all_reduce(t, async_op=True) for t in tensors]:
            w.wait()
        return
    order, threads, peak = [], set(), [threads_now()]
    last_ran = threading.Event()
    baseline = threads_now()

    def make(i):
        def cb(fut):
            order.append(i)
            threads.add(threading.get_ident())
            peak[0] = max(peak[0], threads_now())
            if i == 0:
                last_ran.wait(10)
            if i == count - 1:
                last_ran.set()
            return fut.value()
        return cb

    tensors = [torch.full((4,), float(i)) for i in range(count)]
    futs = [dist.all_reduce(t, async_op=True).get_future().then(make(i)) for i, t in enumerate(tensors)]
    rank0_first("blocking")
    for f in futs:
        f.wait()
    ok = all(torch.equal(t, torch.full((4,), float(i * n))) for i, t in enumerate(tensors))
    common.record("blocking", order=order, threads=len(threads), baseline=baseline, peak=peak[0],
                  last_ran=last_ran.is_set(), correct=ok)


def destroy(dist, torch):
    group = dist.new_group(backend="ringx")
    ran = []

    def cb(fut):
        time.sleep(0.02)
        ran.append(time.time())
        return fut.value()

    for _ in range(8):
        dist.all_reduce(torch.ones(4), group=group, async_op=True).get_future().then(cb)
    dist.destroy_process_group(group)
    returned = time.time()
    time.sleep(0.5)
    common.record("destroy", ran=ran, returned=returned)


def drop_in_callback(dist, torch):
    holder = {"group": dist.new_group(backend="ringx")}
    if common.rank() == 1:
        rank0_first("drop")
        dist.all_reduce(torch.ones(4), group=holder["group"])
        dist.destroy_process_group(holder.pop("group"))
        return
    done = threading.Event()
    t = torch.ones(4)

    def cb(fut):
        dist.destroy_process_group(holder["group"])
        holder.clear()  # the last reference: the group is destroyed on this callback thread
        done.set()
        return fut.value()

    dist.all_reduce(t, group=holder["group"], async_op=True).get_future().then(cb)
    rank0_first("drop")
    common.record("drop_in_callback", finished=done.wait(10), value=t.tolist())


def fork(dist, torch):
    pending = dist.all_reduce(torch.ones(2), async_op=True)
    pending.wait()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        results = []
        for label, fn in (("all_reduce", lambda: dist.all_reduce(torch.ones(2))), ("wait", pending.wait)):
            try:
                fn()
                results.append(f"{label}: returned")
            except Exception as e:  # noqa: BLE001
                results.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0]}")
        os.write(write, "\n".join(results).encode())
        os._exit(0)
    os.close(write)
    deadline = time.time() + 5
    while time.time() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
        time.sleep(0.02)
    hung = False
    try:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            hung = True
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    child = os.read(read, 65536).decode()
    common.record("fork", hung=hung, child=child)
    t = torch.ones(2)
    dist.all_reduce(t)
    common.record("after_fork", value=t.tolist())


def teardown(dist, torch):
    def cb(fut):
        time.sleep(0.2)
        common.record("teardown_callback", value=[float(v) for v in fut.value()[0]])
        return fut.value()

    if common.rank() == 1:
        rank0_first("teardown")
        time.sleep(0.1)
        dist.all_reduce(torch.ones(2), async_op=True)
        rank1_arrived("teardown-end")
        common.record("done")
        return
    dist.all_reduce(torch.ones(2), async_op=True).get_future().then(cb)
    rank0_first("teardown")
    rank1_arrived("teardown-end")
    common.record("done")
    sys.stdout.flush()


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    n = dist.get_world_size()
    blocking(dist, torch, n)
    destroy(dist, torch)
    drop_in_callback(dist, torch)
    fork(dist, torch)
    dist.barrier()
    teardown(dist, torch)


if __name__ == "__main__":
    common.main(body)
