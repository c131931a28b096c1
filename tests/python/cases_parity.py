"""Case bodies for test_parity.py: the calls where ringx must behave as gloo does
(issue 15): all_gather_coalesced, monitored_barrier with zero and tiny timeouts, sparse
all_reduce, coalescing with a device (one Work per batch) and the profiler records."""

import datetime
import time
import warnings

import torch
import torch.distributed as dist

import harness
import refs


def _dtype(name):
    return refs.DTYPES[name]


# ---------------------------------------------------------------- all_gather_coalesced

def all_gather_coalesced(seed, dtype, shapes, async_op):
    """dist.all_gather_coalesced of one input per shape (empty ones included) into perturbed
    outputs; returns {"out": [[tensor per input] per rank]} (or the error)."""
    rank, ws = dist.get_rank(), dist.get_world_size()

    def numel(shape):
        n = 1
        for s in shape:
            n *= s
        return n

    def run(_):
        ins = [refs.make_input(refs.seed_for(seed, "agc", i), rank, dtype, numel(s)).reshape(s)
               for i, s in enumerate(shapes)]
        outs = [[refs.perturb(torch.zeros(s, dtype=_dtype(dtype))) for s in shapes]
                for _ in range(ws)]
        res = dist.all_gather_coalesced(outs, ins, async_op=async_op)
        if async_op:
            res.wait()
        return outs

    return refs.run_until_error(["all_gather_coalesced"], run)


# ---------------------------------------------------------------- monitored_barrier

class _Skipped(Exception):
    pass


def monitored_barrier_short_timeout(busy, busy_s, timeout_ms, wait_all_ranks, late_call, group_call=True):
    """On a fresh subgroup of every rank, ranks in `busy` sleep busy_s and then call
    monitored_barrier(timeout=timeout_ms) if `late_call` (else skip it); the others call it
    at once.  Returns {"outcome": "returned" | "skipped" | (type, message), "seconds": time
    inside the call, "group_call": what an all_reduce on the subgroup afterwards gave (the
    sum, or the error) and how long it took (None without `group_call`), "sanity":
    all_reduce of ones on the default group after the subgroup is destroyed}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(ws)))
    timeout = datetime.timedelta(milliseconds=timeout_ms)
    out = {}
    if rank in busy:
        time.sleep(busy_s)
    t0 = time.monotonic()
    try:
        if rank in busy and not late_call:
            raise _Skipped()
        dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
        out["outcome"] = "returned"
    except _Skipped:
        out["outcome"] = "skipped"
    except Exception as e:  # noqa: BLE001 - inspected by the parent
        out["outcome"] = (type(e).__name__, str(e))
    out["seconds"] = time.monotonic() - t0
    # The ranks that raised at once wait here for the busy ones, so the subgroup is
    # destroyed by all ranks after everyone has left the barrier.
    t = torch.ones(1)
    t0 = time.monotonic()
    out["group_call"] = None
    try:
        if group_call:
            dist.all_reduce(t, group=group)
            out["group_call"] = (float(t.item()), time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001 - inspected by the parent
        out["group_call"] = (f"{type(e).__name__}: {e}", time.monotonic() - t0)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group(group)
    t = torch.ones(1)
    dist.all_reduce(t)
    out["sanity"] = float(t.item())
    return out


def monitored_barrier_backend_all_arrive():
    """The backend's monitoredBarrier itself (ProcessGroup.monitored_barrier), every rank
    present, wait_all_ranks, a timeout of 10 s: it must pass.  Returns seconds."""
    group = dist.new_group(list(range(dist.get_world_size())))
    t0 = time.monotonic()
    group.monitored_barrier(datetime.timedelta(seconds=10), wait_all_ranks=True)
    took = time.monotonic() - t0
    dist.destroy_process_group(group)
    return took


def set_pg_timeout_then_time_out(new_timeout_s, how):
    """A group made with a 60 s timeout gets `new_timeout_s` through torch's
    _set_pg_timeout (how "_set_pg_timeout") or ProcessGroup.set_timeout; rank 0 then
    calls an all_reduce that no other rank joins.  Returns (warnings raised while
    setting it, rank 0's error type or None, seconds)."""
    r, n = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(n)), timeout=datetime.timedelta(seconds=60))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "_set_pg_timeout":
            dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=new_timeout_s), group)
        else:
            group.set_timeout(datetime.timedelta(seconds=new_timeout_s))
    error, t0 = None, time.monotonic()
    if r == 0:
        try:
            dist.all_reduce(torch.ones(4), group=group)
        except Exception as e:  # noqa: BLE001 - the type is the result
            error = type(e).__name__
    took = time.monotonic() - t0
    dist.barrier()
    dist.destroy_process_group(group)
    return [str(w.message) for w in caught], error, took


