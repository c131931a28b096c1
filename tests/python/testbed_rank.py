"""One rank of test_testbed.py, started by torchrun on a test-bed host: checks every
collective kind across hosts against closed forms, all_reduce over the ops, dtypes and
sizes the hierarchical algorithms cut differently (empty, fewer elements than ranks,
several shared-memory chunks, in flight together), all_gather and reduce_scatter on
tensors, and prints one line per rank (with its pid namespace). With --quick, only the
first part: all_reduce, all_gather, broadcast, gather and scatter at three sizes (for the
wide layouts, whose 8 ranks share 2 cores)."""

import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist

import ringx  # noqa: F401

dist.init_process_group("ringx", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
wrong = []
for count in (1, 1000, 300000):
    t = torch.full((count,), float(rank + 1))
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((count,), world * (world + 1) / 2)):
        wrong.append(f"all_reduce {count}")
    out = [torch.empty(count) for _ in range(world)]
    dist.all_gather(out, torch.full((count,), float(rank)))
    if any(not torch.equal(o, torch.full((count,), float(q))) for q, o in enumerate(out)):
        wrong.append(f"all_gather {count}")
    b = torch.full((count,), float(rank))
    dist.broadcast(b, src=world - 1)
    if not torch.equal(b, torch.full((count,), float(world - 1))):
        wrong.append(f"broadcast {count}")
    # gather and scatter through rank 1, host 0's second rank or host 1's first, with
    # separate tensors for the blocks.
    root = 1 % world
    got = [torch.empty(count) for _ in range(world)] if rank == root else None
    dist.gather(torch.full((count,), float(rank)), got, dst=root)
    if rank == root and any(not torch.equal(o, torch.full((count,), float(q))) for q, o in enumerate(got)):
        wrong.append(f"gather {count}")
    mine = torch.empty(count)
    dist.scatter(mine, [torch.full((count,), float(q)) for q in range(world)] if rank == root else None, src=root)
    if not torch.equal(mine, torch.full((count,), float(rank))):
        wrong.append(f"scatter {count}")


def inputs(count, dtype, r):
    return (torch.arange(count, dtype=torch.int64) % 13 + r + 1).to(dtype)


ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
       "product": dist.ReduceOp.PRODUCT, "avg": dist.ReduceOp.AVG}
quick = "--quick" in sys.argv[1:]
for count in () if quick else (0, 3, 1001, 600011):
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for name, op in ops.items():
            if name == "avg" and not dtype.is_floating_point:
                continue
            # Several calls in flight at once, each checked against the reference.
            pending = []
            for k in range(2):
                t = inputs(count, dtype, rank) + k
                pending.append((t, dist.all_reduce(t, op=op, async_op=True), k))
            for t, work, k in pending:
                work.wait()
                every = torch.stack([inputs(count, torch.float64, q) + k for q in range(world)])
                want = {"sum": every.sum(0), "max": every.max(0).values, "min": every.min(0).values,
                        "product": every.prod(0), "avg": every.mean(0)}[name]
                tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
                if not torch.allclose(t.double(), want, rtol=tol, atol=tol):
                    wrong.append(f"all_reduce {name} {dtype} {count}")
for count in () if quick else (1, 1001, 200003):
    flat = torch.empty(world * count)
    dist.all_gather_into_tensor(flat, torch.full((count,), float(rank)))
    if not torch.equal(flat, torch.arange(world, dtype=torch.float32).repeat_interleave(count)):
        wrong.append(f"all_gather_into_tensor {count}")
    for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX)):
        # Rank q's block b holds q * world + b everywhere.
        src = (torch.arange(world, dtype=torch.float32) + rank * world).repeat_interleave(count)
        out = torch.empty(count)
        dist.reduce_scatter_tensor(out, src, op=op)
        every = torch.tensor([q * world + rank for q in range(world)], dtype=torch.float64)
        want = {"sum": every.sum(), "avg": every.mean(), "max": every.max()}[name]
        if not torch.allclose(out.double(), torch.full((count,), want.item(), dtype=torch.float64)):
            wrong.append(f"reduce_scatter {name} {count}")
dist.barrier()
print(f"testbed rank {rank}/{world} on {socket.gethostname()}: {'ok' if not wrong else 'WRONG ' + ', '.join(wrong)} "
      f"({os.readlink('/proc/self/ns/pid')})", flush=True)
dist.destroy_process_group()
