#!/usr/bin/env python3
"""all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, gather and scatter
across hosts on the namespace test bed (tools/testbed.py): ringx's hierarchical algorithms against its flat ones and
gloo, and against the link's bound; barrier beside them.

    python benchmarks/testbed.py                        # 2 hosts x 2 ranks, 1gbit links
    python benchmarks/testbed.py --hosts 4 --ranks-per-host 1
    python benchmarks/testbed.py --layout 3,1             # uneven hosts
    python benchmarks/testbed.py --layout 4x2 --sizes 4KiB,64MiB --no-flat   # H x P hosts
    python benchmarks/testbed.py --containers             # a pid namespace per rank
    python benchmarks/testbed.py --collectives broadcast --root 0
    python benchmarks/testbed.py --json docs/bench/testbed.json

Each configuration runs in the same torchrun job: the default group is ringx with its
own choice (the cost model: hierarchical where it applies), and further groups over the
same ranks force a flat algorithm through RINGX_ALGO (ring, rabenseifner) or use gloo.
Before every call the ranks meet in a barrier on a separate gloo group; below 64 KiB
(and for barrier itself) the call is the mean of 20 back to back after it, since one
such call lasts about as long as that barrier's skew. A call's time is the slowest
rank's, and the table gives the median over --iters calls (p10-p90 beside it). The
configurations take turns call by call, so drift falls on all alike.

Sizes are the whole buffer: all_reduce's, all_gather's output, reduce_scatter's
input. The link rate is measured, not assumed: before the job, one TCP stream each
way between host 0 and host 1 at once, through the same shaped links. The bound is
the bytes that must cross one host's link each way over that rate: 2 (H-1)/H N for
all_reduce (each host's partial sum out, the total back), N for broadcast (into every
host but the root's), (n-L)/n N for gather and scatter (everything but the root host's
own L blocks, through its link), L (n-L)/n N for all_to_all on the host of L ranks
whose link carries most, (H-1)/H N for the others. broadcast's, gather's and scatter's
root is --root (default 1: on 2 x 2 hosts the flat binomial tree from it crosses the
root host's link twice).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20, "64MiB": 64 << 20}
DEFAULT_SIZES = "4KiB,1MiB,64MiB"
BARRIERS = 20  # per timed barrier call: their mean
# Calls below this size are timed back to back, BACK_TO_BACK at a time (their
# mean): one 4 KiB call takes about as long as the skew of the gloo barrier
# before it (hundreds of microseconds across hosts), which timed alone would
# measure that barrier as much as the call.
BACK_TO_BACK, BACK_TO_BACK_BELOW = 20, 64 << 10
# The flat algorithms forced for comparison (RINGX_ALGO), and which collective each serves.
FLAT = {"ringx ring": "ring", "ringx rabenseifner": "all_reduce:rabenseifner",
        "ringx dissemination": "barrier:dissemination",
        "ringx binomial": "broadcast:binomial,gather:binomial,scatter:binomial",
        "ringx direct": "gather:direct,scatter:direct"}
FLAT_FOR = {"all_reduce": ["ringx ring", "ringx rabenseifner"], "all_gather": ["ringx ring"],
            "reduce_scatter": ["ringx ring"], "barrier": ["ringx dissemination"], "broadcast": ["ringx binomial"],
            "all_to_all": [], "gather": ["ringx binomial", "ringx direct"],
            "scatter": ["ringx binomial", "ringx direct"]}
COLLECTIVES = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all,gather,scatter,barrier"

_STREAM = r"""
import socket, sys, time
role, addr, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
chunk = memoryview(bytearray(1 << 20))
if role == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 29555)); s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept(); got = 0
    while got < nbytes:
        n = c.recv_into(chunk); got += n
        if not n: break
    c.sendall(b"x"); print(got, flush=True)
else:
    for _ in range(100):
        try:
            c = socket.create_connection((addr, 29555)); break
        except OSError:
            time.sleep(0.05)
    t = time.perf_counter(); sent = 0
    while sent < nbytes:
        c.sendall(chunk); sent += len(chunk)
    c.recv(1); print(sent / (time.perf_counter() - t), flush=True)
