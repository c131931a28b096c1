"""One rank of test_testbed.py, started by torchrun on a test-bed host: checks every
collective kind across hosts against closed forms and prints one line per rank."""

import datetime
import os
import socket

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
dist.barrier()
print(f"testbed rank {rank}/{world} on {socket.gethostname()}: {'ok' if not wrong else 'WRONG ' + ', '.join(wrong)}",
      flush=True)
dist.destroy_process_group()
