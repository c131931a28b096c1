"""A peer that finished its part and exited: what it sent before it left is still received.

    finished_peer.py TIMEOUT_S

World 3. Rank 1 sends two small tensors to rank 0 (eager: its sends complete once the
data has left it) and exits at once, before rank 0 has posted its receives. Rank 0 keeps
an irecv from rank 2 pending meanwhile, so its engine watches its peers and sees rank 1's
death before it receives from rank 1. Once rank 1's process has gone and three peer
checks have passed, rank 0 receives both tensors from rank 1, then lets rank 2 send.
"""

import os
import sys
import time

import faultlib as common

TIMEOUT_S = float(sys.argv[1])


def gone(pid: int) -> bool:
    """Whether the process has exited (or is exiting: its stat line no longer says it runs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")


def body():
    import torch

    dist = common.setup(TIMEOUT_S)
    out = os.environ["FAULT_OUT"]
    if common.rank() == 1:
        dist.send(torch.full((4,), 7.0), dst=0, tag=1)
        dist.send(torch.arange(256, dtype=torch.float32), dst=0, tag=2)
        with open(os.path.join(out, "pid-1"), "w") as f:
            f.write(str(os.getpid()))
        common.record("sent")
        os._exit(0)
    if common.rank() == 2:
        common.file_barrier("received", [0, 2], timeout=60)
        common.attempt("send", lambda: dist.send(torch.full((2,), 5.0), dst=0, tag=3))
        common.finish(dist)
        return
    from_2 = torch.zeros(2)
    pending = dist.irecv(from_2, src=2, tag=3)
    pid_file = os.path.join(out, "pid-1")
    deadline = time.time() + 60
    while not (os.path.exists(pid_file) and open(pid_file).read()) and time.time() < deadline:
        time.sleep(0.01)
    pid = int(open(pid_file).read())
    while not gone(pid) and time.time() < deadline:
        time.sleep(0.01)
    common.record("peer_gone")
    time.sleep(0.3)
    small, large = torch.zeros(4), torch.zeros(256)
    common.attempt("recv_small", lambda: dist.recv(small, src=1, tag=1))
    common.attempt("recv_large", lambda: dist.recv(large, src=1, tag=2))
    common.record("received", small=small.tolist(), large_ok=bool(torch.equal(large, torch.arange(256.0))))
    common.file_barrier("received", [0, 2], timeout=60)
    common.attempt("pending", pending.wait)
    common.finish(dist, destroy=False)


if __name__ == "__main__":
    common.main(body)