# ---------------------------------------------------------------- sparse all_reduce

def _sparse_input(seed, rank, shape, sparse_dim, dtype):
    """A rank's COO tensor: rank-dependent nonzeros (rank 0 has none), duplicates included,
    left uncoalesced."""
    g = torch.Generator().manual_seed(hash((seed, rank)) % (2**31))
    nnz = 0 if rank == 0 else 2 * rank + 1
    idx = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dim)])
    vals = (torch.randint(-5, 6, (nnz,) + tuple(shape[sparse_dim:]), generator=g)).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, shape)


def sparse_all_reduce(seed, cases):
    """all_reduce(SUM) of sparse tensors; `cases` = [(shape, sparse_dim, dtype name)].
    Returns {"sparse_all_reduce": [(is_sparse, dense result)], "max": error of a MAX,
    "bcast": error of a broadcast of a sparse tensor, "shapes": error of ranks passing
    different shapes, "dims": what a 65-dimensional one gave, "sanity": an all_reduce
    afterwards}."""
    rank = dist.get_rank()

    def run(_):
        got = []
        for i, (shape, sparse_dim, dtype) in enumerate(cases):
            x = _sparse_input((seed, i), rank, shape, sparse_dim, _dtype(dtype))
            work = dist.all_reduce(x, async_op=True)
            work.wait()
            got.append((x.is_sparse, x.to_dense()))
        return got

    out = refs.run_until_error(["sparse_all_reduce"], run)
    for key, fn in (("max", lambda: dist.all_reduce(torch.ones(4).to_sparse(), op=dist.ReduceOp.MAX)),
                    ("bcast", lambda: dist.broadcast(torch.ones(4).to_sparse(), 0)),
                    ("shapes", lambda: dist.all_reduce(torch.ones(4 + rank).to_sparse())),
                    ("dims", lambda: dist.all_reduce(torch.ones([1] * 65).to_sparse()))):
        try:
            fn()
            out[key] = "returned"
        except Exception as e:  # noqa: BLE001 - inspected by the parent
            out[key] = (type(e).__name__, str(e))
    t = torch.ones(1)
    dist.all_reduce(t)
    out["sanity"] = float(t.item())
    return out


def sparse_all_reduce_async(seed, cases, big_rows, tries):
    """The sparse all_reduces of `cases` issued with async_op=True, each followed by an
    asynchronous dense all_reduce of ones(3), then waited for in reverse order; one more
    through its Future; then `tries` sparse all_reduces of `big_rows` rows of 64 floats,
    asked is_completed() as soon as the call returns. Returns {"sparse": [(is_sparse,
    dense result, whether its values are inference tensors)], "dense": [sums],
    "future": the Future's value summed, "pending_at_return": how many big calls had
    not completed when they returned}."""
    rank = dist.get_rank()
    xs, dense, works = [], [], []
    for i, (shape, sparse_dim, dtype) in enumerate(cases):
        x = _sparse_input((seed, i), rank, shape, sparse_dim, _dtype(dtype))
        xs.append(x)
        works.append(dist.all_reduce(x, async_op=True))
        d = torch.ones(3)
        dense.append(d)
        works.append(dist.all_reduce(d, async_op=True))
    for w in reversed(works):
        w.wait()
    out = {"sparse": [(x.is_sparse, x.to_dense(), x._values().is_inference()) for x in xs],
           "dense": [float(d.sum()) for d in dense]}
    x = _sparse_input((seed, 0), rank, *cases[0][:2], _dtype(cases[0][2]))
    fut = dist.all_reduce(x, async_op=True).get_future()
    out["future"] = float(fut.then(lambda f: f.value()[0].to_dense().sum()).wait())
    g = torch.Generator().manual_seed(seed + rank)
    idx = torch.randint(0, 4 * big_rows, (1, big_rows), generator=g)
    vals = torch.randn(big_rows, 64, generator=g)
    pending = 0
    for _ in range(tries):
        big = torch.sparse_coo_tensor(idx, vals, (4 * big_rows, 64)).coalesce()
        w = dist.all_reduce(big, async_op=True)
        pending += not w.is_completed()
        w.wait()
    out["pending_at_return"] = pending
    return out


