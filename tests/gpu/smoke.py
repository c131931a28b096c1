"""A first look at ringx on a GPU machine, one stage at a time, before tests/gpu.

Run under torchrun (2 ranks sharing the GPU are enough). Each rank prints a line
per stage as it passes it, with faulthandler on, so a rank that dies shows how
far it got and where: the first GPU run crashed inside init_process_group, and
the suite's own report said only "rank died". Exits non-zero on a wrong result.
"""

import datetime
import faulthandler
import os
import sys

faulthandler.enable()
RANK = os.environ.get("RANK", "?")


def say(*what):
    sys.stderr.write(" ".join([f"[rank {RANK}]"] + [str(w) for w in what]) + "\n")
    sys.stderr.flush()


import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

say("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
import ringx  # noqa: E402
from ringx import _build_info  # noqa: E402

say("ringx from", ringx.__file__, "built with CUDA", _build_info.cuda)

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
gpu = torch.cuda.is_available() and _build_info.cuda
kwargs = {}
if gpu:
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    kwargs["device_id"] = dev
    say("device", dev, torch.cuda.get_device_name(dev))
dist.init_process_group("ringx", timeout=datetime.timedelta(seconds=60), **kwargs)
say("init_process_group passed")

wrong = []


def expect(name, got, want):
    if not torch.equal(got.cpu(), want):
        wrong.append(name)
        say("WRONG", name, got.flatten()[:4].tolist(), "want", want.flatten()[:4].tolist())
    else:
        say("ok", name)


def all_reduce_on(device, count):
    x = torch.full((count,), float(rank + 1), device=device)
    dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    expect(f"all_reduce {device.type} {count * 4} B", x, torch.full((count,), float(size * (size + 1) // 2)))


def all_gather_on(device, count):
    out = torch.empty(size * count, device=device)
    dist.all_gather_into_tensor(out, torch.full((count,), float(rank), device=device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    expect(f"all_gather {device.type} {count * 4} B", out,
           torch.arange(size, dtype=torch.float32).repeat_interleave(count))


for device in [torch.device("cpu")] + ([dev] if gpu else []):
    all_reduce_on(device, 4)
    all_gather_on(device, 8)
    all_reduce_on(device, 1 << 22)
dist.destroy_process_group()
say("done", "with wrong results: " + ", ".join(wrong) if wrong else "all right")
sys.exit(1 if wrong else 0)
