"""The targets of issues 12, 16 and 44 and the spread between repeats, computed from the
records of benchmarks/collectives.py (pure functions: they also run on a saved JSON,
`collectives.py --summary FILE.json`).

Every check returns rows (case, measured, target, verdict): verdict is "met", "MISSED"
or "n/a" (what it needs was not measured in this run, with the reason). With repeats,
a point's time is the median over repeats of its per-repeat p50.
"""

from __future__ import annotations

import statistics

from _collectives_report import MPI_LABELS, SHORT, SIZELESS, bus_factor

# ringx on a world of 1 (torch's call path + ringx's submit/complete), issue 12; a run
# that includes world 1 measures it instead.
FLOOR_US = 4.4
SMALL = 4096
LARGE = 1 << 20
ISSUE16_MIN = 256 << 10
DATA_MOVEMENT = ["all_gather_into_tensor", "all_to_all_single", "all_to_allv", "broadcast", "gather",
                 "scatter"]
REDUCTIONS = ["all_reduce", "reduce_scatter_tensor"]


def _human(b: int) -> str:
    for unit, sh in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << sh and b % (1 << sh) == 0:
            return f"{b >> sh} {unit}"
    return f"{b} B"


class Points:
    """The ok points, merged over repeats: time = median of the repeats' p50s."""

    def __init__(self, records):
        self.repeats = sorted({r.get("repeat", 0) for r in records if r.get("kind") == "point"}) or [0]
        self.runs = self._runs_of(records, "time_us")
        self.time = self._medians(self.runs)
        self.after_last = self._medians(self._runs_of(records, "after_last_p50_us"))
        self.skew = self._medians(self._runs_of(records, "skew_p50_us"))
        self.cpu = self._medians(self._runs_of(records, "cpu_us"))
        self.status = {}
        for r in records:
            if r.get("kind") == "point" and r.get("status") != "ok":
                self.status[(r.get("pattern", "back-to-back"), r["world"], r["coll"], r["size"],
                             r["backend"])] = r.get("status")
        cm = {}
        for r in records:
            if r.get("kind") == "cma" and r.get("status") == "ok":
                cm.setdefault((r["world"], r["coll"], r["size"]), []).append(r["bound_us"])
        self.bound = {k: statistics.median(v) for k, v in cm.items()}

    @staticmethod
    def _runs_of(records, field):
        """{(pattern, world, coll, size, backend): [field of each repeat]} over the ok points."""
        runs = {}
        for r in records:
            if r.get("kind") == "point" and r.get("status") == "ok" and field in r:
                key = (r.get("pattern", "back-to-back"), r["world"], r["coll"], r["size"], r["backend"])
                runs.setdefault(key, []).append(r[field])
        return runs

    @staticmethod
    def _medians(runs):
        return {k: statistics.median(v) for k, v in runs.items()}

    def t(self, pattern, n, coll, size, backend):
        return self.time.get((pattern, n, coll, size, backend))

    def busbw(self, pattern, n, coll, size, backend):
        t = self.t(pattern, n, coll, size, backend)
        return size / t / 1e3 * bus_factor(coll, n) if t else None

    def bound_busbw(self, n, coll, size):
        b = self.bound.get((n, coll, size))
        return size / b / 1e3 * bus_factor(coll, n) if b else None

    def keys(self, pattern=None, n=None, coll=None, backend="ringx"):
        return sorted({(k[1], k[2], k[3]) for k in self.time
                       if k[4] == backend and (pattern is None or k[0] == pattern)
                       and (n is None or k[1] == n) and (coll is None or k[2] == coll)})

    def mpis(self):
        return [b for b in MPI_LABELS if any(k[4] == b for k in self.time)]

    def unsupported(self, n, coll, backend="ringx"):
        return any(v == "unsupported" for k, v in self.status.items()
                   if k[1] == n and k[2] == coll and k[4] == backend)


def _verdict(ok):
    return "met" if ok else "MISSED"


def _worst(items, higher_is_worse=True):
    """items: (value, where); the worst one or None."""
    items = [it for it in items if it[0] is not None]
    if not items:
        return None
    return max(items) if higher_is_worse else min(items)


