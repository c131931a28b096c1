"""One process of the multi-host fault matrix in tests/python/test_multihost.py.

    multihost_fault_matrix.py OUT_DIR ROLE TIMEOUT_S

ROLE is s0, s1 (host 0), s2 (host 1): survivors, which live through every trial; or
factory (host 1), which forks a fresh victim process for each trial and SIGKILLs it at
the trial's moment. Launching python once per process and forking victims keeps a
matrix of hundreds of trials to about a second each.

Every process computes the same trial list (the environment variables below) and
takes part in the trials that include it. A trial builds a fresh ringx group on its
own store prefix, runs one collective while the victim dies "before" the call (the
survivors call only after the victim's death is known) or "during" it (the survivors
have submitted, the victim has submitted its part, then it is killed), then a barrier
on the same group. Each survivor writes, per trial, what the collective (its call and
its wait) and the barrier raised and how long they took. A survivor that crashes leaves
its report short.

A sparse all_reduce (op sparse_all_reduce) is one op like the others: its call returns
at once, and its nonzero counts, then its indices and values, move in the background.

Configurations (RINGX_FM_CONFIGS, comma separated):
  remote2      world 2: s0 (host 0) and the victim (host 1): UCX over TCP only
  mixed4       world 4: s0, s1 (host 0), s2 and the victim (host 1): s0 and s1 lose a
               remote peer, s2 a local one, over shared memory
  mixed4-noshm the same with RINGX_SHM=0: s2's local peer over UCX, watched by pid
"""

import datetime
import json
import os
import random
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (AllToAllOptions, BroadcastOptions, GatherOptions, ReduceOptions,
                                        ScatterOptions)

import ringx

out_dir, role, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
torch.set_num_threads(1)

CONFIGS = {
    "remote2": (["s0", "victim"], "1"),
    "mixed4": (["s0", "s1", "s2", "victim"], "1"),
    "mixed4-noshm": (["s0", "s1", "s2", "victim"], "0"),
}
# The default op list. test_multihost.py reads it from this file's source (this script runs
# at import): keep it a literal.
OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
       "barrier", "send_recv", "sparse_all_reduce"]
ROOTED = {"broadcast", "reduce", "gather", "scatter"}
SPARSE_ROW = 64  # floats per nonzero row of a sparse all_reduce


def trials():
    configs = os.environ.get("RINGX_FM_CONFIGS", "remote2,mixed4,mixed4-noshm").split(",")
    ops = os.environ.get("RINGX_FM_OPS", ",".join(OPS)).split(",")
    sizes = [int(s) for s in os.environ.get("RINGX_FM_SIZES", "8,4194304").split(",")]
    whens = os.environ.get("RINGX_FM_WHEN", "before,during").split(",")
    reps = int(os.environ.get("RINGX_FM_REPS", "5"))
    out = []
    for rep in range(reps):
        for config in configs:
            for op in ops:
                for nbytes in sizes:
                    for when in whens:
                        out.append({"config": config, "op": op, "bytes": nbytes, "when": when, "rep": rep})
    return out


def connect():
    is_master = role == "s0"
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=is_master,
                         wait_for_workers=False, timeout=datetime.timedelta(seconds=120))


