"""TCP ports for the rendezvous of the processes the tests start."""

import random
import socket


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a port the kernel handed out
    (bind to 0) can be taken again as the source port of some outgoing connection
    (UCX's TCP transport makes many) before the TCPStore binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")
