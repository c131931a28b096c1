"""Tables, the two-shot bound, ratio summaries, issue-4 targets and the plot for
benchmarks/collectives.py. Pure formatting over the records the ranks write
(the issue-12 and issue-16 targets and the repeat spread: _collectives_targets.py).

Columns (nccl-tests conventions)
--------------------------------
size      bytes of the largest buffer of the call: the buffer (all_reduce, broadcast),
          the gathered output (all_gather, gather), the input (reduce_scatter, the
          scatter root's), either buffer (all_to_all; all_to_allv: n times the mean
          split); 0 for barrier, which moves no data (one row). count = size / element
          size.
pattern   what the caller does between calls: b2b (back to back), gap (computes for
          --gap-us), inter (an 8-byte all_reduce on a second gloo group).
time(us)  median (p50) over iterations of the per-iteration time of the SLOWEST rank
          (per iteration, MAX across ranks); p90 of that same series.
algbw     size / time, GB/s (1e9 bytes); "-" for barrier, as busbw.
busbw     algbw * factor: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all(v),
          gather, scatter (n-1)/n; broadcast, reduce 1. It is the rate each rank's link
          would need, comparable across world sizes and with the hardware's bandwidth.
#wrong    timed iterations whose result was wrong on some rank (each is checked).
cpu(us)   CPU per call: user + system time of every thread of every rank over the timed
          calls, summed over the ranks, divided by the calls (the calling thread's own
          work in a pattern's gap left out). A rank that spins while it waits costs CPU
          here whether or not it shortens the time; n ranks each busy for the whole call
          give n x time(us).
cma GB/s  the single-copy bound's copy rate: the bytes one rank must read, read with
          process_vm_readv from the same ranks' buffers (_collectives_cma.py).
bound     the single-copy bound's time (us); ringx/bnd = bound / ringx's b2b time.
"""

from __future__ import annotations

import math

GLOO_LABELS = {"torchrun": "gloo", "tcp": "gloo-tcp"}
# Append new collectives: the issue-4 rows in targets() take the first five by position.
COLLS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
         "all_to_all_single", "all_to_allv", "gather", "scatter", "barrier"]
SHORT = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
         "reduce_scatter_tensor": "reduce_scatter", "broadcast": "broadcast",
         "all_to_all_single": "all_to_all", "all_to_allv": "all_to_allv", "gather": "gather",
         "scatter": "scatter", "barrier": "barrier"}
# No payload: measured once, at size 0, with no bandwidth and nothing to check.
SIZELESS = {"barrier"}
PATTERN_SHORT = {"back-to-back": "b2b", "compute-gap": "gap", "interleaved": "inter"}
MPI_LABELS = ("mpi", "mpich")
CELL = 52  # width of one backend's group of columns


def bus_factor(coll: str, n: int) -> float:
    if coll == "all_reduce":
        return 2 * (n - 1) / n
    if coll in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "all_to_allv",
                "gather", "scatter"):
        return (n - 1) / n
    return 1.0


def two_shot_time_s(nbytes: float, n: int, memcpy_Bps: float, add_Bps: float) -> float:
    """Lower bound on one all_reduce of `nbytes` on one host, two-shot through shared memory.

    Each of the n ranks, on its own core, in three phases:

      1. copy in:   its N input bytes into its shared buffer             N / memcpy
      2. reduce:    its slice of N/n bytes from the n shared buffers,
                    written where the others will read it           (N/n) * (n+1)/3 / add
      3. copy out:  the other n-1 reduced slices into its output  N (n-1)/n / memcpy

    memcpy is the one-core copy rate (bytes copied per second) and add the one-core
    rate of c = a + b (bytes of c per second), both on buffers much larger than the
    last-level cache. c = a + b moves 3 bytes per output byte; a fused n-way reduce
    moves n + 1, hence the factor (n+1)/3 (exactly 1 for n = 2, where phase 2 is one
    a + b over N/2 bytes). The phases of one rank cannot overlap (each waits for the
    others' previous phase), so the bound is their sum:

      T(N, n) = N/memcpy + (N/n)(n+1)/(3 add) + N(n-1)/(n memcpy)

    and the busbw it allows is N/T * 2(n-1)/n. It ignores synchronisation, so it
    can't be reached; it assumes one core per rank (false for n = 4 on 2 cores, where
    the rates measured with every rank copying at once give the honest figure).
    """
    return (nbytes / memcpy_Bps + (nbytes / n) * (n + 1) / 3 / add_Bps
            + nbytes * (n - 1) / n / memcpy_Bps)


