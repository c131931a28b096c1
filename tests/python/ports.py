"""TCP ports for the rendezvous of the processes the tests and benchmarks start."""

import random
import socket


def free_ports(n: int) -> list[int]:
    """n free ports below the kernel's ephemeral range, different from each other (each
    stays bound until all are picked): a port the kernel handed out (bind to 0) can be
    taken again as the source port of some outgoing connection (UCX's TCP transport
    makes many) before the TCPStore binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    socks = []
    try:
        for port in candidates:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            if len(socks) == n:
                return [t.getsockname()[1] for t in socks]
        raise RuntimeError("no free ports below the ephemeral range")
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