def issue12(records, meta) -> list[tuple]:
    pts = Points(records)
    rows = []
    b2b = "back-to-back"
    floor = pts.t(b2b, 1, "all_reduce", 8, "ringx")
    floor_src = "measured at world 1" if floor else "issue 12's figure"
    floor = floor or FLOOR_US
    # 1. 8 B all_reduce, back to back, world 2.
    t = pts.t(b2b, 2, "all_reduce", 8, "ringx")
    lim = floor + 3.6
    rows.append(("8 B all_reduce w2, back to back", f"{t:.1f} us" if t else "not measured",
                 f"<= {lim:.1f} us (floor {floor:.1f}, {floor_src}, + 3.6)", _verdict(t <= lim) if t else "n/a"))
    # 2. every collective <= 4 KiB, back to back, world 2: <= max(2x Open MPI, floor + 6).
    items = []
    for n, c, s in pts.keys(b2b, 2):
        if s > SMALL:
            continue
        rx, mpi = pts.t(b2b, n, c, s, "ringx"), pts.t(b2b, n, c, s, "mpi")
        if mpi is None:
            continue
        limit = max(2 * mpi, floor + 6)
        items.append((rx / limit, f"{SHORT[c]} {_human(s)}: ringx {rx:.1f} us, Open MPI {mpi:.1f} us"))
    w = _worst(items)
    rows.append(("every collective <= 4 KiB w2, back to back",
                 f"worst ringx/limit {w[0]:.2f} ({w[1]})" if w else "not measured (needs ringx and mpi)",
                 "<= max(2x Open MPI, floor + 6 us): ratio <= 1", _verdict(w[0] <= 1) if w else "n/a"))
    # 3. compute-gap and interleaved <= 4 KiB: p50 <= 1.5x ringx's own back-to-back p50.
    for pat in ("compute-gap", "interleaved"):
        items = []
        for n, c, s in pts.keys(pat):
            if s > SMALL or n < 2:
                continue
            base = pts.t(b2b, n, c, s, "ringx")
            if base:
                items.append((pts.t(pat, n, c, s, "ringx") / base, f"{SHORT[c]} w{n} {_human(s)}"))
        w = _worst(items)
        rows.append((f"{pat} <= 4 KiB, ringx / its back-to-back",
                     f"worst {w[0]:.2f}x ({w[1]})" if w else "not measured",
                     "<= 1.5x", _verdict(w[0] <= 1.5) if w else "n/a"))
        rows.append(_after_last_row(pts, pat))
    # 4. any pattern, size, collective: ringx <= 0.5x gloo.
    items = []
    gloos = [g for g in ("gloo", "gloo-tcp") if any(k[4] == g for k in pts.time)]
    for pat in meta.get("patterns", [b2b]):
        for n, c, s in pts.keys(pat):
            if n < 2:  # world 1 measures the floor, not a collective
                continue
            gl = [pts.t(pat, n, c, s, g) for g in gloos]
            gl = [x for x in gl if x]
            if gl:
                items.append((pts.t(pat, n, c, s, "ringx") / min(gl),
                              f"{SHORT[c]} w{n} {_human(s)} {pat}"))
    w = _worst(items)
    rows.append(("any pattern, size, collective: ringx / gloo", f"worst {w[0]:.2f} ({w[1]})" if w else
                 "not measured", "<= 0.5", _verdict(w[0] <= 0.5) if w else "n/a"))
    # 5. world 4, 8 B all_reduce.
    t = pts.t(b2b, 4, "all_reduce", 8, "ringx")
    rows.append(("8 B all_reduce w4, back to back", f"{t:.1f} us" if t else "not measured", "<= 30 us",
                 _verdict(t <= 30) if t else "n/a"))
    # 6. repeats.
    rows += repeat_rows(pts, "ringx")
    rows.append(("DDP exposed communication", "not measured here", "<= 0.4x gloo (make bench-ddp)", "n/a"))
    return rows


def _after_last_row(pts, pat):
    """Where a pattern's time goes: the same ratio counting only what a call took after
    the last rank entered it (what the backend can change; the rest is the ranks' arrival
    skew, which the pattern makes). Not a target of its own: it says which part missed."""
    items = []
    for n, c, s in pts.keys(pat):
        if s > SMALL or n < 2:
            continue
        base = pts.t("back-to-back", n, c, s, "ringx")
        after = pts.after_last.get((pat, n, c, s, "ringx"))
        if base and after is not None:
            skew = pts.skew.get((pat, n, c, s, "ringx"), 0.0)
            items.append((after / base, f"{SHORT[c]} w{n} {_human(s)}: {after:.1f} us after the last "
                          f"arrival, skew {skew:.1f} us, back to back {base:.1f} us"))
    w = _worst(items)
    return (f"{pat} <= 4 KiB, after the last rank entered / back-to-back",
            f"worst {w[0]:.2f}x ({w[1]})" if w else "not measured" if not pts.keys(pat)
            else "not measured (this run's records have no phase stamps)",
            "none: it explains the row above (<= 1.5x: the arrival skew made the miss)", "why")