def bound_busbw(bound: dict, n: int, concurrent: bool = False) -> float:
    """busbw (GB/s) of the two-shot bound; independent of N (the model is linear)."""
    cp = bound["memcpy_concurrent_Bps" if concurrent else "memcpy_Bps"]
    add = bound["add_concurrent_Bps" if concurrent else "add_Bps"]
    nb = float(1 << 26)
    return nb / two_shot_time_s(nb, n, cp, add) * bus_factor("all_reduce", n) / 1e9


def bound_lines(bound: dict, n: int) -> list[str]:
    mib = bound["buffer_bytes"] >> 20
    return [
        f"# bound ({bound['dtype']}, {mib} MiB buffers, best of {bound['reps']}, 1 thread):",
        f"#   one core alone:        memcpy {bound['memcpy_Bps'] / 1e9:6.2f} GB/s   "
        f"a+b {bound['add_Bps'] / 1e9:6.2f} GB/s (output bytes)",
        f"#   all {n} ranks at once:  memcpy {bound['memcpy_concurrent_Bps'] / 1e9:6.2f} GB/s   "
        f"a+b {bound['add_concurrent_Bps'] / 1e9:6.2f} GB/s (slowest rank)",
        f"#   two-shot all_reduce bound, world {n}: busbw {bound_busbw(bound, n):6.2f} GB/s "
        f"(one-core rates); {bound_busbw(bound, n, True):6.2f} GB/s (concurrent rates)",
    ]


def _fmt_t(us: float) -> str:
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def table_header(coll, n, dtype, labels, status, patterns=("back-to-back",), gap_us=0,
                 bound_cols=True, inter_backend="gloo") -> list[str]:
    head = f"# {coll}, world {n}, {dtype}"
    notes = [f"{lb}: {st}" for lb, st in status.items() if st != "ok"]
    lines = [head + ("   (" + "; ".join(notes) + ")" if notes else "")]
    if len(patterns) > 1 or patterns[0] != "back-to-back":
        desc = {"back-to-back": "b2b = back to back", "compute-gap": f"gap = {gap_us:g} us of compute before each call",
                "interleaved": f"inter = an 8 B {inter_backend} all_reduce on a second group before each call"}
        lines.append("# patterns: " + "; ".join(desc[p] for p in patterns))
    top = f"#{'':>51} |"
    sub = f"# {'size':>10} {'count':>10} {'type':>9} {'redop':>6} {'pattern':>7}     |"
    for lb in labels:
        top += f" {lb:^{CELL - 2}} |"
        sub += f" {'time(us)':>8} {'p90':>8} {'cpu(us)':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6} |"
    if bound_cols:
        top += f" {'single-copy bound':^27}"
        sub += f" {'cma GB/s':>8} {'bound':>8} {'ringx/bnd':>9}"
        if coll == "all_reduce" and "ringx" in labels:
            sub += " ringx/2shot"
    return lines + [top, sub]


