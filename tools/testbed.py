"""A multi-host test bed on one machine, for ringx's many-host paths.

    python tools/testbed.py --hosts 2 --ranks-per-host 2 --rate 1gbit -- examples/ddp_train.py --steps 20
    make testbed                                  # the same, with the DDP example

Each "host" is a network, pid, mount and UTS namespace of its own, with a /dev/shm of
its own (a fresh tmpfs), so ringx and UCX see different machines: no shared memory
between hosts, traffic over TCP, a peer's death seen through the network. In the
"containers" layout each rank runs in a container of its own (tools/testbed_container.py:
a pid namespace and /proc of its own, the host's network namespace and /dev/shm), under
a torchrun of its own with static rendezvous, as launchers that run one rank per
container do. The hosts hang off a bridge that lives in a switch namespace
of its own; each host's link can be shaped with `tc tbf` (both directions), so
everything crossing hosts goes through a link of the given rate. torchrun runs in each
host (`--nnodes H --nproc-per-node P --rdzv-backend c10d`, host 0 holding the
rendezvous store), as it would on a cluster. All traffic stays inside these namespaces.

Everything is removed on every exit path: normal end, error, timeout, SIGINT or
SIGTERM. Inside a pid namespace the first process is PID 1 and ignores signals it has
no handler for, so ranks are stopped by killing the namespace's init (`unshare
--kill-child`), never by a signal sent from inside. Needs root and iproute2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

RDZV_PORT = 29400
LAYOUTS = ("hosts", "containers")
CONTAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testbed_container.py")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Testbed:
    """H hosts on a bridge; `with Testbed(2, rate="1gbit") as tb: tb.torchrun(...)`."""

    def __init__(self, hosts: int, rate: str | None = None, burst: str = "256kb", latency: str = "50ms"):
        if hosts < 1 or hosts > 200:
            raise ValueError(f"testbed: {hosts} hosts; choose 1 to 200")
        if os.geteuid() != 0:
            raise PermissionError("testbed: network and pid namespaces need root")
        if not shutil.which("ip") or not shutil.which("tc"):
            raise FileNotFoundError("testbed: iproute2 (ip, tc) is missing; `make sysdeps` installs it")
        tag = f"tb{os.getpid() % 100000}"
        self.hosts, self.rate, self.burst, self.latency = hosts, rate, burst, latency
        self.switch = f"{tag}s"
        self.names = [f"{tag}h{i}" for i in range(hosts)]
        self.ports = [f"{tag}p{i}" for i in range(hosts)]
        subnet = f"10.78.{os.getpid() % 250}"
        self.addresses = [f"{subnet}.{i + 1}" for i in range(hosts)]
        self._made: list[str] = []

    def __enter__(self) -> "Testbed":
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc) -> bool:
        self.destroy()
        return False

    def _create(self) -> None:
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, port) in enumerate(zip(self.names, self.ports)):
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", port, "type", "veth", "peer", "name", f"{port}x")
            _ip("link", "set", port, "netns", self.switch)
            _ip("link", "set", f"{port}x", "netns", ns)
            _ip("-n", ns, "link", "set", f"{port}x", "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            if self.rate:
                # Egress of both ends: what the host sends, and what the switch sends it.
                for where, dev in ((ns, "eth0"), (self.switch, port)):
                    subprocess.run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                                    "burst", self.burst, "latency", self.latency], check=True, capture_output=True)

    def kill_host(self, host: int) -> None:
        """SIGKILLs every process of one host at once, as when a machine dies."""
        pids = subprocess.run(["ip", "netns", "pids", self.names[host]], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill_rank(self, rank: int) -> None:
        """SIGKILLs the processes of one rank (torchrun's RANK), from outside every pid
        namespace: a rank that is PID 1 of its own ignores a SIGKILL sent from inside."""
        for ns in self.names:
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if f"RANK={rank}".encode() in f.read().split(b"\0"):
                            os.kill(int(pid), signal.SIGKILL)
                except (FileNotFoundError, ProcessLookupError):
                    pass

    def link_down(self, host: int) -> None:
        """Takes one host's link down without a word to either end, as a pulled cable."""
        _ip("-n", self.names[host], "link", "set", "eth0", "down")

    def destroy(self) -> None:
        """Deletes the namespaces (and with them the links and shaping); safe to call twice."""
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made = []

    def torchrun(self, ranks_per_host: int | list[int], script: str, args: list[str] | None = None,
                 env: dict[str, str] | None = None, timeout: float = 600.0,
                 torchrun: str | None = None,
                 done: Callable[[], bool] | None = None,
                 layout: str = "hosts") -> tuple[list[int | None], list[str]]:
        """Runs `script` under torchrun on every host; returns (exit codes, logs) per host.

        An exit code of None means the host's ranks were still running at `timeout`, or
        when `done()` first returned True, and were killed. `ranks_per_host` may list a
        number per host (uneven hosts). `layout` is "hosts" (torchrun per host, a host's
        ranks in its pid namespace) or "containers" (torchrun per rank, each in a pid
        namespace of its own: LOCAL_WORLD_SIZE is 1 there)."""
        per_host = ranks_per_host if isinstance(ranks_per_host, list) else [ranks_per_host] * self.hosts
        if len(per_host) != self.hosts:
            raise ValueError(f"testbed: {len(per_host)} rank counts for {self.hosts} hosts")
        if layout not in LAYOUTS:
            raise ValueError(f"testbed: layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
        torchrun = torchrun or os.path.join(os.path.dirname(sys.executable), "torchrun")
        out = tempfile.mkdtemp(prefix="ringx-testbed-")
        env = dict(os.environ, **(env or {}))
        # The hosts share this machine's cores. torchrun sets OMP_NUM_THREADS=1 only
        # where it starts several ranks: a host of one rank, or a container of one,
        # got OpenMP threads that spun on the cores the others needed (libgomp was 27%
        # of the machine's samples, the containers layout 2.6x slower than "hosts").
        env.setdefault("OMP_NUM_THREADS", "1")
        procs = []
        try:
            world = sum(per_host)
            for i, ns in enumerate(self.names):
                # The host's own /dev/shm: ranks find their host mates by what they can map there.
                shell = f"mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname host{i} && "
                if layout == "containers":
                    # One torchrun per rank, each in a container of its own (static rendezvous,
                    # so rank numbers follow hosts), as launchers that run one rank per
                    # container do: a rank's death ends its container only.
                    host_ns = ["unshare", "--uts", "--mount", "--fork", "--kill-child"]
                    first = sum(per_host[:i])
                    starts = []
                    for node in range(first, first + per_host[i]):
                        cmd = [sys.executable, CONTAINER, torchrun, f"--nnodes={world}", f"--node-rank={node}",
                               "--nproc-per-node=1", f"--master-addr={self.addresses[0]}",
                               f"--master-port={RDZV_PORT}", f"--local-addr={self.addresses[i]}", script,
                               *(args or [])]
                        starts.append(" ".join(_quote(c) for c in cmd) + " & pids=\"$pids $!\"")
                    shell += "; ".join(starts) + "; rc=0; for p in $pids; do wait $p || rc=$?; done; exit $rc"
                else:
                    host_ns = ["unshare", "--pid", "--uts", "--mount-proc", "--fork", "--kill-child"]
                    cmd = [torchrun, f"--nnodes={self.hosts}", f"--nproc-per-node={per_host[i]}",
                           "--rdzv-backend=c10d", f"--rdzv-endpoint={self.addresses[0]}:{RDZV_PORT}",
                           "--rdzv-id=testbed", f"--rdzv-conf=is_host={1 if i == 0 else 0}",
                           f"--local-addr={self.addresses[i]}", script, *(args or [])]
                    shell += "exec " + " ".join(_quote(c) for c in cmd)
                log = open(os.path.join(out, f"host{i}.log"), "w")
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns, *host_ns, "sh", "-c", shell], env=env, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True))
                log.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                if done is not None and done():
                    break
                time.sleep(0.1)
            codes = [p.poll() for p in procs]
            logs = []
            for i in range(self.hosts):
                with open(os.path.join(out, f"host{i}.log"), errors="replace") as f:
                    logs.append(f.read())
            return codes, logs
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            shutil.rmtree(out, ignore_errors=True)


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _stop_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--rate", default=None, help="shape every host's link to this tc rate (e.g. 1gbit)")
    ap.add_argument("--layout", choices=LAYOUTS, default="hosts",
                    help="hosts: a host's ranks share its pid namespace; containers: a pid namespace per rank")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds before the ranks are killed")
    ap.add_argument("script", help="the training script torchrun runs on every host")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    with Testbed(a.hosts, rate=a.rate) as tb:
        print(f"testbed: {a.hosts} hosts x {a.ranks_per_host} ranks, addresses {', '.join(tb.addresses)}, "
              f"links {a.rate or 'unshaped'}", flush=True)
        codes, logs = tb.torchrun(a.ranks_per_host, a.script, args, timeout=a.timeout, layout=a.layout)
    for i, (code, log) in enumerate(zip(codes, logs)):
        state = "killed at the timeout" if code is None else f"exit {code}"
        print(f"===== host{i} ({state})\n{log}", flush=True)
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
