"""Subgroup case bodies: new_group over subsets and permuted orders, several groups alive,
group-local ranks, async ops on two groups at once, destroy_process_group(group),
ProcessGroup.split_group / dist.split_group, and a world started with a mixed backend
string ("cpu:ringx,cuda:gloo").

Every rank of the world calls new_group for every spec, in the same order (torch requires
that), and runs the ops only in the groups it belongs to.
"""

import datetime

import torch
import torch.distributed as dist

import refs


def group_specs(ws):
    """[(name, ranks, sort_ranks)] for a world of ws (ws >= 2)."""
    perm = [(3 * i + 1) % ws for i in range(ws)] if ws % 3 else list(reversed(range(ws)))
    specs = [
        ("first_half", list(range(max(1, ws // 2))), True),
        ("evens", list(range(0, ws, 2)), True),
        ("odds_reversed_sorted", list(reversed(range(1, ws, 2))), True),
        ("odds_reversed", list(reversed(range(1, ws, 2))), False),
        ("all_permuted", perm, False),
        ("last_and_first", [ws - 1, 0], False),
        ("singleton", [ws - 1], True),
    ]
    return specs


def group_order(ranks, sort_ranks):
    """Global ranks in group-rank order."""
    return sorted(ranks) if sort_ranks else list(ranks)


def _value(seed, name, global_rank, count=7, dtype="float32"):
    return refs.make_input(refs.seed_for(seed, "subgroup", name), global_rank, dtype, count)


def _group_op(op, g, name, n, me, seed, keep):
    """One op of subgroup_ops in group g (n ranks); every tensor it makes goes to `keep`."""
    grank = dist.get_rank(g)

    def k(t):
        keep.append(t)
        return t

    if op == "all_reduce":
        t = k(torch.full((5,), me + 1, dtype=torch.int64))
        dist.all_reduce(t, group=g)
        return t
    if op == "broadcast":
        t = k(_value(seed, name + "/bcast", me))
        dist.broadcast(t, group=g, group_src=n - 1)
        return t
    if op == "all_gather":
        outs = [k(torch.empty(7)) for _ in range(n)]
        dist.all_gather(outs, k(_value(seed, name + "/ag", me)), group=g)
        return torch.cat(outs)
    if op == "reduce":
        t = k(refs.make_input(refs.seed_for(seed, "subgroup", name + "/reduce"), me, "int64", 9))
        dist.reduce(t, group=g, group_dst=n - 1)
        return t if grank == n - 1 else None
    if op == "all_to_all_single":
        inp = k(torch.cat([_value(seed, f"{name}/a2a/{j}", me, 3) for j in range(n)]))
        outp = k(torch.empty(3 * n))
        dist.all_to_all_single(outp, inp, group=g)
        return outp
    if op == "send_recv":
        if n < 2 or grank > 1:
            return None
        if grank == 0:
            dist.send(k(_value(seed, name + "/p2p", me)), group=g, group_dst=1)
            return None
        t = k(torch.empty(7))
        dist.recv(t, group=g, group_src=0)
        return t
    if op == "barrier":
        dist.barrier(group=g)
        return True
    raise ValueError(op)


GROUP_OPS = ("all_reduce", "broadcast", "all_gather", "reduce", "all_to_all_single", "send_recv",
             "barrier")


def subgroup_ops(seed, specs):
    """Create every group in `specs`, then in each group this rank belongs to run: the
    rank queries, all_reduce, broadcast (group_src = last), all_gather, reduce (group_dst =
    last), all_to_all_single, send/recv between group ranks 0 and 1, barrier.  Then check
    the default group and destroy the subgroups.

    {name: {"member": False, "rank": dist.get_rank(g)}} for non-members,
    {name: {"member": True, "rank", "size", "global_ranks", "group_rank_of_me", <op>: tensor}}.
    """
    me = dist.get_rank()
    # Every tensor handed to a collective stays referenced until the groups are gone: a
    # ProcessGroupGloo destructor (run with the GIL held) joins gloo's worker threads, and
    # a worker dropping the last reference to a Python-created tensor needs the GIL.
    keep = []
    groups = []
    for name, ranks, sort_ranks in specs:
        groups.append((name, ranks, dist.new_group(ranks=ranks, sort_ranks=sort_ranks)))
    out = {}
    for name, ranks, g in groups:
        if me not in ranks:
            out[name] = {"member": False, "rank": dist.get_rank(g),
                         "is_non_member": g is dist.GroupMember.NON_GROUP_MEMBER}
            continue
        n = len(ranks)
        res = out[name] = {
            "member": True, "rank": dist.get_rank(g), "size": dist.get_world_size(g),
            "global_ranks": [dist.get_global_rank(g, i) for i in range(n)],
            "group_rank_of_me": dist.get_group_rank(g, me)}
        res.update(refs.run_until_error(
            GROUP_OPS, lambda op, g=g, name=name, n=n: _group_op(op, g, name, n, me, seed, keep)))
    # the default group still works and is unaffected
    t = torch.ones(1)
    dist.all_reduce(t)
    out["__world__"] = float(t.item())
    # every rank destroys its groups in creation order; the last references go here, while
    # `keep` still holds the tensors
    for name, ranks, g in groups:
        if me in ranks:
            dist.destroy_process_group(g)
    del groups, g
    return out


def concurrent_async(seed, count):
    """Async all_reduces issued on several groups before any is waited for: the default
    group, the whole world in reversed order, and the even or odd ranks (each rank is in
    two or three of them at once); waited for in reverse order.

    {name: tensor} for the groups this rank is in.
    """
    me, ws = dist.get_rank(), dist.get_world_size()
    specs = [("world_reversed", list(reversed(range(ws))), False),
             ("evens", list(range(0, ws, 2)), True),
             ("odds", list(range(1, ws, 2)), True)]
    groups = {name: dist.new_group(ranks=r, sort_ranks=s) for name, r, s in specs}

    def run(_):
        pending = []
        for name, g in [("default", None)] + list(groups.items()):
            members = list(range(ws)) if g is None else dict((n, r) for n, r, _ in specs)[name]
            if me not in members:
                continue
            x = refs.make_input(refs.seed_for(seed, "concurrent", name), me, "float32", count)
            pending.append((name, x, dist.all_reduce(x, group=g, async_op=True)))
        for _, _, w in reversed(pending):
            w.wait()
        return {name: x for name, x, _ in pending}

    res = refs.run_until_error(["concurrent"], run)
    for g in groups.values():
        if g is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    return res.get("concurrent", res)


def destroy_and_recreate(rounds):
    """Create a group over every rank and one over a subset, use them, destroy them;
    `rounds` times.  Then the default group must still work.

    {"sums": [[all-ranks sum, subset sum or None] per round], "world": sum}.
    """
    me, ws = dist.get_rank(), dist.get_world_size()

    def run(_):
        sums = []
        for i in range(rounds):
            g_all = dist.new_group(list(range(ws)))
            sub = [r for r in range(ws) if (r + i) % 2 == 0] or [0]
            g_sub = dist.new_group(sub)
            t = torch.tensor([me + 1.0])
            dist.all_reduce(t, group=g_all)
            row = [float(t.item()), None]
            if me in sub:
                u = torch.tensor([me + 1.0])
                dist.all_reduce(u, group=g_sub)
                row[1] = float(u.item())
                dist.destroy_process_group(g_sub)
            dist.destroy_process_group(g_all)
            sums.append(row)
        t = torch.ones(1)
        dist.all_reduce(t)
        return {"sums": sums, "world": float(t.item())}

    res = refs.run_until_error(["destroy"], run)
    return res.get("destroy", res)


def built_then_destroyed_at_once(rounds):
    """`rounds` times: every rank builds a group of all ranks and destroys it as soon as
    new_group returns, as a rank that has nothing to do in a group does (the rank that
    skips a monitored_barrier).  A rank that returns first must not tear its side down
    while a slower peer still connects to it.  After each round the ranks agree over the
    default group whether any creation failed, and stop together.

    {"failed": [round, error text] or None, "rounds": rounds done, "world": sum}.
    """
    out = {"failed": None, "rounds": 0}
    for i in range(rounds):
        err = None
        try:
            g = dist.new_group(list(range(dist.get_world_size())))
            dist.destroy_process_group(g)
        except Exception as e:  # noqa: BLE001 - inspected by the parent
            err = f"{type(e).__name__}: {e}"
            out["failed"] = [i, err]
        flag = torch.tensor([0.0 if err is None else 1.0])
        dist.all_reduce(flag)
        out["rounds"] = i + 1
        if flag.item():
            break
    t = torch.ones(1)
    dist.all_reduce(t)
    out["world"] = float(t.item())
    return out


def pg_split_group(seed, color_of_rank):
    """ProcessGroup.split_group (the C++ split that dist.split_group calls after its
    accelerator checks): each rank passes the ranks of its colour.  Then all_reduce and
    all_gather in the split group.

    {"rank", "size", "sum", "gathered"} or the error under ERROR_KEY.
    """
    me, ws = dist.get_rank(), dist.get_world_size()
    mine = [r for r in range(ws) if color_of_rank[r] == color_of_rank[me]]

    def run(_):
        name = f"split-{seed}-{color_of_rank[me]}-{'_'.join(map(str, mine))}"
        sg = dist.group.WORLD.split_group(mine, timeout=datetime.timedelta(seconds=30),
                                          group_name=name)
        if sg is None:
            return {"none": True}
        t = torch.tensor([me + 1.0])
        sg.allreduce([t]).wait()
        outs = [[torch.empty(1) for _ in range(sg.size())]]
        sg.allgather(outs, [torch.tensor([float(me)])]).wait()
        return {"rank": sg.rank(), "size": sg.size(), "sum": float(t.item()),
                "gathered": [float(x.item()) for x in outs[0]]}

    res = refs.run_until_error(["split"], run)
    t = torch.ones(1)
    dist.all_reduce(t)  # the default group is fine afterwards
    out = res.get("split", res)
    out["world"] = float(t.item())
    return out


def public_split_group(color_of_rank):
    """dist.split_group itself; the outcome, or the error text."""
    me, ws = dist.get_rank(), dist.get_world_size()
    colours = sorted(set(color_of_rank))
    split_ranks = [[r for r in range(ws) if color_of_rank[r] == c] for c in colours]
    try:
        sg = dist.split_group(split_ranks=split_ranks)
    except Exception as e:  # noqa: BLE001
        return ("raised", type(e).__name__, str(e))
    t = torch.tensor([me + 1.0])
    dist.all_reduce(t, group=sg)
    return ("ok", dist.get_rank(sg), dist.get_world_size(sg), float(t.item()))


def backend_routing():
    """What a world started with a mixed backend string looks like from inside."""
    me, ws = dist.get_rank(), dist.get_world_size()
    out = {"get_backend": str(dist.get_backend())}
    try:
        out["backend_config"] = str(dist.get_backend_config())
    except Exception as e:  # noqa: BLE001
        out["backend_config"] = f"<{type(e).__name__}: {e}>"
    pg = dist.group.WORLD
    try:
        out["cpu_backend_type"] = type(pg._get_backend(torch.device("cpu"))).__name__
    except Exception as e:  # noqa: BLE001
        out["cpu_backend_type"] = f"<{type(e).__name__}: {e}>"

    def ops(op):
        if op == "all_reduce":
            t = torch.full((1000,), me + 1.0)
            dist.all_reduce(t)
            return float(t[0].item())
        if op == "broadcast":
            t = torch.full((13,), float(me))
            dist.broadcast(t, src=ws - 1)
            return float(t.sum().item())
        if op == "all_gather":
            outs = [torch.empty(2, dtype=torch.int64) for _ in range(ws)]
            dist.all_gather(outs, torch.tensor([me, me * me]))
            return torch.cat(outs).tolist()
        if op == "barrier":
            dist.barrier()
            return True
        raise ValueError(op)

    out.update(refs.run_until_error(["all_reduce", "broadcast", "all_gather", "barrier"], ops))
    return out


def worker_main_importing_ringx(rank, world_size, env, conn, log_path):
    """harness._worker_main, with ringx imported first when the backend string names it:
    the harness imports ringx only for the exact string "ringx", and the forkserver turns
    backend autoload off.  Used by test_subgroups.MixedBackendWorld."""
    import harness

    if "ringx" in env.get("RINGX_TEST_BACKEND", ""):
        import ringx  # noqa: F401  (registers the backend)
    harness._worker_main(rank, world_size, env, conn, log_path)


def pg_split_group_bad_ranks(ranks):
    """ProcessGroup.split_group with an invalid rank list: (exception type, message),
    then whether the default group still all_reduces correctly."""
    try:
        dist.group.WORLD.split_group(ranks, timeout=datetime.timedelta(seconds=10))
        raised = None
    except Exception as e:  # noqa: BLE001
        raised = (type(e).__name__, str(e))
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"raised": raised, "world_ok": t.item() == dist.get_world_size()}