def table_row(coll, n, size, count, dtype, labels, row, bound, pattern="back-to-back", single=None) -> str:
    redop = "sum" if coll in ("all_reduce", "reduce_scatter_tensor") else "none"
    s = f"  {size:>10} {count:>10} {dtype:>9} {redop:>6} {PATTERN_SHORT.get(pattern, pattern):>7}     |"
    for lb in labels:
        r = row.get(lb, {"status": "-"})
        if r.get("status") == "ok":
            cpu = _fmt_t(r["cpu_us"]) if "cpu_us" in r else "-"
            alg, bus = (f"{r[k]:7.3f}" if k in r else f"{'-':>7}" for k in ("algbw_GBps", "busbw_GBps"))
            s += (f" {_fmt_t(r['time_us']):>8} {_fmt_t(r['p90_us']):>8} {cpu:>8}"
                  f" {alg} {bus} {r['wrong']:>6} |")
        else:
            s += f" {r.get('status', '-')[:CELL - 2]:^{CELL - 2}} |"
    rx = row.get("ringx", {})
    if single and single.get("status") == "ok":
        s += f" {single['cma_GBps']:8.2f} {_fmt_t(single['bound_us']):>8}"
        s += f" {single['bound_us'] / rx['time_us']:9.1%}" if rx.get("status") == "ok" else f" {'-':>9}"
    elif single:
        s += f" {single['status'][:27]:>27}"
    else:
        s += f" {'':>27}"
    if coll == "all_reduce" and bound and n > 1 and rx.get("status") == "ok" and pattern == "back-to-back":
        s += f" {rx['busbw_GBps'] / bound_busbw(bound, n):10.1%}"
    return s.rstrip()


# ------------------------------------------------------------------ summaries


def index(records, pattern="back-to-back", repeat=0):
    """{(world, coll, size): {backend: record}} of one pattern and repeat (every point)."""
    pts = {}
    for r in records:
        if (r.get("kind") == "point" and "size" in r and r.get("pattern", "back-to-back") == pattern
                and r.get("repeat", 0) == repeat):
            pts.setdefault((r["world"], r["coll"], r["size"]), {})[r["backend"]] = r
    return pts


def _human(b: int) -> str:
    for unit, sh in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return f"{b >> sh} {unit}"
    return f"{b} B"


def gloo_roles(labels, shm_available):
    """(label of gloo over TCP, label of gloo's shared-memory path or None)."""
    tcp = "gloo-tcp" if "gloo-tcp" in labels else ("gloo" if "gloo" in labels and not shm_available else None)
    shm = "gloo" if shm_available and "gloo" in labels else None
    return tcp, shm


def ratio_tables(records, worlds, colls, gloo_labels) -> list[str]:
    pts = index(records)
    out = []
    for n in worlds:
        for g in gloo_labels:
            out.append(f"# ringx time / {g} time, world {n} (< 1: ringx faster; "
                       f"'unsup' = ringx lacks it)")
            out.append(f"# {'size':>10} " + " ".join(f"{SHORT[c]:>14}" for c in colls))
            sizes = sorted({s for (w, c, s) in pts if w == n})
            for s in sizes:
                cells = []
                for c in colls:
                    p = pts.get((n, c, s), {})
                    rx, gl = p.get("ringx", {}), p.get(g, {})
                    if rx.get("status") == "ok" and gl.get("status") == "ok":
                        cells.append(f"{rx['time_us'] / gl['time_us']:14.3f}")
                    elif rx.get("status") == "unsupported":
                        cells.append(f"{'unsup':>14}")
                    else:
                        cells.append(f"{'-':>14}")
                out.append(f"  {s:>10} " + " ".join(cells))
            out.append("")
    return out


