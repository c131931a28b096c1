#!/usr/bin/env python3
"""DDP step-time benchmark: how much communication each backend and hook leaves exposed.

    python benchmarks/ddp.py                       # MLP and transformer, world 2 and 4
    python benchmarks/ddp.py --world 2 --models mlp --steps 5 --rounds 1   # a quick look
    python benchmarks/ddp.py --json out.json       # also write every step time

The script spawns its own ranks (MASTER_ADDR/PORT, RANK, WORLD_SIZE, OMP_NUM_THREADS=1),
pins each to a core (rank r to the r-th allowed CPU, modulo their number; --pin none
turns that off) with one intra-op thread, so that the ranks do not fight over cores
and the figure measures overlap. In each world the default group is ringx and a gloo
group spans the same ranks, so every configuration runs in the same processes:

  compute      the same model, per-rank batch and optimizer, no DDP (no communication)
  gloo         DDP on the gloo group, no hook (DDP's built-in all-reduce)
  nocomm       DDP on ringx with a hook that communicates nothing: what DDP itself
               costs (its autograd hooks, the copies between .grad and the buckets),
               which every backend pays
  ringx        DDP on ringx, no hook
  ringx+<hook> DDP on ringx with ringx.hooks.<hook>
  ringx+partition, ringx+priority
               experimental, defined here and not part of ringx.hooks: buckets split
               into partitions of --partition-mb (FIFO), and partitions plus
               ByteScheduler-style priority (first layers first, see PriorityState)

A step is zero_grad + forward + loss + backward (DDP waits for its all-reduces at the
end of backward) + optimizer step. For each step the world's time is the slowest
rank's; the table gives the median and the 25th-75th percentile over --rounds x
--steps steps (the configurations take turns every --steps steps, so drift and load
from other processes fall on all of them alike).
Exposed communication = median step time - median compute-only step time; "above
nocomm" subtracts DDP's own cost as well. Beside it, DDP's own runtime statistics
(averaged by DDP over every step, warm-up included): avg_backward_comm_time and
avg_backward_compute_comm_overlap_time; and the CPU time per step (mean over ranks,
from /proc's schedstat) of the rank's main thread and of all its other threads (the
backends' progress, completion and worker threads). With one core per rank nothing
else can run the communication's CPU work, so it is exposed unless backward leaves the
core idle. The final loss of every configuration on one fixed batch shows what
compression does to training (all DDP configurations see the same data; 'compute' and
'nocomm' train each rank on its own data).

At the end the issue-5 targets are checked: exposed communication ringx+allreduce_hook
vs gloo <= 0.5x, step time of the best shipped ringx configuration (no hook or a
ringx.hooks hook) vs gloo <= 0.8x, bf16 final loss within 1% of the float32
(ringx+allreduce_hook) run. The time ratios are given on the median step and on the
fastest step ("min"): with other processes on the same cores the medians move with
their load, the minima much less.
"""

import argparse
import datetime
import heapq
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time

HOOKS = ("allreduce_hook", "bf16_compress_hook", "fp16_compress_hook")
EXPERIMENTAL = ("partition", "priority")
CONFIGS = ("compute", "gloo", "nocomm", "ringx") + tuple(f"ringx+{h}" for h in HOOKS + EXPERIMENTAL)
MODELS = ("mlp", "transformer")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", default="2,4", help="world sizes, comma-separated (default 2,4)")
    p.add_argument("--models", default=",".join(MODELS), help=f"models, comma-separated {MODELS}")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="configurations, comma-separated (compute and gloo are always run)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per configuration per round (3)")
    p.add_argument("--rounds", type=int, default=12, help="rounds (12)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps per configuration before the first round (3)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket_cap_mb (default: DDP's default, 25)")
    p.add_argument("--bucket-view", choices=("on", "off"), default="off",
                   help="DDP gradient_as_bucket_view (off, DDP's default): on removes DDP's copies "
                        "between .grad and the buckets from every DDP configuration")
    p.add_argument("--partition-mb", type=float, default=1.0,
                   help="partition size of the experimental partition/priority hooks (1)")
    p.add_argument("--pin", choices=("auto", "none"), default="auto", help="pin ranks to cores (auto)")
    p.add_argument("--json", default=None, help="write the results here (default: "
                   "bench-results/ddp-<time>.json)")
    p.add_argument("--timeout", type=float, default=900, help="bound per world, seconds (900)")
    args = p.parse_args(argv)
    args.world = [int(w) for w in args.world.split(",") if w]
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r} (choose from {MODELS})")
    cfgs = [c for c in args.configs.split(",") if c]
    for c in cfgs:
        if c not in CONFIGS:
            p.error(f"unknown configuration {c!r} (choose from {CONFIGS})")
    args.configs = [c for c in CONFIGS if c in cfgs or c in ("compute", "gloo")]
    return args


