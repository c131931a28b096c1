"""Soak test: WORLD_SIZE ranks issue N collectives of random kind, size, dtype, reduce op
and group, synchronous and asynchronous interleaved, and check every result.

    python tests/soak.py [--world-size 4] [--ops 20000] [--seed 1] [--max-count 65536]
                         [--timeout 60] [--limit SECONDS] [--backend ringx]

Without RANK in the environment the script launches itself as WORLD_SIZE ranks
(torchrun-like environment, one process per rank, each killed when the run ends or
exceeds --limit), waits, and prints one summary line:

    soak: PASS 20000 ops in 312.4 s (4 ranks), 0 wrong, 0 hung, 0 crashed; by kind: ...

and exits 0 only when every rank checked every one of its results.

How ranks agree: every rank draws the same op sequence from random.Random(seed), so
they issue the same ops in the same order, each rank skipping ops of groups it is not
in (groups: the world, [1, 2, 3] and [0, 2] for 4 ranks).  Inputs are made from
(seed, op index, group rank) by torch.Generator, so every rank can rebuild every other
member's input and compute the expected result itself with plain torch.  Values are
small integers so that SUM, PRODUCT, MIN and MAX are exact in every dtype (bf16
included); AVG is compared with a tolerance.

Kinds: all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single (equal or random splits; with equal ones, some ranks may pass none), reduce, gather, scatter, send/recv pairs,
and the list forms all_gather, reduce_scatter and all_to_all. Each list is laid out
one of several ways (LAYOUTS), since ringx reads and writes some in place: separate
tensors, back-to-back views of one tensor, views with gaps between them, and aliased
(all_gather's input is its own block of the output list; all_to_all's output list is
its input list, with split sizes that make that possible). And two kinds that make
several calls one op: "coalesced", a block of 1-4 all_reduces, all_gather_into_tensors
or reduce_scatter_tensors of one dtype and reduce op under dist._coalescing_manager
(with a device: the backend's startCoalescing/endCoalescing; without: torch's calls of
the *_coalesced methods), and "batch_p2p", batch_isend_irecv around a ring of the group
in one or both directions.
About half the ops are async (isend/irecv for pairs); up to WINDOW async ops stay
outstanding and are waited on in a random order.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
from ports import free_port  # noqa: E402  (tests/python/ports.py)

KINDS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
         "reduce", "gather", "scatter", "send_recv", "all_gather", "reduce_scatter", "all_to_all", "coalesced", "batch_p2p")
COALESCED = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
LAYOUTS = {"all_gather": ("separate", "views", "gapped", "aliased"),
           "reduce_scatter": ("separate", "views", "gapped"),
           "all_to_all": ("separate", "views", "gapped", "aliased")}
PIECES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter",
          "all_gather", "reduce_scatter", "all_to_all")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8")
FLOATS = ("float32", "float64", "float16", "bfloat16")
WINDOW = 8
# Tolerances for AVG only (everything else is exact): relative to the largest |value|.
AVG_TOL = {"float32": 1e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1.6e-2}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-count", type=int, default=65536, help="largest element count per rank")
    p.add_argument("--timeout", type=float, default=60.0, help="process group timeout (s)")
    p.add_argument("--limit", type=float, default=None, help="wall-clock bound of the whole run (s)")
    p.add_argument("--backend", default="ringx")
    p.add_argument("--out", default=None, help="directory for per-rank reports (default: a temp dir)")
    p.add_argument("--self-check", action="store_true",
                   help="also check the checker: each result, with one element changed, must be flagged")
    return p.parse_args()


# ------------------------------------------------------------------------------ the plan


def groups_for(world_size):
    """The groups every rank creates, in order: (name, global ranks)."""
    gs = [("world", list(range(world_size)))]
    if world_size >= 4:
        gs += [("sub123", [1, 2, 3]), ("sub02", [0, 2])]
    elif world_size >= 2:
        gs += [("sub01", [0, 1])]
    return gs


def draw_count(rng, max_count):
    u = rng.random()
    if u < 0.03:
        return 0
    if u < 0.15:
        return 1
    if u < 0.60:
        return rng.randint(2, 64)
    if u < 0.92:
        return rng.randint(65, min(4096, max_count))
    return rng.randint(min(4097, max_count), max_count)


def plan(rng, groups, max_count):
    """One op, drawn identically on every rank."""
    kind = rng.choice(KINDS)
    gname, members = rng.choice(groups)
    n = len(members)
    if kind in ("send_recv", "batch_p2p") and n < 2:
        gname, members = groups[0]
        n = len(members)
    dtype = rng.choice(DTYPES)
    redop = None
    inner = rng.choice(COALESCED) if kind == "coalesced" else None
    if kind in ("all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter") or \
            inner in ("all_reduce", "reduce_scatter_tensor"):
        ops = ["SUM", "PRODUCT", "MIN", "MAX"]
        if dtype in FLOATS:
            ops.append("AVG")
        else:
            ops += ["BAND", "BOR", "BXOR"]
        redop = rng.choice(ops)
    count = draw_count(rng, max_count)
    if kind in PIECES:
        count = max(0, count // max(1, n))  # per-rank piece; keeps the totals bounded
    op = {"kind": kind, "group": gname, "members": members, "dtype": dtype, "redop": redop,
          "count": count, "async": rng.random() < 0.5, "root": rng.randrange(n)}
    if kind == "send_recv":
        src, dst = rng.sample(range(n), 2)
        op.update(src=src, dst=dst)
    if kind in LAYOUTS:
        op["layout"] = rng.choice(LAYOUTS[kind])
    if kind == "coalesced":
        op.update(inner=inner, on_device=rng.random() < 0.5,
                  counts=[max(0, draw_count(rng, max_count) // n) for _ in range(rng.randint(1, 4))])
    if kind == "batch_p2p":
        op["both_ways"] = rng.random() < 0.5
    if kind in ("all_to_all_single", "all_to_all"):
        if rng.random() < 0.5:
            op["splits"] = [[count] * n for _ in range(n)]
            # all_to_all_single: some ranks pass no split sizes (gloo allows the mix; ringx
            # too, but not on one host with its single copy off: docs/usage.md)
            if kind == "all_to_all_single" and os.environ.get("RINGX_CMA") != "0":
                op["bare"] = [q for q in range(n) if rng.random() < 0.5]
        else:  # splits[i][j]: rows group rank i sends to group rank j
            op["splits"] = [[rng.randint(0, max(1, count)) for _ in range(n)] for _ in range(n)]
        if op.get("layout") == "aliased":  # block j goes out to j and comes back from j: same size
            op["splits"] = [[op["splits"][min(i, j)][max(i, j)] for j in range(n)] for i in range(n)]
    return op


def lay_out(torch, contents, layout):
    """The list of tensors holding `contents`: separate tensors, or views of one tensor,
    back to back ("views", "aliased") or with 3 elements between them ("gapped")."""
    if layout == "separate":
        return [c.clone() for c in contents]
    gap = 3 if layout == "gapped" else 0
    whole = torch.full((sum(c.numel() for c in contents) + gap * len(contents),), 55,
                       dtype=contents[0].dtype if contents else torch.float32)
    views, at = [], 0
    for c in contents:
        v = whole[at:at + c.numel()]
        v.copy_(c)
        views.append(v)
        at += c.numel() + gap
    return views


# ------------------------------------------------------------------------------ a worker


def make_input(torch, seed, index, grank, dtype, count, redop, width=1):
    g = torch.Generator().manual_seed((seed * 1_000_003 + index) * 64 + grank)
    tdt = getattr(torch, dtype)
    if redop == "PRODUCT":
        vals = torch.tensor([-2, -1, 1, 2])[torch.randint(0, 4, (count * width,), generator=g)]
        if dtype == "uint8":
            vals = vals.abs()
    elif dtype == "uint8":
        vals = torch.randint(0, 9, (count * width,), generator=g)
    else:
        vals = torch.randint(-8, 9, (count * width,), generator=g)
    return vals.to(tdt)


def reduce_ref(torch, inputs, redop, dtype):
    if redop in ("SUM", "AVG"):
        acc = torch.stack([x.to(torch.float64) if dtype in FLOATS else x.to(torch.int64) for x in inputs]).sum(0)
        if redop == "AVG":
            acc = acc / len(inputs)
        return acc
    if redop == "PRODUCT":
        return torch.stack([x.to(torch.float64) if dtype in FLOATS else x.to(torch.int64) for x in inputs]).prod(0)
    if redop == "MIN":
        return torch.stack(inputs).amin(0)
    if redop == "MAX":
        return torch.stack(inputs).amax(0)
    out = inputs[0].clone()
    for x in inputs[1:]:
        out = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[redop](out, x)
    return out


def same(torch, got, want, dtype, redop):
    """None if equal (or within the AVG tolerance), else a short description."""
    if got.numel() != want.numel():
        return f"{got.numel()} elements, expected {want.numel()}"
    if got.numel() == 0:
        return None
    if redop == "AVG":
        g, w = got.to(torch.float64), want.to(torch.float64)
        tol = AVG_TOL[dtype] * max(1.0, float(w.abs().max()))
        bad = (g - w).abs() > tol
    else:  # small integers: exact in every dtype, and in float64
        bad = got.to(torch.float64) != want.to(torch.float64)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        return f"{int(bad.sum())} wrong, first at {i}: got {got.flatten()[i].item()}, expected {want.flatten()[i].item()}"
    return None


def worker(args):
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    if args.backend == "ringx":
        import ringx  # noqa: F401

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    RO = dist.ReduceOp
    groups = groups_for(ws)
    handles = {"world": None}
    for name, members in groups[1:]:
        handles[name] = dist.new_group(ranks=members)
    rng = random.Random(args.seed)
    local = random.Random(args.seed * 7 + rank)  # wait order only: need not agree
    pending = []  # (index, work list, check)
    wrong, checked, by_kind = [], 0, {}
    selfcheck = [0, 0]  # results corrupted on purpose, and how many of those passed
    t0 = time.time()
    report_path = os.path.join(args.out, f"rank{rank}.json")

    def compare(got, want, dtype, redop):
        """A check bound to this op's values (async checks run after later ops were drawn)."""
        def check():
            g = torch.cat(got) if isinstance(got, list) else got
            err = same(torch, g, want, dtype, redop)
            if args.self_check and g.numel():
                bad = g.clone()
                bad.view(-1)[g.numel() // 2] += 3
                selfcheck[0] += 1
                if same(torch, bad, want, dtype, redop) is None:
                    selfcheck[1] += 1
                    wrong.append(f"self-check: a changed {dtype} {redop} result passed the check")
            return err
        return check

    def drain(all_of_them):
        nonlocal checked
        local.shuffle(pending)
        keep = []
        while pending:
            idx, works, check = pending.pop()
            if not all_of_them and len(keep) + len(pending) < WINDOW // 2 and local.random() < 0.5:
                keep.append((idx, works, check))
                continue
            for w in works:
                w.wait()
            err = check()
            checked += 1
            if err:
                wrong.append(f"op {idx}: {err}")
        pending.extend(keep)

    def write_report(status):
        with open(report_path + ".tmp", "w") as f:
            json.dump({"rank": rank, "status": status, "ops": i + 1 if args.ops else 0, "checked": checked,
                       "wrong": wrong[:50], "n_wrong": len(wrong), "by_kind": by_kind,
                       "self_check": selfcheck,
                       "seconds": time.time() - t0}, f)
        os.replace(report_path + ".tmp", report_path)

    i = -1
    for i in range(args.ops):
        op = plan(rng, groups, args.max_count)
        members = op["members"]
        if rank not in members:
            continue
        by_kind[op["kind"]] = by_kind.get(op["kind"], 0) + 1
        g = handles[op["group"]]
        n = len(members)
        gr = members.index(rank)
        root_global = members[op["root"]]
        kind, dtype, redop, count, asy = op["kind"], op["dtype"], op["redop"], op["count"], op["async"]
        inp = lambda r, width=1: make_input(torch, args.seed, i, r, dtype, count, redop, width)  # noqa: E731

        def my_reduced_block(make, c):
            """Group rank gr's block of c elements of the reduction of every rank's make(r, n)."""
            return reduce_ref(torch, [make(r, n) for r in range(n)], redop, dtype)[gr * c:(gr + 1) * c]

        def received(sp):
            """What group rank gr receives in an all-to-all with split sizes sp, in rank order."""
            pieces = []
            for r in range(n):
                src = make_input(torch, args.seed, i, r, dtype, sum(sp[r]), None)
                off = sum(sp[r][:gr])
                pieces.append(src[off:off + sp[r][gr]])
            return torch.cat(pieces)

        works, check = [], None
        where = f"{kind} {dtype} {redop or ''} count {count} group {op['group']} {'async' if asy else 'sync'}"

        if kind == "all_reduce":
            t = inp(gr)
            want = reduce_ref(torch, [inp(r) for r in range(n)], redop, dtype)
            w = dist.all_reduce(t, op=getattr(RO, redop), group=g, async_op=asy)
            check = compare(t, want, dtype, redop)
        elif kind == "reduce":
            t = inp(gr)
            want = reduce_ref(torch, [inp(r) for r in range(n)], redop, dtype)
            w = dist.reduce(t, dst=root_global, op=getattr(RO, redop), group=g, async_op=asy)
            check = compare(t, want, dtype, redop) if gr == op["root"] else (lambda: None)
        elif kind == "broadcast":
            t = inp(gr)
            want = inp(op["root"])
            w = dist.broadcast(t, src=root_global, group=g, async_op=asy)
            check = compare(t, want, dtype, None)
        elif kind == "all_gather_into_tensor":
            t = inp(gr)
            out = torch.full((count * n,), 77, dtype=getattr(torch, dtype))
            want = torch.cat([inp(r) for r in range(n)])
            w = dist.all_gather_into_tensor(out, t, group=g, async_op=asy)
            check = compare(out, want, dtype, None)
        elif kind == "reduce_scatter_tensor":
            t = inp(gr, n)
            out = torch.full((count,), 77, dtype=getattr(torch, dtype))
            want = my_reduced_block(inp, count)
            w = dist.reduce_scatter_tensor(out, t, op=getattr(RO, redop), group=g, async_op=asy)
            check = compare(out, want, dtype, redop)
        elif kind == "all_to_all_single":
            sp = op["splits"]
            in_rows = sum(sp[gr])
            t = make_input(torch, args.seed, i, gr, dtype, in_rows, None)
            out_rows = sum(sp[r][gr] for r in range(n))
            out = torch.full((out_rows,), 77, dtype=getattr(torch, dtype))
            want = received(sp)
            if gr in op.get("bare", ()):
                w = dist.all_to_all_single(out, t, group=g, async_op=asy)
            else:
                w = dist.all_to_all_single(out, t, output_split_sizes=[sp[r][gr] for r in range(n)],
                                           input_split_sizes=sp[gr], group=g, async_op=asy)
            check = compare(out, want, dtype, None)
        elif kind == "all_gather":
            layout = op["layout"]
            outs = lay_out(torch, [torch.full((count,), 77, dtype=getattr(torch, dtype)) for _ in range(n)],
                           "views" if layout == "aliased" else layout)
            t = inp(gr)
            if layout == "aliased":
                outs[gr].copy_(t)
                t = outs[gr]
            want = torch.cat([inp(r) for r in range(n)])
            w = dist.all_gather(outs, t, group=g, async_op=asy)
            check = compare(outs, want, dtype, None)
        elif kind == "reduce_scatter":
            ins = lay_out(torch, list(inp(gr, n).split(count)) if count else
                          [inp(gr) for _ in range(n)], op["layout"])
            out = torch.full((count,), 77, dtype=getattr(torch, dtype))
            want = my_reduced_block(inp, count)
            w = dist.reduce_scatter(out, ins, op=getattr(RO, redop), group=g, async_op=asy)
            check = compare(out, want, dtype, redop)
        elif kind == "all_to_all":
            sp, layout = op["splits"], op["layout"]
            t = make_input(torch, args.seed, i, gr, dtype, sum(sp[gr]), None)
            ins = lay_out(torch, list(t.split(sp[gr])), "views" if layout == "aliased" else layout)
            if layout == "aliased":
                outs = ins
            else:
                outs = lay_out(torch, [torch.full((sp[r][gr],), 77, dtype=getattr(torch, dtype))
                                       for r in range(n)], layout)
            want = received(sp)
            w = dist.all_to_all(outs, ins, group=g, async_op=asy)
            check = compare(outs, want, dtype, None)
        elif kind == "coalesced":
            inner, results, wants = op["inner"], [], []
            manager = dist._coalescing_manager(group=g, device=torch.device("cpu") if op["on_device"] else None,
                                               async_ops=asy)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                with manager as cm:
                    for k, c in enumerate(op["counts"]):
                        piece = lambda r, width=1, k=k, c=c: make_input(  # noqa: E731
                            torch, args.seed, i * 8 + k, r, dtype, c, redop, width)
                        if inner == "all_reduce":
                            t = piece(gr)
                            wants.append(reduce_ref(torch, [piece(r) for r in range(n)], redop, dtype))
                            dist.all_reduce(t, op=getattr(RO, redop), group=g)
                        elif inner == "all_gather_into_tensor":
                            t = torch.full((c * n,), 77, dtype=getattr(torch, dtype))
                            wants.append(torch.cat([piece(r) for r in range(n)]))
                            dist.all_gather_into_tensor(t, piece(gr), group=g)
                        else:
                            t = torch.full((c,), 77, dtype=getattr(torch, dtype))
                            wants.append(my_reduced_block(piece, c))
                            dist.reduce_scatter_tensor(t, piece(gr, n), op=getattr(RO, redop), group=g)
                        results.append(t)
            w = cm if asy else None
            check = compare(results, torch.cat(wants) if wants else torch.empty(0), dtype, redop)
            where += f" of {inner} x{len(op['counts'])} {'on a device' if op['on_device'] else 'no device'}"
        elif kind == "batch_p2p":
            ways = (1, -1) if op["both_ways"] else (1,)
            p2ps, results, wants = [], [], []
            for k, way in enumerate(ways):
                to, frm = (gr + way) % n, (gr - way) % n
                t = torch.full((count,), 77, dtype=getattr(torch, dtype))
                p2ps.append(dist.P2POp(dist.isend, make_input(torch, args.seed, i * 8 + k, gr, dtype, count, None),
                                       members[to], group=g))
                p2ps.append(dist.P2POp(dist.irecv, t, members[frm], group=g))
                results.append(t)
                wants.append(make_input(torch, args.seed, i * 8 + k, frm, dtype, count, None))
            reqs = dist.batch_isend_irecv(p2ps)
            if not asy:
                for req in reqs:
                    req.wait()
            w = reqs if asy else None
            check = compare(results, torch.cat(wants), dtype, None)
        elif kind == "gather":
            t = inp(gr)
            is_root = gr == op["root"]
            outs = [torch.full((count,), 77, dtype=getattr(torch, dtype)) for _ in range(n)] if is_root else None
            w = dist.gather(t, gather_list=outs, dst=root_global, group=g, async_op=asy)
            if is_root:
                want = torch.cat([inp(r) for r in range(n)])
                check = compare(outs, want, dtype, None)
            else:
                check = lambda: None  # noqa: E731
        elif kind == "scatter":
            is_root = gr == op["root"]
            ins = [inp(r) for r in range(n)] if is_root else None
            out = torch.full((count,), 77, dtype=getattr(torch, dtype))
            w = dist.scatter(out, scatter_list=ins, src=root_global, group=g, async_op=asy)
            want = inp(gr)
            check = compare(out, want, dtype, None)
        elif kind == "send_recv":
            src, dst = op["src"], op["dst"]
            tag = i % 10007
            if gr == src:
                t = inp(src)
                if asy:
                    w = dist.isend(t, dst=members[dst], group=g, tag=tag)
                else:
                    dist.send(t, dst=members[dst], group=g, tag=tag)
                    w = None
                check = lambda: None  # noqa: E731
            elif gr == dst:
                t = torch.full((count,), 77, dtype=getattr(torch, dtype))
                if asy:
                    w = dist.irecv(t, src=members[src], group=g, tag=tag)
                else:
                    dist.recv(t, src=members[src], group=g, tag=tag)
                    w = None
                want = inp(src)
                check = compare(t, want, dtype, None)
            else:
                continue
        else:
            raise AssertionError(kind)

        checker = (lambda check=check, where=where: (lambda e: f"{where}: {e}" if e else None)(check()))
        if asy and w is not None:
            pending.append((i, w if isinstance(w, list) else [w], checker))
            if len(pending) >= WINDOW:
                drain(False)
        else:
            if w is not None and hasattr(w, "wait"):
                w.wait()
            err = checker()
            checked += 1
            if err:
                wrong.append(f"op {i}: {err}")
        if i % 500 == 0:
            write_report("running")
    drain(True)
    dist.barrier()
    write_report("done")
    dist.destroy_process_group()


# ---------------------------------------------------------------------------- the launcher


def launch(args):
    out = args.out or tempfile.mkdtemp(prefix="ringx-soak-")
    os.makedirs(out, exist_ok=True)
    limit = args.limit or (120 + args.ops * 0.05 * args.world_size)
    port = free_port()
    procs = []
    t0 = time.time()
    for r in range(args.world_size):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.world_size),
                   LOCAL_WORLD_SIZE=str(args.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        cmd = [sys.executable, os.path.abspath(__file__), "--world-size", str(args.world_size), "--ops",
               str(args.ops), "--seed", str(args.seed), "--max-count", str(args.max_count), "--timeout",
               str(args.timeout), "--backend", args.backend, "--out", out]
        if args.self_check:
            cmd.append("--self-check")
        log = open(os.path.join(out, f"rank{r}.log"), "wb")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), log))
    hung = []
    try:
        while time.time() - t0 < limit and any(p.poll() is None for p, _ in procs):
            time.sleep(0.2)
        hung = [r for r, (p, _) in enumerate(procs) if p.poll() is None]
    finally:
        for p, log in procs:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            p.wait()
            log.close()
    wall = time.time() - t0
    reports, crashed, wrong, by_kind = [], [], 0, {}
    for r, (p, _) in enumerate(procs):
        path = os.path.join(out, f"rank{r}.json")
        rep = json.load(open(path)) if os.path.exists(path) else {"status": "none", "n_wrong": 0, "wrong": []}
        reports.append(rep)
        if r not in hung and (p.returncode != 0 or rep["status"] != "done"):
            crashed.append(r)
        wrong += rep["n_wrong"]
        for k, v in rep.get("by_kind", {}).items():
            by_kind[k] = by_kind.get(k, 0) + v
    ok = not hung and not crashed and wrong == 0
    for r, rep in enumerate(reports):
        for line in rep.get("wrong", [])[:10]:
            print(f"rank {r}: WRONG {line}")
        if r in crashed or r in hung:
            with open(os.path.join(out, f"rank{r}.log"), errors="replace") as f:
                tail = f.read()[-3000:]
            print(f"--- rank {r} ({'hung' if r in hung else f'exit {procs[r][0].returncode}'}), "
                  f"status {rep['status']}, log tail:\n{tail}")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items()))
    if args.self_check:
        n = sum(rep.get("self_check", [0, 0])[0] for rep in reports)
        print(f"soak: self-check: {n} results changed on purpose, "
              f"{sum(rep.get('self_check', [0, 0])[1] for rep in reports)} of them passed the check (must be 0)")
    print(f"soak: {'PASS' if ok else 'FAIL'} {args.ops} ops in {wall:.1f} s ({args.world_size} ranks, "
          f"backend {args.backend}), {wrong} wrong, {len(hung)} hung, {len(crashed)} crashed; "
          f"rank-ops by kind: {kinds}")
    if not args.out and ok:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    elif not ok:
        print(f"soak: logs in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    a = parse()
    if "RANK" in os.environ:
        worker(a)
    else:
        sys.exit(launch(a))