def spread(pts, backend):
    """{(pattern, world, coll, size): worst/best p50 over the repeats} for one backend."""
    return {k[:4]: max(v) / min(v) for k, v in pts.runs.items() if k[4] == backend and len(v) > 1}


def repeat_rows(pts, backend) -> list[tuple]:
    n_rep = len(pts.repeats)
    sp = spread(pts, backend)
    rows = []
    for name, pred, lim in (("sizes >= 1 MiB", lambda s: s >= LARGE, 1.3), ("sizes <= 4 KiB",
                                                                              lambda s: s <= SMALL, 2.0)):
        items = [(r, f"{SHORT[c]} w{n} {_human(s)} {p}") for (p, n, c, s), r in sp.items() if pred(s)]
        w = _worst(items)
        bad = sum(1 for r, _ in items if r > lim)
        case = f"{n_rep} repeats, worst/best p50 per point, {name}"
        if n_rep < 2 or not w:
            rows.append((case, "needs --repeats >= 2 (the target is stated for 5)", f"<= {lim}", "n/a"))
        else:
            rows.append((case, f"worst {w[0]:.2f} ({w[1]}); {bad} of {len(items)} points over",
                         f"<= {lim}" + ("" if n_rep >= 5 else f" (stated for 5 repeats, ran {n_rep})"),
                         _verdict(w[0] <= lim)))
    return rows


def issue16(records, meta) -> list[tuple]:
    pts = Points(records)
    b2b = "back-to-back"
    mpis = pts.mpis()
    rows = []
    worlds = sorted({k[1] for k in pts.time})
    for c in DATA_MOVEMENT + REDUCTIONS:
        for n in worlds:
            sizes = [s for (_, _, s) in pts.keys(b2b, n, c) if s >= ISSUE16_MIN]
            if pts.unsupported(n, c):
                rows.append((f"{SHORT[c]} w{n} >= 256 KiB busbw", "ringx unsupported", "", "MISSED"))
                continue
            if not sizes:
                continue
            items, na = [], 0
            for s in sizes:
                rx = pts.busbw(b2b, n, c, s, "ringx")
                mp = [x for x in (pts.busbw(b2b, n, c, s, m) for m in mpis) if x]
                bb = pts.bound_busbw(n, c, s)
                if not mp:
                    na += 1
                    continue
                best = max(mp)
                if c in REDUCTIONS:
                    items.append((rx / (2 * best), f"{_human(s)}: {rx:.2f} vs MPI {best:.2f} GB/s"))
                elif bb is not None and 1.2 * best > bb:
                    items.append((rx / (0.9 * bb), f"{_human(s)}: {rx:.2f} vs bound {bb:.2f} GB/s"))
                else:
                    items.append((rx / (1.2 * best), f"{_human(s)}: {rx:.2f} vs MPI {best:.2f} GB/s"))
            w = _worst(items, higher_is_worse=False)
            target = ">= 2x the better MPI" if c in REDUCTIONS else \
                ">= 1.2x the better MPI (or >= 90% of the bound where that is above it)"
            if not w:
                rows.append((f"{SHORT[c]} w{n} >= 256 KiB busbw", "no MPI measurement", target, "n/a"))
                continue
            bad = sum(1 for r, _ in items if r < 1)
            rows.append((f"{SHORT[c]} w{n} >= 256 KiB busbw",
                         f"worst {w[0]:.2f} of target ({w[1]}); {bad} of {len(items)} sizes short", target,
                         _verdict(w[0] >= 1)))
    for c in DATA_MOVEMENT + REDUCTIONS:
        for n in worlds:
            items = []
            for _, _, s in pts.keys(b2b, n, c):
                b = pts.bound.get((n, c, s))
                t = pts.t(b2b, n, c, s, "ringx")
                if s >= LARGE and b and t:
                    items.append((b / t, f"{_human(s)}: bound {b:.0f} us, ringx {t:.0f} us"))
            w = _worst(items, higher_is_worse=False)
            if w:
                bad = sum(1 for r, _ in items if r < 0.8)
                rows.append((f"{SHORT[c]} w{n} >= 1 MiB, bound / ringx time",
                             f"worst {w[0]:.0%} ({w[1]}); {bad} of {len(items)} sizes short", ">= 80%",
                             _verdict(w[0] >= 0.8)))
    return rows