def tensors(op, rank, n, count, root):
    """(inputs, outputs, expected outputs or None) of `op` on `rank`; rank q contributes q + 1."""
    val = float(rank + 1)
    total = n * (n + 1) / 2
    if op == "all_reduce":
        t = torch.full((count,), val)
        return t, t, torch.full((count,), total)
    if op == "broadcast":
        t = torch.full((count,), val) if rank == root else torch.zeros(count)
        return t, t, torch.full((count,), float(root + 1))
    if op == "reduce":
        t = torch.full((count,), val)
        return t, t, torch.full((count,), total) if rank == root else None
    if op == "all_gather":
        out = torch.empty(n * count)
        return torch.full((count,), val), out, torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(count)
    if op == "reduce_scatter":
        return torch.full((n * count,), val), torch.empty(count), torch.full((count,), total)
    if op == "all_to_all":
        inp = (100 * rank + torch.arange(n, dtype=torch.float32)).repeat_interleave(count)
        want = (100 * torch.arange(n, dtype=torch.float32) + rank).repeat_interleave(count)
        return inp, torch.empty(n * count), want
    if op == "gather":
        outs = [torch.empty(count) for _ in range(n)] if rank == root else []
        want = [torch.full((count,), float(q + 1)) for q in range(n)] if rank == root else None
        return torch.full((count,), val), outs, want
    if op == "scatter":
        ins = [torch.full((count,), float(q + 1)) for q in range(n)] if rank == root else []
        return ins, torch.empty(count), torch.full((count,), val)
    if op == "barrier":
        return None, None, None
    if op == "sparse_all_reduce":
        # `count` float values in nonzero rows of SPARSE_ROW floats (4 MiB: 16384 rows of
        # 64), or in one row of `count` floats when it is smaller (8 B: one row of 2).
        # Rank q's rows are q, q + n, q + 2n, ...: distinct across ranks, as in
        # fault_scripts/dead_peer.py, so the coalesced sum has rows * n rows, row i holding
        # (i mod n) + 1. The result replaces the input's indices and values in place.
        width = min(count, SPARSE_ROW)
        rows = count // width
        idx = (torch.arange(rows, dtype=torch.int64) * n + rank).unsqueeze(0)
        t = torch.sparse_coo_tensor(idx, torch.full((rows, width), val), (n * rows, width),
                                    check_invariants=False).coalesce()
        want = torch.arange(1, n + 1, dtype=torch.float32).repeat(rows).unsqueeze(1).expand(n * rows, width)
        return t, t, want
    raise ValueError(op)


def issue(pg, op, rank, root, inp, out):
    """Submits `op`; returns the Works to wait on."""
    if op in ("all_reduce", "sparse_all_reduce"):
        return [pg.allreduce([inp])]
    if op == "broadcast":
        o = BroadcastOptions()
        o.rootRank = root
        return [pg.broadcast([inp], o)]
    if op == "reduce":
        o = ReduceOptions()
        o.rootRank = root
        return [pg.reduce([inp], o)]
    if op == "all_gather":
        return [pg._allgather_base(out, inp)]
    if op == "reduce_scatter":
        return [pg._reduce_scatter_base(out, inp)]
    if op == "all_to_all":
        return [pg.alltoall_base(out, inp, [], [], AllToAllOptions())]
    if op == "gather":
        o = GatherOptions()
        o.rootRank = root
        return [pg.gather([out] if rank == root else [], [inp], o)]
    if op == "scatter":
        o = ScatterOptions()
        o.rootRank = root
        return [pg.scatter([out], [inp] if rank == root else [], o)]
    if op == "barrier":
        return [pg.barrier()]
    raise ValueError(op)


def send_recv(pg, rank, victim, count):
    """Survivors exchange `count` floats with the victim; the victim with each survivor."""
    if rank == victim:
        peers = [q for q in range(pg.size()) if q != victim]
        bufs = [torch.empty(count) for _ in peers]
        return [pg.send([torch.full((count,), float(rank + 1))], p, 0) for p in peers] + \
               [pg.recv([b], p, 0) for b, p in zip(bufs, peers)], None, None
    got = torch.empty(count)
    works = [pg.recv([got], victim, 0), pg.send([torch.full((count,), float(rank + 1))], victim, 0)]
    return works, got, torch.full((count,), float(victim + 1))


def make_group(store, t, i, rank, n):
    os.environ["RINGX_SHM"] = CONFIGS[t["config"]][1]
    prefix = dist.PrefixStore(f"t{i}/", store)
    return prefix, ringx._C.ProcessGroupRingx(prefix, rank, n, datetime.timedelta(seconds=timeout_s))


def run_victim(store, t, i, rank, n):
    """The victim's side of trial i, in a forked child: join, then (during) submit and stall."""
    count = t["bytes"] // 4
    prefix, pg = make_group(store, t, i, rank, n)
    pg.barrier().wait()
    # The barrier may end here before it ends on the survivors: wait for them.
    while prefix.add("warm", 0) < n - 1:
        time.sleep(0.002)
    prefix.set("victim-ready", "1")
    if t["when"] == "during":
        root = 0 if t["rep"] % 2 == 0 else rank
        if t["op"] != "send_recv":
            inp, out, _ = tensors(t["op"], rank, n, count, root)
        prefix.wait(["posted"])
        if t["op"] == "send_recv":
            send_recv(pg, rank, rank, count)
        else:
            issue(pg, t["op"], rank, root, inp, out)
        prefix.set("victim-submitted", "1")
    time.sleep(3600)


