"""One rank of test_testbed_faults.py: all_reduces across the test bed until a fault
ends them, then records what it raised and when (wall clock, which the hosts share)."""

import datetime
import json
import os
import time

import torch
import torch.distributed as dist

import ringx  # noqa: F401

out = os.environ["FAULT_DIR"]
# Start-up waits on every rank's interpreter, slow on a loaded machine; the faults
# are timed against the group's operations' timeout, set once every rank is in.
dist.init_process_group("ringx", timeout=datetime.timedelta(seconds=60))
dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=float(os.environ["FAULT_TIMEOUT_S"])))
rank, world = dist.get_rank(), dist.get_world_size()
# 1 MiB crosses the link in several packets: the fault usually lands mid-transfer.
t = torch.ones(1 << 18)
dist.all_reduce(t)
open(os.path.join(out, f"ready.{rank}"), "w").close()
result = {"rank": rank, "error": None, "calls": 0}
stop = time.time() + 120
try:
    # Idle first (no collective in flight: only keepalive can notice a silent peer).
    time.sleep(float(os.environ.get("FAULT_IDLE_S", "0")))
    while time.time() < stop:
        t.fill_(1.0)
        dist.all_reduce(t)
        if t[0].item() != world:
            result["error"] = f"WRONG RESULT {t[0].item()}"
            break
        result["calls"] += 1
except Exception as e:  # noqa: BLE001 - the error is what the test checks
    result["error"] = f"{type(e).__name__}: {e}"
result["at"] = time.time()
if os.environ.get("FAULT_SHRINK"):
    # Go on without the dead: shrink the default group, then all_reduce on it and on a
    # group made from it (whose store is the survivors').
    try:
        dist.shrink_group([int(r) for r in os.environ["FAULT_SHRINK"].split(",")])
        t = torch.ones(4)
        dist.all_reduce(t)
        sub = dist.new_group(list(range(dist.get_world_size())))
        dist.all_reduce(t, group=sub)
        result["shrunk"] = {"size": dist.get_world_size(), "sum": t[0].item(), "seconds": time.time() - result["at"]}
    except Exception as e:  # noqa: BLE001
        result["shrunk"] = {"error": f"{type(e).__name__}: {e}"}
with open(os.path.join(out, f"result.{rank}.tmp"), "w") as f:
    json.dump(result, f)
os.rename(os.path.join(out, f"result.{rank}.tmp"), os.path.join(out, f"result.{rank}"))
# Teardown would wait on the dead host through torch's store: the test is about
# the collective's error, so leave at once.
os._exit(0)
