"""One rank of tests/python/test_multihost.py, started inside a network, pid and UTS
namespace that plays one host.

    multihost_rank.py OUT_DIR check|kill|monitored|leave|stopped VICTIM TIMEOUT_S

Writes OUT_DIR/rank<R>.json: the rank's hostname, the collectives it checked and, for
"kill", what its pending all_reduce raised after VICTIM exited and when. "monitored":
VICTIM exits instead of entering ringx.monitored_barrier(wait_all_ranks=True), rank 1
enters it 0.4 x TIMEOUT_S late, the others at once; "pending" is what it raised on rank 0.
"leave": VICTIM and the last rank (the other host) share a group of two, with a limit of
4 x TIMEOUT_S; VICTIM destroys it and keeps the world group ("left_at") while the last rank
all_reduces on it ("pending"); then every rank all_reduces on the world ("after").
"stopped": VICTIM's host-mate SIGSTOPs it for 3 s; meanwhile rank 0 destroys the world, its
process's last group ("destroy_s"), and every rank exits through the interpreter's exit.
"""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import ringx

out_dir, mode, victim, timeout_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("ringx", timeout=datetime.timedelta(seconds=timeout_s))
r, n = dist.get_rank(), dist.get_world_size()
report = {"rank": r, "host": os.uname().nodename, "checked": []}


def save():
    path = os.path.join(out_dir, f"rank{r}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


def wait_for(q, key, limit_s):
    """Until rank q's report holds `key`, for at most limit_s."""
    path = os.path.join(out_dir, f"rank{q}.json")
    deadline = time.time() + limit_s
    while time.time() < deadline and not (os.path.exists(path) and key in json.load(open(path))):
        time.sleep(0.05)


def check(name, got, want):
    assert torch.equal(got, want), f"rank {r} {name}: got {got.flatten()[:6]}, want {want.flatten()[:6]}"
    report["checked"].append(name)


for count in (8, 1 << 20):  # latency and bandwidth algorithms
    t = torch.full((count,), float(r + 1))
    dist.all_reduce(t)
    check(f"all_reduce {count}", t, torch.full((count,), n * (n + 1) / 2))
    t = torch.full((count,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check(f"all_reduce max {count}", t, torch.full((count,), float(n)))

b = torch.arange(300_000, dtype=torch.float64) if r == n - 1 else torch.zeros(300_000, dtype=torch.float64)
dist.broadcast(b, n - 1)
check("broadcast", b, torch.arange(300_000, dtype=torch.float64))

g = torch.empty(n * 1000, dtype=torch.int64)
dist.all_gather_into_tensor(g, torch.full((1000,), r, dtype=torch.int64))
check("all_gather_into_tensor", g, torch.arange(n).repeat_interleave(1000))

rs = torch.empty(1000)
dist.reduce_scatter_tensor(rs, torch.arange(n * 1000, dtype=torch.float32))
check("reduce_scatter_tensor", rs, torch.arange(r * 1000, (r + 1) * 1000, dtype=torch.float32) * n)

a2a = torch.empty(n * 4, dtype=torch.int32)
dist.all_to_all_single(a2a, torch.arange(n * 4, dtype=torch.int32) + 100 * r)
check("all_to_all_single", a2a, torch.cat([torch.arange(r * 4, r * 4 + 4, dtype=torch.int32) + 100 * q
                                            for q in range(n)]))

recvd = torch.empty(50_000)
reqs = [dist.isend(torch.full((50_000,), float(r)), (r + 1) % n), dist.irecv(recvd, (r - 1) % n)]
for q in reqs:
    q.wait()
check("send/recv ring", recvd, torch.full((50_000,), float((r - 1) % n)))

dist.barrier()
report["checked"].append("barrier")
save()

if mode in ("kill", "monitored"):
    dist.barrier()
    if r == victim:
        os._exit(7)
    t = torch.ones(8)
    start = time.time()
    try:
        if mode == "kill":
            dist.all_reduce(t)
        else:
            if r == 1:
                time.sleep(0.4 * timeout_s)
            ringx.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
        report["pending"] = {"ok": True}
    except Exception as e:  # noqa: BLE001
        report["pending"] = {"ok": False, "type": type(e).__name__, "msg": str(e), "seconds": time.time() - start}
    save()
    # Survivors leave together, so no survivor's exit is taken for another death.
    deadline = time.time() + 4 * timeout_s
    while time.time() < deadline and not all(os.path.exists(os.path.join(out_dir, f"rank{q}.json"))
                                              and "pending" in json.load(open(os.path.join(out_dir, f"rank{q}.json")))
                                              for q in range(n) if q != victim):
        time.sleep(0.05)
    dist.destroy_process_group()
    os._exit(0)

if mode == "leave":
    partner = n - 1
    pair = dist.new_group([victim, partner], timeout=datetime.timedelta(seconds=4 * timeout_s))
    if r in (victim, partner):
        dist.all_reduce(torch.ones(8), group=pair)
    dist.barrier()
    if r == victim:
        time.sleep(0.5)  # the partner's all_reduce is under way
        report["left_at"] = time.time()
        dist.destroy_process_group(pair)
    elif r == partner:
        start = time.time()
        try:
            dist.all_reduce(torch.ones(8), group=pair)
            report["pending"] = {"ok": True}
        except Exception as e:  # noqa: BLE001
            report["pending"] = {"ok": False, "type": type(e).__name__, "msg": str(e), "at": time.time(),
                                 "seconds": time.time() - start}
    save()
    # The world all_reduce starts once the partner is out of the pair's, however long it took.
    wait_for(partner, "pending", 6 * timeout_s)
    t = torch.full((8,), float(r + 1))
    try:
        dist.all_reduce(t)
        report["after"] = {"ok": torch.equal(t, torch.full((8,), n * (n + 1) / 2)), "sum": t[0].item()}
    except Exception as e:  # noqa: BLE001
        report["after"] = {"ok": False, "msg": str(e)}
    save()

if mode == "stopped":
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid{r}", str(os.getpid()))
    dist.barrier()
    # Nobody destroys the group before every rank has seen the barrier end.
    report["past_barrier"] = True
    save()
    for q in range(n):
        wait_for(q, "past_barrier", 4 * timeout_s)
    mate = victim ^ 1
    if r == mate:
        stopped = int(store.get(f"pid{victim}").decode())
        os.kill(stopped, signal.SIGSTOP)
        report["stopped_at"] = time.time()
        save()
        time.sleep(3.0)
        os.kill(stopped, signal.SIGCONT)
    elif r == 0:
        wait_for(mate, "stopped_at", 4 * timeout_s)
        time.sleep(0.2)
        start = time.time()
        dist.destroy_process_group()
        report["destroy_s"] = time.time() - start
        save()
        sys.exit(0)

dist.destroy_process_group()