# --------------------------------------------------------------------------- models

def build_model(name, seed):
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    if name == "mlp":
        class ResidualMLP(nn.Module):
            """512 -> 1024, 7 residual 1024 x 1024 ReLU layers, -> 512: 8.4M parameters,
            32 MiB of float32 gradients."""

            def __init__(self, d_in=512, width=1024, blocks=7):
                super().__init__()
                self.inp = nn.Linear(d_in, width)
                self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))
                self.out = nn.Linear(width, d_in)

            def forward(self, x):
                h = self.inp(x)
                for block in self.blocks:
                    h = h + torch.relu(block(h))
                return self.out(h)

        return ResidualMLP()

    class TinyTransformer(nn.Module):
        """4 encoder layers, d_model 256, vocabulary 2048: 4.2M parameters, 16 MiB of gradients."""

        def __init__(self, vocab=2048, d=256, layers=4, seq=64):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
            layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, dropout=0.0,
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]]))

    return TinyTransformer()


def make_batches(name, seed, rank, n):
    """n deterministic (input, target) batches for one rank (the same for every config)."""
    import torch

    g = torch.Generator().manual_seed(seed * 7919 + rank)
    out = []
    if name == "mlp":
        teacher = torch.randn(512, 512, generator=torch.Generator().manual_seed(seed)) / 512**0.5
        for _ in range(n):
            x = torch.randn(64, 512, generator=g)
            out.append((x, torch.tanh(x @ teacher)))
    else:
        for _ in range(n):
            tokens = torch.randint(0, 2048, (8, 64), generator=g)
            out.append((tokens, (tokens * 7 + 3) % 2048))  # a fixed token-to-token map
    return out


def loss_fn(name, out, target):
    import torch.nn.functional as F

    if name == "mlp":
        return F.mse_loss(out, target)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


# --------------------------------------------------------------------------- experimental hooks

class PriorityState:
    """State of the experimental partition / priority hook (ByteScheduler's idea for DDP).

    Each bucket is split into partitions of at most `partition_bytes`. With
    `priority=False` they are all issued at once, in order (partitioning alone). With
    `priority=True` partitions wait in a queue ordered by bucket index, highest first:
    DDP hands over the last layers' bucket first (index 0) and the first layers' last,
    and the next forward needs the first layers first. Collectives must be issued in
    the same order on every rank, so the queue is only drained at events every rank
    sees in the same order, namely DDP handing over a bucket: then up to
    `credit_bytes` are issued, highest priority first; when the last bucket of the
    step arrives everything left is issued. (ByteScheduler also issues on completions,
    which needs a negotiation round to keep ranks in step; DDP offers no place for one.)
    """

    def __init__(self, group, partition_bytes, priority, credit_bytes=None):
        self.group = group
        self.partition_bytes = int(partition_bytes)
        self.priority = priority
        self.credit_bytes = credit_bytes if credit_bytes is not None else 2 * self.partition_bytes
        self.queue = []
        self.seq = 0
        self.lock = threading.Lock()


def priority_hook(state, bucket):
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    numel = max(1, state.partition_bytes // buf.element_size())
    parts = list(buf.split(numel))
    result = torch.futures.Future()
    pending = [len(parts)]

    def part_done(fut):  # on ringx's completion thread; counts this bucket's partitions
        fut.value()  # re-raise a failed all-reduce
        with state.lock:
            pending[0] -= 1
            last = pending[0] == 0
        if last:
            result.set_result(buf)

    def issue(part, done):
        work = dist.all_reduce(part, op=dist.ReduceOp.AVG, group=state.group, async_op=True)
        work.get_future().then(done)

    if not state.priority:
        for part in parts:
            issue(part, part_done)
        return result
    for j, part in enumerate(parts):
        # (priority, partition, tie-breaker, tensor, its bucket's callback)
        heapq.heappush(state.queue, (-bucket.index(), j, state.seq, part, part_done))
        state.seq += 1
    budget = float("inf") if bucket.is_last() else state.credit_bytes
    while state.queue and budget > 0:
        _, _, _, part, done = heapq.heappop(state.queue)
        budget -= part.numel() * part.element_size()
        issue(part, done)
    return result


def nocomm_hook(state, bucket):
    """DDP's own cost with no communication: the bucket comes back as it went in."""
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


# --------------------------------------------------------------------------- ranks

def _pin(rank, mode):
    if mode == "none" or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[rank % len(cpus)]
    os.sched_setaffinity(0, {cpu})  # before any thread starts: they inherit it
    return cpu


def _stats(times):
    s = sorted(times)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "p25": q[0], "p75": q[2], "min": s[0], "max": s[-1]}