"""


def measure_link(tb, nbytes: int) -> float:
    """Bytes/s each way, with one TCP stream each way between hosts 0 and 1 at once."""
    def run_in(ns, *args):
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _STREAM, *args],
                                stdout=subprocess.PIPE, text=True)
    servers = [run_in(tb.names[1], "serve", tb.addresses[1], str(nbytes)),
               run_in(tb.names[0], "serve", tb.addresses[0], str(nbytes))]
    for s in servers:
        assert s.stdout.readline().strip() == "ready"
    clients = [run_in(tb.names[0], "send", tb.addresses[1], str(nbytes)),
               run_in(tb.names[1], "send", tb.addresses[0], str(nbytes))]
    rates = [float(c.communicate(timeout=120)[0].strip()) for c in clients]
    for s in servers:
        s.communicate(timeout=30)
    return min(rates)


def worker(args) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    import ringx  # noqa: F401

    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group("ringx", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"ringx": None}
    for name, spec in FLAT.items():
        os.environ["RINGX_ALGO"] = spec
        groups[name] = dist.new_group(backend="ringx", timeout=timeout)
    os.environ.pop("RINGX_ALGO")
    groups["gloo"] = dist.new_group(backend="gloo", timeout=timeout)
    sync = dist.new_group(backend="gloo", timeout=timeout)
    # One-way latency between rank 0 and the last rank (another host): half
    # the median round trip of an 8-byte send/recv, the model's inter-host alpha.
    peer = world - 1
    msg = torch.zeros(2)
    rtts = []
    cpu = None
    for i in range(args.pingpongs + 1):
        if i == 1:
            cpu = machine_cpu()
        start = time.perf_counter()
        if rank == 0:
            dist.send(msg, peer)
            dist.recv(msg, peer)
        elif rank == peer:
            dist.recv(msg, 0)
            dist.send(msg, 0)
        if i:
            rtts.append(time.perf_counter() - start)
    # The machine's CPU per one-way message (both hosts' stacks and ranks, the
    # other ranks waiting in a gloo barrier): what each message crossing
    # hosts costs the shared cores.
    per_message = [s * 1e6 for s in machine_cpu_since(cpu, 2 * args.pingpongs)]
    results = {"one_way_us": statistics.median(rtts) / 2 * 1e6 if rank == 0 else None,
               "message_cpu_us": per_message}
    for coll in args.collectives.split(","):
        sizes = {label: SIZES[label] for label in args.sizes.split(",")}
        for label, nbytes in (sizes if coll != "barrier" else {"0B": 0}).items():
            iters = args.iters if nbytes < (16 << 20) else args.big_iters
            elems = nbytes // 4  # the whole buffer: all_gather's output, reduce_scatter's input
            names = ["ringx"] + ([] if args.no_flat else FLAT_FOR[coll]) + ["gloo"]
            times = {name: [] for name in names}
            cpus = {name: [0.0, 0.0] for name in names}
            for i in range(iters + 1):
                for name in names:
                    took, cpu = call(dist, torch, coll, elems, rank, world, groups[name], sync, f"{name} {coll} {label}",
                                args.root, BACK_TO_BACK if nbytes < BACK_TO_BACK_BELOW else 1)
                    slowest = torch.tensor([took], dtype=torch.float64)
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=sync)
                    if i:  # the first call of each warms up connections and buffers
                        times[name].append(slowest.item())
                        cpus[name] = [t + c / iters for t, c in zip(cpus[name], cpu)]
            results[f"{coll} {label}"] = times
            results[f"cpu {coll} {label}"] = cpus
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def machine_cpu() -> tuple[float, float]:
    """Seconds of CPU the whole machine has spent busy, and of them in the kernel
    (system, interrupts, softirqs: the hosts' TCP stacks). /proc/stat is not
    namespaced, so every test-bed host's work counts."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, (system + irq + softirq) / hz


def machine_cpu_since(before: tuple[float, float], count: int) -> tuple[float, float]:
    """machine_cpu() spent since `before`, per one of `count` calls or messages."""
    return tuple((b - a) / count for a, b in zip(before, machine_cpu()))


def call(dist, torch, coll, elems, rank, world, group, sync, what, root, calls=1):
    """`calls` collectives on `group` back to back after a barrier on `sync`; checks
    the result and returns this rank's time per call in seconds, and the CPU the
    machine spent meanwhile per call (busy, kernel) in seconds."""
    block = elems // world
    if coll == "barrier":
        # Back to back, since the skew of the gloo barrier before it (hundreds
        # of microseconds) would hide what one barrier costs.
        dist.barrier(group=sync)
        dist.barrier(group=group)
        cpu = machine_cpu()
        start = time.perf_counter()
        for _ in range(BARRIERS):
            dist.barrier(group=group)
        took = (time.perf_counter() - start) / BARRIERS
        return took, machine_cpu_since(cpu, BARRIERS)
    if coll == "all_reduce":
        t = torch.full((elems,), float(rank + 1))
        op = lambda: dist.all_reduce(t, group=group)  # noqa: E731
        # Each call sums the previous sums: world (world + 1) / 2, then times world.
        want = world * (world + 1) / 2 * world ** (calls - 1)
        # Exact for one call; repeated, float32 may round (3^19 has 31 bits).
        tol = 1e-5 if calls > 1 else 0.0
        ok = lambda: all(math.isclose(t[i].item(), want, rel_tol=tol) for i in (0, -1))  # noqa: E731
    elif coll == "broadcast":
        t = torch.full((elems,), float(rank))
        op = lambda: dist.broadcast(t, src=root, group=group)  # noqa: E731
        ok = lambda: elems == 0 or (t[0].item() == root and t[-1].item() == root)  # noqa: E731
    elif coll == "all_gather":
        out = torch.empty(block * world)
        src = torch.full((block,), float(rank))
        op = lambda: dist.all_gather_into_tensor(out, src, group=group)  # noqa: E731
        ok = lambda: all(out[q * block].item() == q for q in range(world))  # noqa: E731
    elif coll == "all_to_all":
        # Block q of rank r's input goes to rank q: rank * world + q.
        src = torch.arange(world, dtype=torch.float32).repeat_interleave(block) + rank * world
        out = torch.empty(block * world)
        op = lambda: dist.all_to_all_single(out, src, group=group)  # noqa: E731
        ok = lambda: all(out[q * block].item() == q * world + rank for q in range(world))  # noqa: E731
    elif coll == "gather":
        src = torch.full((block,), float(rank))
        outs = [torch.empty(block) for _ in range(world)] if rank == root else None
        op = lambda: dist.gather(src, outs, dst=root, group=group)  # noqa: E731
        ok = lambda: rank != root or all(outs[q][-1].item() == q for q in range(world))  # noqa: E731
    elif coll == "scatter":
        srcs = [torch.full((block,), float(q)) for q in range(world)] if rank == root else None
        out = torch.empty(block)
        op = lambda: dist.scatter(out, srcs, src=root, group=group)  # noqa: E731
        ok = lambda: block == 0 or (out[0].item() == rank and out[-1].item() == rank)  # noqa: E731
    else:
        src = torch.arange(world, dtype=torch.float32).repeat_interleave(block) + rank
        out = torch.empty(block)
        op = lambda: dist.reduce_scatter_tensor(out, src, group=group)  # noqa: E731
        ok = lambda: out[0].item() == world * rank + world * (world - 1) / 2  # noqa: E731
    dist.barrier(group=sync)
    cpu = machine_cpu()
    start = time.perf_counter()
    for _ in range(calls):
        op()
    took = (time.perf_counter() - start) / calls
    cpu = machine_cpu_since(cpu, calls)
    if not ok():
        raise SystemExit(f"{what}: wrong result on rank {rank}")
    return took, cpu


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--layout", help="ranks on each host, comma separated (e.g. 3,1), or hosts x ranks per host "
                    "(e.g. 4x2, 8x1); overrides the two above")
    ap.add_argument("--containers", action="store_true",
                    help="each rank in a pid namespace of its own, sharing its host's /dev/shm (test-bed layout "
                         "'containers')")
    ap.add_argument("--rate", default="1gbit", help="tc rate of every host's link ('none': unshaped)")
    ap.add_argument("--iters", type=int, default=20, help="calls per configuration below 16 MiB")
    ap.add_argument("--big-iters", type=int, default=5, help="calls per configuration at 16 MiB and above")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma separated, of {', '.join(SIZES)} "
                    f"(default {DEFAULT_SIZES})")
    ap.add_argument("--no-flat", action="store_true",
                    help="ringx's own choice and gloo only, without the forced flat algorithms")
    ap.add_argument("--pingpongs", type=int, default=200, help="round trips for the one-way latency")
    ap.add_argument("--collectives", default=COLLECTIVES, help=f"comma separated (default {COLLECTIVES})")
    ap.add_argument("--root", type=int, default=1, help="broadcast's root (default 1)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0

    import testbed

    if args.layout and "x" in args.layout:
        args.hosts, args.ranks_per_host = (int(x) for x in args.layout.split("x"))
        args.layout = None
    ranks = [int(x) for x in args.layout.split(",")] if args.layout else [args.ranks_per_host] * args.hosts
    args.hosts = len(ranks)
    rate = None if args.rate == "none" else args.rate
    with testbed.Testbed(args.hosts, rate=rate) as tb:
        link = measure_link(tb, 32 << 20) if args.hosts > 1 else float("nan")
        codes, logs = tb.torchrun(ranks if args.layout else args.ranks_per_host, os.path.abspath(__file__),
                                  ["--worker", "--iters", str(args.iters), "--big-iters", str(args.big_iters),
                                   "--pingpongs", str(args.pingpongs), "--collectives", args.collectives,
                                   "--root", str(args.root), "--sizes", args.sizes]
                                  + (["--no-flat"] if args.no_flat else []),
                                  env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}, timeout=1800,
                                  layout="containers" if args.containers else "hosts")
    found = [line for log in logs for line in log.splitlines() if line.startswith("RESULT ")]
    if codes != [0] * args.hosts or not found:
        for i, log in enumerate(logs):
            print(f"===== host{i} (exit {codes[i]})\n{log[-6000:]}")
        return 1
    results = json.loads(found[0][len("RESULT "):])
    one_way_us = results.pop("one_way_us")
    message_cpu_us, message_kernel_us = results.pop("message_cpu_us")
    cpu = {key[len("cpu "):]: results.pop(key) for key in list(results) if key.startswith("cpu ")}
    cores = os.cpu_count()
    layout = f"hosts of {args.layout} ranks" if args.layout else f"{args.hosts} hosts x {args.ranks_per_host} ranks"
    layout += ", a pid namespace per rank" if args.containers else ""
    print(f"float32, {layout}, links {rate or 'unshaped'}; link measured at {link / 1e6:.1f} MB/s "
          f"each way (one TCP stream each way at once); ringx 8 B send/recv one way across hosts "
          f"{one_way_us:.1f} us (median of {args.pingpongs} round trips / 2), the machine's CPU per message "
          f"{message_cpu_us:.0f} us ({message_kernel_us:.0f} in the kernel)")
    print(f"{'collective':>14} {'size':>6} {'config':>18} {'median ms':>10} {'p10-p90 ms':>16} {'/ gloo':>7} "
          f"{'/ flat':>7} {'bound ms':>9} {'bound %':>8} {'CPU ms':>7} {'kernel':>7} {'busy %':>7}")
    table = []
    for key, times in results.items():
        coll, label = key.split()
        nbytes = SIZES.get(label, 0)
        med = {name: statistics.median(v) for name, v in times.items()}
        best_flat = min((med[name] for name in times if name in FLAT), default=float("nan"))
        # What must cross one host's link each way: all_reduce 2 (H-1)/H N,
        # broadcast N, all_to_all L (n-L)/n N on the host of L ranks whose
        # link carries most, gather and scatter (n-L)/n N on the root's host
        # of L ranks, the others (H-1)/H N (N the whole buffer).
        if coll == "all_to_all":
            crossing = max(on * (sum(ranks) - on) for on in ranks) / sum(ranks) * nbytes
        elif coll in ("gather", "scatter"):
            first = [sum(ranks[:h]) for h in range(len(ranks))]
            on = next(ranks[h] for h in range(len(ranks)) if first[h] <= args.root < first[h] + ranks[h])
            crossing = (sum(ranks) - on) / sum(ranks) * nbytes
        else:
            crossing = nbytes if coll == "broadcast" else nbytes * (args.hosts - 1) / args.hosts * (
                2 if coll == "all_reduce" else 1)
        bound = crossing / link if args.hosts > 1 else float("nan")
        for name, v in times.items():
            # The machine's CPU per call (every host's ranks and TCP stacks,
            # over rank 0's timed calls), and its share of all the cores: near
            # 100% the calls wait for CPU, not for the links.
            busy, kernel = cpu[key][name]
            row = {"collective": coll, "size": label, "bytes": nbytes, "config": name, "median_s": med[name],
                   "p10_s": pct(v, 0.1), "p90_s": pct(v, 0.9), "vs_gloo": med[name] / med["gloo"],
                   "vs_best_flat": med[name] / best_flat, "bound_s": bound, "of_bound": bound / med[name],
                   "cpu_s": busy, "kernel_s": kernel, "busy": busy / (cores * statistics.mean(v))}
            table.append(row)
            print(f"{coll:>14} {label:>6} {name:>18} {med[name] * 1e3:10.2f} "
                  f"{row['p10_s'] * 1e3:7.2f}-{row['p90_s'] * 1e3:<8.2f} {row['vs_gloo']:7.2f} "
                  f"{row['vs_best_flat']:7.2f} " + (f"{bound * 1e3:9.1f} {100 * row['of_bound']:7.0f}%" if nbytes
                                                    else f"{'-':>9} {'-':>8}")
                  + f" {busy * 1e3:7.2f} {kernel * 1e3:7.2f} {100 * row['busy']:6.0f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hosts": args.hosts, "ranks_per_host": ranks, "containers": args.containers,
                       "root": args.root, "rate": rate, "sizes": args.sizes, "no_flat": args.no_flat, "link_bytes_per_s": link, "one_way_us": one_way_us,
                       "message_cpu_us": message_cpu_us, "message_kernel_us": message_kernel_us, "iters": args.iters, "big_iters": args.big_iters,
                       "rows": table, "raw": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