def targets(records, meta) -> list[str]:
    """The issue-4 target rows with this run's ratios (each line says met / NOT met)."""
    pts = index(records)
    shm = meta["gloo_shm"]["available"]
    labels = meta["gloo_labels"]
    tcp_l, shm_l = gloo_roles(labels, shm)
    bounds = {r["world"]: r for r in records if r.get("kind") == "bound"}
    out = ["# issue-4 targets, measured in this run", ]
    if meta["dtype"] != "float32":
        out.append(f"#   (run used {meta['dtype']}; the targets are stated for float32)")

    def verdict(ok):
        return "met" if ok else "NOT met"

    def get(n, c, s, b):
        r = pts.get((n, c, s), {}).get(b, {})
        return r if r.get("status") == "ok" else None

    # 1. all_reduce world 2, 64 MiB busbw.
    s64 = 64 << 20
    rx = get(2, "all_reduce", s64, "ringx")
    line = "all_reduce w2 64 MiB busbw: "
    if rx is None:
        out.append("#   " + line + "no ringx measurement at 64 MiB in this run")
    else:
        line += f"ringx {rx['busbw_GBps']:.3f} GB/s"
        parts = [line]
        gt = get(2, "all_reduce", s64, tcp_l) if tcp_l else None
        if gt:
            r = rx["busbw_GBps"] / gt["busbw_GBps"]
            parts.append(f"vs gloo TCP {gt['busbw_GBps']:.3f}: {r:.2f}x (>= 3x: {verdict(r >= 3)})")
        gs = get(2, "all_reduce", s64, shm_l) if shm_l else None
        if gs:
            r = rx["busbw_GBps"] / gs["busbw_GBps"]
            parts.append(f"vs gloo shm {gs['busbw_GBps']:.3f}: {r:.2f}x (>= 1.3x: {verdict(r >= 1.3)})")
        elif not shm:
            parts.append("vs gloo shm: n/a (this torch's gloo has no shared-memory all_reduce)")
        if 2 in bounds:
            bb = bound_busbw(bounds[2], 2)
            r = rx["busbw_GBps"] / bb
            parts.append(f"vs two-shot bound {bb:.2f}: {r:.1%} (>= 80%: {verdict(r >= 0.8)})")
        out.append("#   " + ";\n#     ".join(parts))

    # 2. all_reduce world 2, 8 B - 4 KiB time.
    small = sorted(s for (w, c, s) in pts if w == 2 and c == "all_reduce" and s <= 4096)
    worst_tcp = worst_best = None
    for s in small:
        rx = get(2, "all_reduce", s, "ringx")
        if not rx:
            continue
        gts = [get(2, "all_reduce", s, g) for g in labels]
        gts = [g for g in gts if g]
        gt = get(2, "all_reduce", s, tcp_l) if tcp_l else None
        if gt:
            r = rx["time_us"] / gt["time_us"]
            worst_tcp = max(worst_tcp or (0, 0), (r, s))
        if gts:
            r = rx["time_us"] / min(g["time_us"] for g in gts)
            worst_best = max(worst_best or (0, 0), (r, s))
    if worst_tcp or worst_best:
        msg = "#   all_reduce w2 8 B-4 KiB time, worst size: "
        if worst_tcp:
            msg += (f"ringx/gloo TCP {worst_tcp[0]:.3f} at {_human(worst_tcp[1])} "
                    f"(<= 0.2: {verdict(worst_tcp[0] <= 0.2)})")
        if worst_best:
            msg += (f"; ringx/faster gloo {worst_best[0]:.3f} at {_human(worst_best[1])} "
                    f"(<= 0.5: {verdict(worst_best[0] <= 0.5)})")
        out.append(msg)
    else:
        out.append("#   all_reduce w2 8 B-4 KiB: not measured")

    # 3. other collectives world 2, >= 1 MiB busbw.
    for c in COLLS[1:5]:  # the collectives issue 4 names
        sizes = sorted(s for (w, cc, s) in pts if w == 2 and cc == c and s >= 1 << 20)
        rxs = [pts[(2, c, s)].get("ringx", {}) for s in sizes]
        if any(r.get("status") == "unsupported" for r in rxs):
            out.append(f"#   {SHORT[c]} w2 >= 1 MiB busbw: ringx unsupported (NOT met)")
            continue
        worst = None
        for s in sizes:
            rx = get(2, c, s, "ringx")
            gts = [g for g in (get(2, c, s, lb) for lb in labels) if g]
            if rx and gts:
                r = rx["busbw_GBps"] / max(g["busbw_GBps"] for g in gts)
                worst = min(worst or (math.inf, 0), (r, s))
        if worst:
            out.append(f"#   {SHORT[c]} w2 >= 1 MiB busbw, worst size: ringx/gloo {worst[0]:.2f}x at "
                       f"{_human(worst[1])} (>= 2x: {verdict(worst[0] >= 2)})")
        else:
            out.append(f"#   {SHORT[c]} w2 >= 1 MiB: not measured")

    # 4. every collective world 4, every size.
    for c in COLLS[:5]:
        keys = sorted(s for (w, cc, s) in pts if w == 4 and cc == c)
        if not keys:
            continue
        if any(pts[(4, c, s)].get("ringx", {}).get("status") == "unsupported" for s in keys):
            out.append(f"#   {SHORT[c]} w4 time: ringx unsupported (NOT met)")
            continue
        worst = None
        for s in keys:
            rx = get(4, c, s, "ringx")
            gts = [g for g in (get(4, c, s, lb) for lb in labels) if g]
            if rx and gts:
                r = rx["time_us"] / min(g["time_us"] for g in gts)
                worst = max(worst or (0, 0), (r, s))
        if worst:
            out.append(f"#   {SHORT[c]} w4 time, worst size: ringx/gloo {worst[0]:.3f} at "
                       f"{_human(worst[1])} (<= 0.5: {verdict(worst[0] <= 0.5)})")
    return out


