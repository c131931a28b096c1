"""Each rank makes exactly one CUDA context, on its own device (issue 41).

Run under torchrun on a GPU machine (tests/gpu/device_run.sh does). Every rank
binds cuda:(LOCAL_RANK mod GPUs), runs asynchronous collectives whose events
ringx's own threads poll and whose buffers its callback threads release (the
threads that made stray contexts on GPU 0 before they set the group's device),
then, with every rank still alive:

- asks the driver which devices have an active primary context in this
  process (cuDevicePrimaryCtxGetState): only its own may;
- rank 0 lists the GPU's compute processes (nvidia-smi): every rank's pid must
  appear exactly once, on the rank's own device.

Prints one line per problem and exits non-zero if there is any.
"""

import ctypes
import datetime
import json
import os
import shutil
import subprocess
import sys

import torch
import torch.distributed as dist

import ringx  # noqa: F401 - registers the backend


def active_devices():
    """The devices with an active primary context in this process."""
    cuda = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    active = []
    for ordinal in range(count.value):
        dev, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), ordinal)
        cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(on))
        if on.value:
            active.append(ordinal)
    return active


def compute_processes():
    """{pid: [GPU bus ids]} from nvidia-smi, or None without it."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = subprocess.run([smi, "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout
    found = {}
    for line in out.splitlines():
        pid, bus = [x.strip() for x in line.split(",")[:2]]
        found.setdefault(int(pid), []).append(bus)
    return found


def pci_bus(index):
    """The device's PCI bus number, as nvidia-smi's bus id holds it, or None
    where this torch does not say."""
    return getattr(torch.cuda.get_device_properties(index), "pci_bus_id", None)


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    index = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()
    dev = torch.device("cuda", index)
    torch.cuda.set_device(dev)
    dist.init_process_group("ringx", device_id=dev, timeout=datetime.timedelta(seconds=60))
    problems = []
    # Asynchronous calls nobody waits on with the host: ringx's progress
    # thread polls their events, its callback threads release them.
    works = [dist.all_reduce(torch.ones(1 << k, device=dev), async_op=True) for k in range(4, 22, 3)]
    works.append(dist.all_gather_into_tensor(torch.empty(size * 1024, device=dev),
                                             torch.ones(1024, device=dev), async_op=True))
    fut = dist.all_reduce(torch.ones(8, device=dev), async_op=True).get_future()
    fut.then(lambda f: f.value()[0] * 2).wait()
    for w in works:
        w.wait()
    torch.cuda.synchronize()
    dist.barrier()

    mine = active_devices()
    if mine != [index]:
        problems.append(f"rank {rank}: active primary contexts on devices {mine}, want only [{index}]")
    pids = [None] * size
    dist.all_gather_object(pids, (os.getpid(), pci_bus(index)))
    if rank == 0:
        procs = compute_processes()
        if procs is None:
            print("contexts.py: no nvidia-smi here; the per-process driver check alone ran")
        else:
            for r, (pid, bus) in enumerate(pids):
                seen = procs.get(pid, [])
                if len(seen) != 1:
                    problems.append(f"rank {r} (pid {pid}): {len(seen)} compute contexts in nvidia-smi, want 1")
                elif bus is not None and int(seen[0].split(":")[1], 16) != bus:
                    problems.append(f"rank {r} (pid {pid}): its context is on GPU {seen[0]}, not on its own "
                                    f"device (bus {bus:02x})")
            print("contexts.py: nvidia-smi compute processes:", json.dumps(procs))
    dist.barrier()
    dist.destroy_process_group()
    for p in problems:
        print("contexts.py: PROBLEM", p, flush=True)
    print(f"contexts.py: rank {rank}: devices with a context {mine}", flush=True)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