def _thread_cpu():
    """{thread id: CPU nanoseconds so far} for this process, or None without schedstat."""
    out = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    out[int(tid)] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that ended between the listing and the read
    except OSError:
        return None
    return out or None


def _add_cpu(run, before, after):
    if before is None or after is None:
        return
    main = os.getpid()
    for tid, ns in after.items():
        key = "cpu_main_ns" if tid == main else "cpu_other_ns"
        run[key] = run.get(key, 0) + ns - before.get(tid, 0)


def _die_with_parent():
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _worker(rank, ws, port, args, out_path):
    _die_with_parent()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(ws), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ws),
                      OMP_NUM_THREADS="1")
    cpu = _pin(rank, args.pin)
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ringx  # noqa: F401  (registers the backend)
    import ringx.hooks

    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("ringx", timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    ddp_kw = {"gradient_as_bucket_view": args.bucket_view == "on"}
    if args.bucket_cap_mb is not None:
        ddp_kw["bucket_cap_mb"] = args.bucket_cap_mb
    part_bytes = args.partition_mb * (1 << 20)
    results = {"rank": rank, "cpu": cpu, "models": {}}
    for mname in args.models:
        n_batches = args.warmup + args.rounds * args.steps
        batches = make_batches(mname, 1, rank, n_batches)
        runs = {}
        for cfg in args.configs:
            model = build_model(mname, 1)
            if cfg == "compute":
                net = model
            elif cfg == "gloo":
                net = DDP(model, process_group=gloo, **ddp_kw)
            elif cfg == "nocomm":
                net = DDP(model, **ddp_kw)
                net.register_comm_hook(None, nocomm_hook)
            else:
                net = DDP(model, **ddp_kw)
                hook = cfg.partition("+")[2]
                if hook in HOOKS:
                    net.register_comm_hook(None, getattr(ringx.hooks, hook))
                elif hook in EXPERIMENTAL:
                    net.register_comm_hook(PriorityState(None, part_bytes, hook == "priority"),
                                           priority_hook)
            if cfg != "compute":
                net._set_ddp_runtime_logging_sample_rate(1)
            if mname == "mlp":
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            else:
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            runs[cfg] = {"model": model, "net": net, "opt": opt, "next": 0, "times": []}

        def step(run, timed):
            x, y = batches[run["next"]]
            run["next"] += 1
            t0 = time.perf_counter()
            run["opt"].zero_grad(set_to_none=True)
            loss_fn(mname, run["net"](x), y).backward()
            run["opt"].step()
            dt = time.perf_counter() - t0
            if timed:
                run["times"].append(dt)

        for cfg in args.configs:
            dist.barrier(group=gloo)
            for _ in range(args.warmup):
                step(runs[cfg], False)
        # Configurations take turns every --steps steps, and the one that starts a round
        # rotates, so that load from outside (other processes on these cores) and drift
        # fall on every configuration alike.
        for rnd in range(args.rounds):
            k = rnd % len(args.configs)
            for cfg in args.configs[k:] + args.configs[:k]:
                dist.barrier(group=gloo)
                cpu0 = _thread_cpu()
                for _ in range(args.steps):
                    step(runs[cfg], True)
                _add_cpu(runs[cfg], cpu0, _thread_cpu())
        dist.barrier(group=gloo)
        eval_x, eval_y = make_batches(mname, 1, 10**6, 1)[0]  # same task, unseen data
        out = {}
        for cfg, run in runs.items():
            with torch.no_grad():
                final_loss = float(loss_fn(mname, run["model"](eval_x), eval_y))
            entry = {"times": run["times"], "final_loss": final_loss}
            for key in ("cpu_main_ns", "cpu_other_ns"):
                if key in run:
                    entry[key] = run[key] / len(run["times"])
            if cfg != "compute":
                data = run["net"]._get_ddp_logging_data()
                for key in ("avg_backward_comm_time", "avg_backward_compute_comm_overlap_time",
                            "avg_backward_compute_time", "avg_forward_compute_time"):
                    entry[key] = data.get(key)
                entry["bucket_sizes"] = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
            out[cfg] = entry
        n_params = sum(p.numel() for p in runs["compute"]["model"].parameters())
        results["models"][mname] = {"configs": out, "params": n_params}
        del runs
    with open(out_path, "w") as f:
        json.dump(results, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def run_world(ws, args):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix=f"ringx-ddp-bench-w{ws}-")
    from collectives import free_port

    port = free_port()
    paths = [os.path.join(tmp, f"rank{r}.json") for r in range(ws)]
    procs = [ctx.Process(target=_worker, args=(r, ws, port, args, paths[r]), daemon=True)
             for r in range(ws)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.timeout
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.exitcode is None]
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join(5)
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (0, None)]
    if hung or bad:
        raise SystemExit(f"world {ws}: ranks {hung} did not finish within {args.timeout:g} s; "
                         f"ranks that failed (rank, exit code): {bad}")
    per_rank = []
    for path in paths:
        with open(path) as f:
            per_rank.append(json.load(f))
    return per_rank