def key_numbers(records, worlds, gloo_labels) -> list[str]:
    """all_reduce at 8 B, 4 KiB, 1 MiB, 64 MiB: the numbers people ask for first."""
    pts = index(records)
    out = ["# all_reduce key sizes: median time (us) and busbw (GB/s) of the slowest rank"]
    for n in worlds:
        for s in (8, 4096, 1 << 20, 64 << 20):
            p = pts.get((n, "all_reduce", s))
            if not p:
                continue
            cells = []
            for b in ["ringx"] + list(gloo_labels):
                r = p.get(b, {})
                if r.get("status") == "ok":
                    cells.append(f"{b} {_fmt_t(r['time_us'])} us / {r['busbw_GBps']:.3f} GB/s")
                else:
                    cells.append(f"{b} {r.get('status', '-')}")
            rx = p.get("ringx", {})
            best = [p[g] for g in gloo_labels if g not in MPI_LABELS and p.get(g, {}).get("status") == "ok"]
            ratio = ""
            if rx.get("status") == "ok" and best:
                ratio = f"  ratio ringx/gloo {rx['time_us'] / min(g['time_us'] for g in best):.3f}"
            out.append(f"#   w{n} {_human(s):>7}: " + ";  ".join(cells) + ratio)
    return out if len(out) > 1 else []


# ----------------------------------------------------------------------- plot


def _series(records, n, coll, backend, pattern, key):
    pts = index(records, pattern)
    out = sorted((s, p[backend][key]) for (w, c, s), p in pts.items()
                 if w == n and c == coll and p.get(backend, {}).get("status") == "ok")
    return [x for x, _ in out], [y for _, y in out]


