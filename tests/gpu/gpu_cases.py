"""Per-rank bodies of tests/gpu (run inside gpu_world's processes).

Each returns a list of problems; each checks CUDA results against a reference
computed on the CPU from every rank's input, rebuilt with make_input.
"""

import functools

import torch
import torch.distributed as dist

from gpu_world import device, make_input

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
ALL_DTYPES = FLOATS + INTS + [torch.bool]
# Odd counts leave a scalar tail after the 16-byte packs; the large one spans
# many blocks of every launch.
COUNTS = [1, 7, 4099, 262147]
PREMUL_FACTOR = 0.5


def _ops_for(dtype):
    ops = ["SUM", "PRODUCT", "MIN", "MAX"]
    if dtype.is_floating_point:
        ops += ["AVG", "PREMUL_SUM"]
    else:
        ops += ["BAND", "BOR", "BXOR"]
    return ops


def _dist_op(name):
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, name)


def _reference(inputs, op, dtype):
    """op over the ranks' CPU inputs, floats in float64, ints wrapping in their own type."""
    xs = [x.double() if dtype.is_floating_point else x for x in inputs]
    if dtype == torch.bool:
        fold = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
                "PRODUCT": torch.logical_and, "MIN": torch.logical_and, "BAND": torch.logical_and,
                "BXOR": torch.logical_xor}[op]
        return functools.reduce(fold, xs)
    if op == "PREMUL_SUM":
        xs = [x * PREMUL_FACTOR for x in xs]
    fold = {"SUM": torch.add, "AVG": torch.add, "PREMUL_SUM": torch.add, "PRODUCT": torch.mul,
            "MIN": torch.minimum, "MAX": torch.maximum, "BAND": torch.bitwise_and,
            "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
    out = functools.reduce(fold, xs)
    if op == "AVG":
        out = out / len(xs)
    return out.to(dtype)


def _compare(problems, what, got, want):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        problems.append(f"{what}: got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}")
        return
    # 16-bit floats round at every step of a ring; the others are exact here
    # but for AVG's division.
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(want.dtype, 1e-6)
    if want.dtype.is_floating_point:
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if not ok:
        bad = (got.double() - want.double()).abs().argmax().item() if want.numel() else 0
        problems.append(f"{what}: wrong, e.g. [{bad}] = {got.flatten()[bad].item()}, "
                        f"want {want.flatten()[bad].item()}")


def all_reduce_matrix(seed):
    problems = []
    n, rank = dist.get_world_size(), dist.get_rank()
    for dtype in ALL_DTYPES:
        for op in _ops_for(dtype):
            for count in COUNTS:
                inputs = [make_input(seed, r, dtype, count) for r in range(n)]
                x = inputs[rank].to(device(), copy=True)
                dist.all_reduce(x, op=_dist_op(op))
                _compare(problems, f"all_reduce {op} {dtype} x{count}", x, _reference(inputs, op, dtype))
    # A view whose data does not start on a 16-byte boundary.
    inputs = [make_input(seed, r, torch.float16, 1001) for r in range(n)]
    base = torch.zeros(1002, dtype=torch.float16, device=device())
    base[1:].copy_(inputs[rank])
    dist.all_reduce(base[1:])
    _compare(problems, "all_reduce SUM float16 misaligned view", base[1:], _reference(inputs, "SUM", torch.float16))
    return problems


def data_movement(seed):
    problems = []
    n, rank, dev = dist.get_world_size(), dist.get_rank(), device()
    for dtype in [torch.float32, torch.bfloat16, torch.int64]:
        for count in [1, 4099]:
            inputs = [make_input(seed, r, dtype, count) for r in range(n)]
            mine = inputs[rank].to(dev)
            tag = f"{dtype} x{count}"

            root = n - 1
            x = mine.clone()
            dist.broadcast(x, src=root)
            _compare(problems, f"broadcast {tag}", x, inputs[root])

            x = mine.clone()
            dist.reduce(x, dst=root, op=dist.ReduceOp.SUM)
            if rank == root:
                _compare(problems, f"reduce {tag}", x, _reference(inputs, "SUM", dtype))

            outs = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(outs, mine)
            for r in range(n):
                _compare(problems, f"all_gather {tag} [{r}]", outs[r], inputs[r])

            out = torch.empty(n * count, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, mine)
            _compare(problems, f"all_gather_into_tensor {tag}", out, torch.cat(inputs))

            big = [make_input(seed + 1, r, dtype, n * count) for r in range(n)]
            out = torch.empty(count, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(out, big[rank].to(dev))
            want = _reference(big, "SUM", dtype)[rank * count:(rank + 1) * count]
            _compare(problems, f"reduce_scatter_tensor {tag}", out, want)

            out = torch.empty(n * count, dtype=dtype, device=dev)
            dist.all_to_all_single(out, big[rank].to(dev))
            want = torch.cat([big[r][rank * count:(rank + 1) * count] for r in range(n)])
            _compare(problems, f"all_to_all_single {tag}", out, want)

            # Uneven splits: rank r sends r + 1 + j elements to rank j.
            sends = [rank + 1 + j for j in range(n)]
            recvs = [r + 1 + rank for r in range(n)]
            src = make_input(seed + 2, rank, dtype, sum(sends), dev)
            out = torch.empty(sum(recvs), dtype=dtype, device=dev)
            dist.all_to_all_single(out, src, output_split_sizes=recvs, input_split_sizes=sends)
            pieces = []
            for r in range(n):
                theirs = make_input(seed + 2, r, dtype, sum(r + 1 + j for j in range(n)))
                start = sum(r + 1 + j for j in range(rank))
                pieces.append(theirs[start:start + r + 1 + rank])
            _compare(problems, f"all_to_all_single uneven {tag}", out, torch.cat(pieces))

            # The same exchange through the list form: split views of one tensor each way
            # (read and written in place), then separate tensors (packed).
            out = torch.empty(sum(recvs), dtype=dtype, device=dev)
            dist.all_to_all(list(out.split(recvs)), list(src.split(sends)))
            _compare(problems, f"all_to_all list of views {tag}", out, torch.cat(pieces))
            outs = [torch.empty(k, dtype=dtype, device=dev) for k in recvs]
            dist.all_to_all(outs, [t.clone() for t in src.split(sends)])
            _compare(problems, f"all_to_all list of tensors {tag}", torch.cat(outs), torch.cat(pieces))

            outs = [torch.empty_like(mine) for _ in range(n)] if rank == root else None
            dist.gather(mine, outs, dst=root)
            if rank == root:
                for r in range(n):
                    _compare(problems, f"gather {tag} [{r}]", outs[r], inputs[r])

            x = torch.empty_like(mine)
            dist.scatter(x, [t.to(dev) for t in inputs] if rank == root else None, src=root)
            _compare(problems, f"scatter {tag}", x, inputs[rank])

            # A ring of send/recv, even ranks sending first.
            x = torch.empty_like(mine)
            nxt, prv = (rank + 1) % n, (rank - 1) % n
            if rank % 2 == 0:
                dist.send(mine, nxt)
                dist.recv(x, prv)
            else:
                dist.recv(x, prv)
                dist.send(mine, nxt)
            _compare(problems, f"send/recv {tag}", x, inputs[prv])
    dist.barrier()
    return problems


def pending_caller_stream(seed):
    """The caller's stream still has a long kernel, then the fill of the
    input, queued when the collective is issued; its result is used on the
    same stream after wait(); the host synchronises only at the end."""
    problems = []
    n, rank, dev = dist.get_world_size(), dist.get_rank(), device()
    count = 1 << 20
    inputs = [make_input(seed, r, torch.float32, count) for r in range(n)]
    staged = inputs[rank].to(dev)
    x = torch.full((count,), -1000.0, device=dev)
    a = torch.randn(4096, 4096, device=dev)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(4):
            a = a @ a / 64  # keeps the stream busy for a while before the fill
        x.copy_(staged)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        y = x * 2 + 1
    side.synchronize()
    _compare(problems, "all_reduce behind a pending kernel, used after wait()", y,
             _reference(inputs, "SUM", torch.float32) * 2 + 1)
    return problems


def two_streams(seed):
    """Two collectives back to back, each issued from its own stream, each
    result used on its stream after wait(), one host synchronisation."""
    problems = []
    n, rank, dev = dist.get_world_size(), dist.get_rank(), device()
    count = 65537
    ins = {k: [make_input(seed + k, r, torch.float32, count) for r in range(n)] for k in (1, 2)}
    streams = {k: torch.cuda.Stream() for k in (1, 2)}
    xs, ys, works = {}, {}, {}
    for k in (1, 2):
        with torch.cuda.stream(streams[k]):
            xs[k] = ins[k][rank].to(dev, non_blocking=True)
            works[k] = dist.all_reduce(xs[k], async_op=True)
    for k in (1, 2):
        with torch.cuda.stream(streams[k]):
            works[k].wait()
            ys[k] = xs[k] + k
    torch.cuda.synchronize()
    for k in (1, 2):
        _compare(problems, f"all_reduce {k} of 2 on its own stream", ys[k], _reference(ins[k], "SUM", torch.float32) + k)
    return problems


def ddp_step(seed, hook):
    """One DDP step on a CUDA module, gradients against their mean computed
    on the CPU from every rank's batch."""
    import ringx.hooks

    problems = []
    n, rank, dev = dist.get_world_size(), dist.get_rank(), device()

    def model():
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

    def batch(r):
        g = torch.Generator().manual_seed(seed * 100 + r)
        return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)

    ddp = torch.nn.parallel.DistributedDataParallel(model().to(dev), device_ids=[dev.index])
    if hook is not None:
        ddp.register_comm_hook(None, getattr(ringx.hooks, hook))
    x, t = batch(rank)
    torch.nn.functional.mse_loss(ddp(x.to(dev)), t.to(dev)).backward()

    grads = []
    for r in range(n):
        m = model()
        x, t = batch(r)
        torch.nn.functional.mse_loss(m(x), t).backward()
        grads.append([p.grad for p in m.parameters()])
    for i, p in enumerate(ddp.module.parameters()):
        want = sum(g[i] for g in grads) / n
        tol = 2e-2 if hook and "16" in hook else 1e-5
        if not torch.allclose(p.grad.cpu(), want, rtol=tol, atol=tol):
            problems.append(f"DDP ({hook or 'no hook'}) gradient {i} differs from the CPU mean")
    return problems


def routed_to_ringx(seed):
    """The group's CUDA backend is ringx, and it reduces a CUDA tensor."""
    problems = []
    n, rank, dev = dist.get_world_size(), dist.get_rank(), device()
    backend = type(dist.group.WORLD._get_backend(dev)).__name__
    if backend != "ProcessGroupRingx":
        problems.append(f"CUDA tensors go to {backend}, not ringx")
    inputs = [make_input(seed, r, torch.float32, 1000) for r in range(n)]
    x = inputs[rank].to(dev, copy=True)
    dist.all_reduce(x)
    _compare(problems, "all_reduce on cuda", x, _reference(inputs, "SUM", torch.float32))
    y = inputs[rank].clone()
    dist.all_reduce(y)
    _compare(problems, "all_reduce on cpu", y, _reference(inputs, "SUM", torch.float32))
    return problems


def ipc_taken(seed, log_path):
    """RINGX_CUDA_PATH=ipc with RINGX_DEBUG=INFO: the group sets the ipc path
    up at its first collective, all_reduce takes it (one-shot small; from 3
    ranks two-shot at 1 MiB and the ring at 4 MiB, as the cost model's
    constants have it in ipc_cost.cc), and the calls it does not cover say so and run
    staged; every result against the CPU. The INFO log (stderr) goes to
    `log_path` + the rank, read back here."""
    import os

    problems = []
    n, rank, dev = dist.get_world_size(), dist.get_rank(), device()
    path = f"{log_path}.{rank}"
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
    try:
        for count in [7, 1 << 18, 1 << 20]:
            inputs = [make_input(seed, r, torch.float32, count) for r in range(n)]
            x = inputs[rank].to(dev, copy=True)
            dist.all_reduce(x)
            _compare(problems, f"ipc all_reduce x{count}", x, _reference(inputs, "SUM", torch.float32))
        sends = [rank + 1 + j for j in range(n)]
        recvs = [r + 1 + rank for r in range(n)]
        src = make_input(seed + 1, rank, torch.int64, sum(sends), dev)
        out = torch.empty(sum(recvs), dtype=torch.int64, device=dev)
        dist.all_to_all_single(out, src, output_split_sizes=recvs, input_split_sizes=sends)
        pieces = []
        for r in range(n):
            theirs = make_input(seed + 1, r, torch.int64, sum(r + 1 + j for j in range(n)))
            start = sum(r + 1 + j for j in range(rank))
            pieces.append(theirs[start:start + r + 1 + rank])
        _compare(problems, "uneven all_to_all_single (staged)", out, torch.cat(pieces))
        torch.cuda.synchronize()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    with open(path) as f:
        log = f.read()
    wanted = ["the ipc path is set up", "algorithm ipc_one_shot", "host-staged (not ipc: all_to_all with split sizes)"]
    if n >= 3:
        wanted += ["algorithm ipc_two_shot", "algorithm ipc_ring"]
    for w in wanted:
        if w not in log:
            problems.append(f"the INFO log lacks {w!r}:\n{log}")
    return problems