# --------------------------------------------------------------------------- report

def summarize(ws, per_rank):
    """{model: {params, configs: {cfg: row}}} with world step times (max over ranks)."""
    summary = {}
    for mname, m0 in per_rank[0]["models"].items():
        rows = {}
        for cfg, c0 in m0["configs"].items():
            per_step = [max(r["models"][mname]["configs"][cfg]["times"][i] for r in per_rank)
                        for i in range(len(c0["times"]))]
            row = {"step": _stats(per_step), "final_loss": c0["final_loss"], "step_times": per_step,
                   "bucket_sizes": c0.get("bucket_sizes")}
            # ns per rank -> ms, averaged over the ranks that have it
            for key, name in (("avg_backward_comm_time",) * 2, ("avg_backward_compute_comm_overlap_time",) * 2,
                              ("avg_backward_compute_time",) * 2, ("avg_forward_compute_time",) * 2,
                              ("cpu_main_ns", "cpu_main_ms"), ("cpu_other_ns", "cpu_other_ms")):
                vals = [r["models"][mname]["configs"][cfg].get(key) for r in per_rank]
                vals = [v for v in vals if isinstance(v, (int, float))]
                row[name] = statistics.mean(vals) / 1e6 if vals else None
            rows[cfg] = row
        compute = rows["compute"]["step"]["median"]
        for row in rows.values():
            row["exposed"] = row["step"]["median"] - compute
        summary[mname] = {"params": m0["params"], "configs": rows}
    return summary


SHIPPED = ("ringx",) + tuple(f"ringx+{h}" for h in HOOKS)


def targets(summary):
    """The issue-5 ratios for one world's summary: {model: {...}}.

    Each time ratio is computed on the median step (what the targets name) and on the
    fastest step ("min"), which is what a step costs when no other process takes the
    cores: on a shared machine the medians move with the load, the minima much less.
    """
    out = {}
    for mname, s in summary.items():
        rows = s["configs"]
        t = {}
        for stat in ("median", "min"):
            compute = rows["compute"]["step"][stat]
            gloo = rows["gloo"]["step"][stat]
            if "ringx+allreduce_hook" in rows and gloo - compute > 0:
                exposed = rows["ringx+allreduce_hook"]["step"][stat] - compute
                t[f"exposed_allreduce_hook_vs_gloo_{stat}"] = exposed / (gloo - compute)
                if "nocomm" in rows:
                    ddp = rows["nocomm"]["step"][stat]
                    if gloo - ddp > 0:
                        mine = rows["ringx+allreduce_hook"]["step"][stat] - ddp
                        t[f"above_nocomm_allreduce_hook_vs_gloo_{stat}"] = mine / (gloo - ddp)
            shipped = [c for c in SHIPPED if c in rows]
            if shipped:
                best = min(shipped, key=lambda c: rows[c]["step"][stat])
                t[f"best_ringx_{stat}"] = best
                t[f"step_best_ringx_vs_gloo_{stat}"] = rows[best]["step"][stat] / gloo
        if "ringx+bf16_compress_hook" in rows and "ringx+allreduce_hook" in rows:
            ref = rows["ringx+allreduce_hook"]["final_loss"]
            t["bf16_loss_rel_diff"] = abs(rows["ringx+bf16_compress_hook"]["final_loss"] - ref) / ref
        out[mname] = t
    return out


def _verdict(v, bound):
    return f"{v:.2f}x ({'met' if v <= bound else 'NOT met'})"


def _ms(v):
    return "-" if v is None else f"{v:.1f}"