def sparse_all_reduce_before_peers(seed, cases, late_s):
    """Rank 0 starts each sparse all_reduce of `cases` (async_op=True) while the other
    ranks first sleep `late_s`, then send it a tensor, and only then call theirs; rank 0
    receives from each of them before it waits. A call that waited for every rank would
    hold rank 0 until the timeout. Returns {"returned_after": seconds rank 0's calls took,
    "sparse": [dense results], "received": [what rank 0 received]}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    out = {"returned_after": [], "sparse": [], "received": []}
    for i, (shape, sparse_dim, dtype) in enumerate(cases):
        x = _sparse_input((seed, i), rank, shape, sparse_dim, _dtype(dtype))
        if rank == 0:
            t0 = time.monotonic()
            work = dist.all_reduce(x, async_op=True)
            out["returned_after"].append(time.monotonic() - t0)
            for src in range(1, ws):
                got = torch.zeros(2)
                dist.recv(got, src=src)
                out["received"].append(got.tolist())
        else:
            time.sleep(late_s)
            dist.send(torch.full((2,), float(rank)), dst=0)
            work = dist.all_reduce(x, async_op=True)
        work.wait()
        out["sparse"].append(x.to_dense())
    return out


def sparse_reference(seed, ws, cases):
    """The dense sums the parent expects."""
    return [sum(_sparse_input((seed, i), r, shape, sparse_dim, _dtype(dtype)).to_dense()
                for r in range(ws))
            for i, (shape, sparse_dim, dtype) in enumerate(cases)]


# ---------------------------------------------------------------- coalescing with a device

def _works(cm):
    return [w for w in cm.works if w is not None]


def _closing_coalescing(fn):
    """Runs fn(key); if it raised inside a coalescing manager, closes what torch and the
    backend left open (torch keeps capturing collectives, the backend holding them), so
    the world stays usable for the next case."""
    def run(key):
        try:
            return fn(key)
        except Exception:
            group = dist.group.WORLD
            if dist.distributed_c10d._world.pg_coalesce_state.pop(group, None) is not None:
                try:
                    group._end_coalescing(torch.device("cpu"))
                except Exception:  # noqa: BLE001 - the original error is what counts
                    pass
            raise
    return run


def coalesced_with_device(seed, counts):
    """Inside dist._coalescing_manager(device=cpu, async_ops=True): all_reduces,
    all_gather_into_tensors, reduce_scatter_tensors (torch's fast paths) and broadcasts
    (separate backend calls). Returns {kind: (number of Works, [results])}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    cpu = torch.device("cpu")

    def run(kind):
        outs = []
        with dist._coalescing_manager(device=cpu, async_ops=True) as cm:
            for i, c in enumerate(counts):
                s = refs.seed_for(seed, "cmd", kind, i)
                if kind == "all_reduce":
                    x = refs.make_input(s, rank, "float32", c)
                    dist.all_reduce(x)
                    outs.append(x)
                elif kind == "all_gather_into_tensor":
                    x = refs.make_input(s, rank, "float32", c)
                    out = refs.perturb(torch.zeros(ws * c))
                    dist.all_gather_into_tensor(out, x)
                    outs.append(out)
                elif kind == "reduce_scatter_tensor":
                    x = refs.make_input(s, rank, "float32", ws * c)
                    out = refs.perturb(torch.zeros(c))
                    dist.reduce_scatter_tensor(out, x)
                    outs.append(out)
                elif kind == "broadcast":
                    x = refs.make_input(s, rank, "float32", c)
                    dist.broadcast(x, src=i % ws)
                    outs.append(x)
        works = _works(cm)
        for w in works:
            w.wait()
        return (len(works), outs)

    return refs.run_until_error(["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                                 "broadcast"], _closing_coalescing(run))


def coalesced_mixed_reductions():
    """Inside dist._coalescing_manager(device=cpu): a float32 reduce, then an int64 one,
    which cannot share the float32 one's op. Returns the error of the second call, and
    the float32 result once the block is left (ringx ends a block left by an exception,
    and waits for it as a block that returns does)."""
    x = torch.full((3,), float(dist.get_rank() + 1))
    cpu = torch.device("cpu")
    out = {}
    try:
        with dist._coalescing_manager(device=cpu):
            dist.reduce(x, dst=0)
            dist.reduce(torch.ones(3, dtype=torch.int64), dst=0)
        out["error"] = None
    except Exception as e:  # noqa: BLE001 - inspected by the parent
        out["error"] = (type(e).__name__, str(e))
    out["reduced"] = x
    return out


def coalescing_block_left_by_an_exception(raiser):
    """Inside `with dist._coalescing_manager(device=cpu)`: a broadcast from rank 0 and a
    float32 reduce to rank 0, then an exception leaves the block: from ringx when `raiser`
    is "ringx" (an int64 reduce, which cannot join the float32 one), from the block's own
    code when it is "user".  torch's manager would end neither block.  Outside the block:
    a broadcast from the last rank and an all_reduce, which must run at once.

    {"error": (type, text) that left the block, "block_broadcast", "block_reduce" (as
     they are once the block is left), "later_broadcast", "later_all_reduce"}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    cpu = torch.device("cpu")
    a = torch.full((4,), float(rank + 1))
    b = torch.full((3,), float(rank + 1))
    out = {"error": None}
    try:
        with dist._coalescing_manager(device=cpu):
            dist.broadcast(a, src=0)
            dist.reduce(b, dst=0)
            if raiser == "ringx":
                dist.reduce(torch.ones(3, dtype=torch.int64), dst=0)
            else:
                raise KeyError("the block's own code failed")
    except Exception as e:  # noqa: BLE001 - inspected by the parent
        out["error"] = (type(e).__name__, str(e))
    out["block_broadcast"], out["block_reduce"] = a.clone(), b.clone()
    c = torch.full((5,), float(rank + 1))
    dist.broadcast(c, src=ws - 1)
    d = torch.full((2,), float(rank + 1))
    dist.all_reduce(d)
    out["later_broadcast"], out["later_all_reduce"] = c, d
    return out


def coalescing_block_with_a_root_only_rejection():
    """On a fresh group of every rank, inside `with dist._coalescing_manager(device=cpu)`:
    a broadcast, then a gather whose root passes an output list of the wrong size (a
    check only the root makes).  The root's gather raises; the other ranks, whose block
    ends normally, must fail clearly too (told by the root), not hang, and no rank may
    crash.  The group is unusable afterwards by design and is destroyed.

    {"outcome": (type, text) of what the block raised, or None}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    cpu = torch.device("cpu")
    group = dist.new_group(list(range(ws)))
    out = {"outcome": None}
    try:
        with dist._coalescing_manager(group=group, device=cpu):
            dist.broadcast(torch.ones(3), src=0, group=group)
            dist.gather(torch.ones(2), dst=0, group=group,
                        gather_list=[torch.ones(3) for _ in range(ws)] if rank == 0 else None)
    except Exception as e:  # noqa: BLE001 - inspected by the parent
        out["outcome"] = (type(e).__name__, str(e))
    dist.distributed_c10d._world.pg_coalesce_state.pop(group, None)
    dist.destroy_process_group(group)
    return out


def batch_ring_exchange(seed, counts):
    """batch_isend_irecv: each rank sends one tensor per count to rank+1 and receives as
    many from rank-1, twice (sync wait on the returned works). Returns
    (number of Works returned, [received tensors])."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws

    def run(_):
        got, nworks = [], []
        for rnd in range(2):
            ops, recvs = [], []
            for i, c in enumerate(counts):
                s = refs.seed_for(seed, "bir", rnd, i)
                recvs.append(refs.perturb(torch.zeros(c)))
                ops.append(dist.P2POp(dist.irecv, recvs[-1], prv))
                ops.append(dist.P2POp(dist.isend, refs.make_input(s, rank, "float32", c), nxt))
            works = dist.batch_isend_irecv(ops)
            nworks.append(len(works))
            for w in works:
                w.wait()
            got.append(recvs)
        return (nworks, got)

    return refs.run_until_error(["batch_isend_irecv"], _closing_coalescing(run))


# ---------------------------------------------------------------- profiler records

def _record(backend, fn, profiler):
    """The events of `backend` ("ringx" or "gloo") that `profiler` ("autograd":
    torch.autograd.profiler.profile, "kineto": torch.profiler.profile) recorded while fn
    ran: [(name, input_shapes, count, is_async)] in order."""
    if profiler == "autograd":
        with torch.autograd.profiler.profile(record_shapes=True) as prof:
            fn()
        events = prof.function_events
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            fn()
        events = prof.events()
    prefix = backend + ":"
    return [(e.name[len(prefix):], [list(s) for s in e.input_shapes], e.count, e.is_async)
            for e in events if e.name.startswith(prefix)]


def _profiled_calls(rank, ws, group):
    """(name, fn) pairs, each one torch.distributed call on `group`."""
    t = lambda *s: torch.ones(*s)  # noqa: E731
    peer_ok = ws > 1
    calls = [
        ("all_reduce", lambda: dist.all_reduce(t(3, 4), group=group)),
        ("all_reduce_async", lambda: dist.all_reduce(t(3, 4), group=group, async_op=True).wait()),
        ("all_reduce_coalesced", lambda: dist.all_reduce_coalesced([t(2), t(3, 2)], group=group)),
        ("broadcast", lambda: dist.broadcast(t(3, 4), 0, group=group)),
        ("reduce", lambda: dist.reduce(t(3, 4), 0, group=group)),
        ("all_gather", lambda: dist.all_gather([t(3, 4) for _ in range(ws)], t(3, 4), group=group)),
        ("all_gather_into_tensor",
         lambda: dist.all_gather_into_tensor(t(3 * ws, 4), t(3, 4), group=group)),
        ("all_gather_coalesced",
         lambda: dist.all_gather_coalesced([[t(2), t(0), t(5)] for _ in range(ws)],
                                           [t(2), t(0), t(5)], group=group)),
        ("all_gather_into_tensor_coalesced", lambda: _ag_coalesced(ws, group)),
        ("gather", lambda: dist.gather(t(3, 4), [t(3, 4) for _ in range(ws)] if rank == 0 else None,
                                       0, group=group)),
        ("scatter", lambda: dist.scatter(t(3, 4), [t(3, 4) for _ in range(ws)] if rank == 0 else None,
                                         0, group=group)),
        ("all_to_all_single", lambda: dist.all_to_all_single(t(2 * ws, 3), t(2 * ws, 3), group=group)),
        ("all_to_all", lambda: dist.all_to_all([t(2) for _ in range(ws)], [t(2) for _ in range(ws)],
                                               group=group)),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(t(2), t(2 * ws), group=group)),
        ("reduce_scatter", lambda: dist.reduce_scatter(t(3), [t(3) for _ in range(ws)], group=group)),
        ("reduce_scatter_tensor_coalesced", lambda: _rs_coalesced(ws, group)),
        ("barrier", lambda: dist.barrier(group=group)),
        ("sparse_all_reduce", lambda: dist.all_reduce(t(4).to_sparse(), group=group)),
    ]
    if peer_ok:
        calls.append(("send_recv", lambda: _p2p(rank, group)))
        calls.append(("batch_isend_irecv", lambda: _batch(rank, ws, group)))
    return calls


def _ag_coalesced(ws, group):
    with dist._coalescing_manager(group=group):
        dist.all_gather_into_tensor(torch.ones(2 * ws), torch.ones(2), group=group)
        dist.all_gather_into_tensor(torch.ones(3 * ws), torch.ones(3), group=group)


def _rs_coalesced(ws, group):
    with dist._coalescing_manager(group=group):
        dist.reduce_scatter_tensor(torch.ones(2), torch.ones(2 * ws), group=group)
        dist.reduce_scatter_tensor(torch.ones(3), torch.ones(3 * ws), group=group)


def _batch(rank, ws, group):
    ops = [dist.P2POp(dist.isend, torch.ones(4), (rank + 1) % ws, group=group),
           dist.P2POp(dist.irecv, torch.ones(4), (rank - 1) % ws, group=group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def _p2p(rank, group):
    """send, recv from a named rank and recv from any source, sync and async, between
    ranks 0 and 1."""
    if rank == 0:
        dist.send(torch.ones(5), 1, group=group)
        dist.recv(torch.ones(6), 1, group=group)
        dist.recv(torch.ones(7), group=group)
        dist.irecv(torch.ones(8), 1, group=group).wait()
    elif rank == 1:
        dist.recv(torch.ones(5), 0, group=group)
        dist.send(torch.ones(6), 0, group=group)
        dist.send(torch.ones(7), 0, group=group)
        dist.isend(torch.ones(8), 0, group=group).wait()


def profiler_records(backends):
    """For each call of _profiled_calls, the events each backend in `backends` recorded
    ("ringx" on the default group, "gloo" on a gloo group of every rank).
    Returns {backend: {(profiler, call name): events}}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    out = {}
    for backend in backends:
        group = None if backend == harness.BACKEND else dist.new_group(list(range(ws)), backend=backend)
        recs = {}
        for profiler in ("autograd", "kineto"):
            for name, fn in _profiled_calls(rank, ws, group):
                try:
                    recs[(profiler, name)] = _record(backend, fn, profiler)
                except Exception as e:  # noqa: BLE001 - inspected by the parent
                    recs[(profiler, name)] = ("raised", type(e).__name__, str(e))
                dist.barrier()
        out[backend] = recs
        if group is not None:
            dist.destroy_process_group(group)
    return out