def plot(records, meta, path) -> str | None:
    """PNG: per collective, busbw and time against size back to back (one line per
    backend x world, the single-copy bound in black), and the time of every pattern at
    the first world size (one line per backend x pattern)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    # A sizeless collective has no point on a log size axis and no busbw.
    colls = [c for c in meta["colls"] if c not in SIZELESS
             and any(r.get("coll") == c and r.get("kind") == "point" for r in records)]
    if not colls:
        return "nothing to plot"
    backends = ["ringx"] + list(meta.get("gloo_labels", [])) + list(meta.get("mpi_labels", []))
    patterns = meta.get("patterns", ["back-to-back"])
    bounds = {r["world"]: r for r in records if r.get("kind") == "bound"}
    fig, axes = plt.subplots(len(colls), 3, figsize=(19, 3.4 * len(colls)), squeeze=False)
    colors = {"ringx": "tab:red", "gloo": "tab:blue", "gloo-tcp": "tab:green", "mpi": "tab:purple",
              "mpich": "tab:orange"}
    styles = {2: "-", 4: "--", 8: ":"}
    pstyles = {"back-to-back": "-", "compute-gap": "--", "interleaved": ":"}
    n0 = meta["worlds"][0]
    for i, c in enumerate(colls):
        axb, axt, axp = axes[i]
        for n in meta["worlds"]:
            for b in backends:
                xs, bw = _series(records, n, c, b, "back-to-back", "busbw_GBps")
                _, tm = _series(records, n, c, b, "back-to-back", "time_us")
                if xs:
                    kw = dict(color=colors.get(b, "gray"), linestyle=styles.get(n, "-."), marker=".")
                    axb.plot(xs, bw, label=f"{b} w{n}", **kw)
                    axt.plot(xs, tm, label=f"{b} w{n}", **kw)
            cm = sorted((r["size"], r) for r in records if r.get("kind") == "cma" and r["world"] == n
                        and r["coll"] == c and r.get("status") == "ok" and r.get("repeat", 0) == 0)
            if cm:
                xs = [s for s, _ in cm]
                kw = dict(color="black", linestyle=styles.get(n, "-."), linewidth=0.8, marker="x",
                          label=f"single-copy bound w{n}")
                if n > 1:  # busbw is 0 at world 1
                    axb.plot(xs, [s / r["bound_us"] / 1e3 * bus_factor(c, n) for s, r in cm], **kw)
                axt.plot(xs, [r["bound_us"] for _, r in cm], **kw)
            if c == "all_reduce" and n in bounds and n > 1:
                axb.axhline(bound_busbw(bounds[n], n), color="gray", linestyle=styles.get(n, "-."),
                            linewidth=0.8, label=f"two-shot bound w{n}")
        for b in backends:
            for pt in patterns:
                xs, tm = _series(records, n0, c, b, pt, "time_us")
                if xs:
                    axp.plot(xs, tm, color=colors.get(b, "gray"), linestyle=pstyles.get(pt, "-."), marker=".",
                             label=f"{b} {PATTERN_SHORT.get(pt, pt)}")
        for ax, yl, title in ((axb, "busbw (GB/s)", "back to back"),
                              (axt, "time (us), slowest rank, p50", "back to back"),
                              (axp, "time (us), slowest rank, p50", f"patterns, world {n0}")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel(yl)
            ax.set_title(f"{c} ({meta['dtype']}), {title}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6)
    fig.suptitle(meta.get("machine", ""), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def fits(records, worlds) -> list[str]:
    """ringx's latency (median time of the sizes <= 64 B) and bandwidth (least-squares
    slope of time against size over the sizes >= 1 MiB), per collective and world: the
    raw material of the cost model's alpha and beta (docs/benchmarks.md)."""
    pts = index(records)
    out = ["# ringx fits: latency = median time of sizes <= 64 B; "
           "bandwidth = 1 / slope of time over sizes >= 1 MiB (least squares)"]
    for n in worlds:
        for c in COLLS:
            pts_c = sorted((s, p["ringx"]["time_us"]) for (w, cc, s), p in pts.items()
                           if w == n and cc == c and p.get("ringx", {}).get("status") == "ok")
            if not pts_c:
                continue
            small = sorted(t for s, t in pts_c if s <= 64)
            big = [(s, t) for s, t in pts_c if s >= 1 << 20]
            lat = f"{small[len(small) // 2]:.1f} us" if small else "-"
            bw = "-"
            if len(big) >= 2:
                mx = sum(s for s, _ in big) / len(big)
                my = sum(t for _, t in big) / len(big)
                sxx = sum((s - mx) ** 2 for s, _ in big)
                slope = sum((s - mx) * (t - my) for s, t in big) / sxx  # us per byte
                icpt = my - slope * mx
                bw = (f"{1 / slope / 1e3:.3f} GB/s of size (slope {slope * 1e6:.3f} us/MB, "
                      f"intercept {icpt:.0f} us)") if slope > 0 else "slope <= 0 (too noisy)"
            out.append(f"#   {SHORT[c]:>14} w{n}: latency {lat}; bandwidth {bw}")
    return out