def print_table(ws, summary, tgt):
    for mname, s in summary.items():
        print(f"\n# world {ws}, {mname} ({s['params'] / 1e6:.1f}M parameters, "
              f"{s['params'] * 4 / 2**20:.0f} MiB of float32 gradients); times in ms")
        print(f"{'config':<26}{'median':>8}{'p25':>8}{'p75':>8}{'min':>8}{'exposed':>9}"
              f"{'exp(min)':>9}{'ddp comm':>9}{'ddp ovlp':>9}{'cpu main':>9}{'cpu other':>10}"
              f"{'final loss':>11}")
        cmin = s["configs"]["compute"]["step"]["min"]
        for cfg, row in s["configs"].items():
            st = row["step"]
            comm = row["avg_backward_comm_time"]
            ovl = row["avg_backward_compute_comm_overlap_time"]
            print(f"{cfg:<26}{st['median'] * 1e3:8.1f}{st['p25'] * 1e3:8.1f}{st['p75'] * 1e3:8.1f}"
                  f"{st['min'] * 1e3:8.1f}{row['exposed'] * 1e3:9.1f}{(st['min'] - cmin) * 1e3:9.1f}"
                  f"{_ms(comm):>9}{_ms(ovl):>9}{_ms(row.get('cpu_main_ms')):>9}"
                  f"{_ms(row.get('cpu_other_ms')):>10}{row['final_loss']:11.5f}")
        t = tgt[mname]
        for stat in ("median", "min"):
            parts = []
            key = f"exposed_allreduce_hook_vs_gloo_{stat}"
            if key in t:
                parts.append(f"exposed comm allreduce_hook/gloo {_verdict(t[key], 0.5)}")
                key = f"above_nocomm_allreduce_hook_vs_gloo_{stat}"
                if key in t:
                    parts.append(f"above nocomm {t[key]:.2f}x")
            elif "ringx+allreduce_hook" in s["configs"]:
                parts.append("exposed comm allreduce_hook/gloo: n/a (gloo exposes none)")
            key = f"step_best_ringx_vs_gloo_{stat}"
            if key in t:
                parts.append(f"step {t[f'best_ringx_{stat}']}/gloo {_verdict(t[key], 0.8)}")
            print(f"  on {stat:<6}: " + "; ".join(parts))
        if "bf16_loss_rel_diff" in t:
            v = t["bf16_loss_rel_diff"]
            print(f"  bf16 final loss vs float32 (ringx+allreduce_hook): {v:.3%} apart "
                  f"({'met' if v <= 0.01 else 'NOT met'}, target <= 1%)")


def main(argv=None):
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    started = time.time()
    doc = {"host": platform.node(), "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count(), "load_before": os.getloadavg(), "args": {k: v for k, v in vars(args).items()},
           "started": datetime.datetime.now().isoformat(timespec="seconds"), "worlds": {}}
    for ws in args.world:
        t0 = time.monotonic()
        load0 = os.getloadavg()[0]
        per_rank = run_world(ws, args)
        load1 = os.getloadavg()[0]
        summary = summarize(ws, per_rank)
        tgt = targets(summary)
        print_table(ws, summary, tgt)
        noisy = [m for m, sm in summary.items()
                 if sm["configs"]["compute"]["step"]["p75"] > 1.25 * sm["configs"]["compute"]["step"]["p25"]]
        if max(load0, load1) > max(ws, doc["cpus"]) + 0.5 or noisy:
            print(f"  WARNING: other processes shared the cores during world {ws} (load average "
                  f"{load0:.1f} -> {load1:.1f} on {doc['cpus']} CPUs; compute-only p75/p25 > 1.25 for "
                  f"{noisy or 'no model'}): these times measure the load as much as ringx. "
                  f"Re-run on an idle machine.")
        print(f"  (world {ws}: {time.monotonic() - t0:.0f} s, ranks pinned to CPUs "
              f"{[r['cpu'] for r in per_rank]}, 1-minute load average {load0:.1f} before, "
              f"{load1:.1f} after: above the rank count means other processes shared the cores)")
        doc["worlds"][str(ws)] = {"summary": summary, "targets": tgt,
                                  "cpus": [r["cpu"] for r in per_rank], "load": [load0, load1]}
    doc["load_after"] = os.getloadavg()
    doc["seconds"] = time.time() - started
    path = args.json or os.path.join(os.getcwd(), "bench-results",
                                     f"ddp-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\nwrote {path}; load average before/after {doc['load_before'][0]:.1f}/"
          f"{doc['load_after'][0]:.1f} on {doc['cpus']} CPUs")


if __name__ == "__main__":
    sys.exit(main())