def issue44(records, meta) -> list[tuple]:
    """Many ranks on few cores, back to back, 8 B-4 KiB and barrier, per world and collective:
    ringx's worst time over the better MPI's (<= 1.5x) and its worst CPU per call over that
    MPI's (<= 2x), each over the sizes both measured."""
    pts = Points(records)
    b2b = "back-to-back"
    mpis = pts.mpis()
    rows = []
    for n in sorted({k[1] for k in pts.time}):
        for c in REDUCTIONS + DATA_MOVEMENT + sorted(SIZELESS):
            sizes = [s for (_, _, s) in pts.keys(b2b, n, c) if s <= SMALL]
            if not sizes:
                continue
            case = f"{SHORT[c]} w{n}" + ("" if c in SIZELESS else " <= 4 KiB")
            if not mpis:
                rows.append((case, "no MPI measurement", "time <= 1.5x, CPU <= 2x", "n/a"))
                continue
            for field, lim, what in (("time", 1.5, "time"), ("cpu", 2.0, "CPU per call")):
                table = pts.time if field == "time" else pts.cpu
                items = []
                for s in sizes:
                    rx = table.get((b2b, n, c, s, "ringx"))
                    mp = [(table.get((b2b, n, c, s, m)), pts.t(b2b, n, c, s, m), m) for m in mpis]
                    mp = [x for x in mp if x[0] and x[1]]
                    if rx is None or not mp:
                        continue
                    best = min(mp, key=lambda x: x[1])  # the MPI with the better time
                    items.append((rx / best[0], f"{_human(s)}: {rx:.1f} vs {best[2]} {best[0]:.1f} us"))
                w = _worst(items)
                if not w:
                    continue
                bad = sum(1 for r, _ in items if r > lim)
                rows.append((f"{case} {what}",
                             f"worst {w[0]:.2f}x ({w[1]}); {bad} of {len(items)} sizes over",
                             f"<= {lim}x the better MPI", _verdict(w[0] <= lim)))
    return rows


def format_rows(title, rows) -> list[str]:
    if not rows:
        return [f"# {title}: nothing measured"]
    w0 = max(len(r[0]) for r in rows)
    out = [f"# {title}"]
    for case, measured, target, verdict in rows:
        out.append(f"#   {verdict:>6}  {case:<{w0}}  {measured}  [target {target}]")
    met = sum(1 for r in rows if r[3] == "met")
    missed = sum(1 for r in rows if r[3] == "MISSED")
    unmeasured = sum(1 for r in rows if r[3] == "n/a")
    out.append(f"#   {title}: {met} met, {missed} missed, {unmeasured} not measured")
    return out


def spread_table(records, backends) -> list[str]:
    """Per backend and size class, the worst/best ratio over repeats (the machine's noise
    shows in the peers' spread too)."""
    pts = Points(records)
    if len(pts.repeats) < 2:
        return []
    out = [f"# spread over {len(pts.repeats)} repeats: worst/best p50 per point "
           "(median and worst over the points of each size class)"]
    for b in backends:
        sp = spread(pts, b)
        if not sp:
            continue
        cells = []
        for name, pred in (("<= 4 KiB", lambda s: s <= SMALL), ("4 KiB-1 MiB", lambda s: SMALL < s < LARGE),
                           (">= 1 MiB", lambda s: s >= LARGE)):
            v = sorted(r for k, r in sp.items() if pred(k[3]))
            if v:
                cells.append(f"{name}: median {statistics.median(v):.2f} worst {v[-1]:.2f}")
        out.append(f"#   {b:>8}  " + ";  ".join(cells))
    return out


def summary(records, meta) -> dict:
    """The rows of the issues, for the JSON."""
    return {"issue12": [list(r) for r in issue12(records, meta)],
            "issue16": [list(r) for r in issue16(records, meta)],
            "issue44": [list(r) for r in issue44(records, meta)]}