def factory(store, plan):
    for i, t in enumerate(plan):
        members, _ = CONFIGS[t["config"]]
        n, rank = len(members), members.index("victim")
        pid = os.fork()
        if pid == 0:
            try:
                run_victim(connect(), t, i, rank, n)
            finally:
                os._exit(3)
        prefix = dist.PrefixStore(f"t{i}/", store)
        prefix.wait(["victim-ready"])
        if t["when"] == "during":
            prefix.wait(["victim-submitted"])
            time.sleep(random.uniform(0, 0.005))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        prefix.set("dead", repr(time.time()))
        # The next trial's victim starts only after this trial's survivors are done,
        # so a slow survivor never sees two victims at once.
        prefix.wait(["done"])


def matches(got, want):
    if want is None:
        return True
    if isinstance(want, list):
        return all(torch.equal(g, w) for g, w in zip(got, want))
    if got.is_sparse:
        return got.is_coalesced() and torch.equal(got.to_dense(), want)
    return torch.equal(got, want)


def outcome(fn):
    start = time.time()
    try:
        fn()
        return {"ok": True, "seconds": time.time() - start}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "type": type(e).__name__, "msg": str(e).split("\n")[0][:400],
                "seconds": time.time() - start}


def survivor(store, plan):
    results = []
    path = os.path.join(out_dir, f"{role}.json")
    for i, t in enumerate(plan):
        members, _ = CONFIGS[t["config"]]
        if role not in members:
            continue
        n, rank, victim = len(members), members.index(role), members.index("victim")
        count = t["bytes"] // 4
        root = 0 if t["rep"] % 2 == 0 else victim
        prefix, pg = make_group(store, t, i, rank, n)
        pg.barrier().wait()
        prefix.add("warm", 1)
        if t["when"] == "before":
            prefix.wait(["dead"])
        inp = got = want = None
        if t["op"] != "send_recv":
            inp, got, want = tensors(t["op"], rank, n, count, root)
        rec = dict(t, rank=rank, victim=victim, root=root if t["op"] in ROOTED else None)

        def post():
            if t["when"] == "during" and prefix.add("posted-count", 1) == n - 1:
                prefix.set("posted", "1")

        def call():
            """Submits and waits: the submit is part of the outcome (no call may raise
            there because of the victim; every failure comes from a wait)."""
            nonlocal got, want, phase
            try:
                if t["op"] == "send_recv":
                    works, got, want = send_recv(pg, rank, victim, count)
                else:
                    works = issue(pg, t["op"], rank, root, inp, got)
            finally:
                post()  # even if the submit raised, or the victim waits forever
            phase = "wait"
            for w in works:
                w.wait()

        phase = "call"
        rec["call"] = outcome(call)
        if rec["call"]["ok"]:
            rec["call"]["correct"] = matches(got, want)
        else:
            rec["call"]["raised_in"] = phase  # "call": the submit raised; "wait": a Work's wait
        rec["barrier"] = outcome(lambda: pg.barrier().wait())
        prefix.wait(["dead"])
        rec["dead_at"] = float(prefix.get("dead"))
        rec["now"] = time.time()
        results.append(rec)
        with open(path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(path + ".tmp", path)
        # A survivor that closes its group while another still waits would be
        # reported to that one as a second dead peer: leave together.
        if prefix.add("finished", 1) == n - 1:
            prefix.set("done", "1")
        prefix.wait(["done"])
        pg.shutdown()
        del pg


def leave_together(store):
    """No survivor's exit is taken for another death, and the store (s0's) goes last."""
    store.add("all-finished", 1)
    while store.add("all-finished", 0) < 4:
        time.sleep(0.05)
    if role != "s0":
        store.add("left", 1)
        return
    while store.add("left", 0) < 3:
        time.sleep(0.05)


store = connect()
plan = trials()
if role == "factory":
    factory(store, plan)
else:
    survivor(store, plan)
leave_together(store)
os._exit(0)
