"""Buffers, fill, check and the torch.distributed call of one (collective, size) on
one rank, for benchmarks/collectives.py; and the checker's self-test.

Data (exact in every dtype we offer: all values are small integers): P[j] = j % 7,
t the iteration number, c(r, t) = (r + t) % 5 + 1, S(t) = sum over ranks of c,
g(r, k, t) = (r*n + k + t) % 11 + 1, root = --root (or t % n when it rotates).

    all_reduce      in-place; rank r holds c(r,t) + P;      expect S(t) + n*P
    broadcast       root holds c(root,t) + P, others -1;     expect c(root,t) + P
    all_gather      rank r sends c(r,t) + P;                 expect segment k = c(k,t) + P
    reduce_scatter  rank r's row k is c(r,t) + k + P;        expect S(t) + n*r + n*P
    all_to_all      rank r's row k is g(r,k,t) + P;          expect row k = g(k,r,t) + P
    all_to_allv     as all_to_all, but row k of rank r has s(r,k) elements (uneven)
    gather          rank r sends c(r,t) + P;                 root expects segment k = c(k,t) + P
    scatter         root's row k is g(root,k,t) + P;         rank r expects g(root,r,t) + P
    barrier         no data (empty buffers, no fill);       nothing to check

A check subtracts the expected per-segment constant in place and compares with a
per-size base (n*P or P), so a stale buffer, a wrong sum and a misplaced segment all
show, and the check costs two passes over the output (untimed).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
    "int8": torch.int8, "uint8": torch.uint8,
}
REDUCING = {"all_reduce", "reduce_scatter_tensor"}
# Collectives whose size is split in n segments (the count is rounded down to a multiple of n).
SEGMENTED = {"all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "all_to_allv",
             "gather", "scatter"}
ROOTED = {"broadcast", "gather", "scatter"}

# torch 2.13 renamed the *_into_tensor / *_tensor forms to *_single (same backend call).
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def split(r: int, k: int, seg: int) -> int:
    """all_to_allv: elements rank r sends to rank k, between seg/2 and 3 seg/2; the rows
    of a rank have different lengths and so do the ranks' totals."""
    return seg + ((r + 2 * k) % 3 - 1) * (seg // 2)


class Case:
    """Buffers, fill and check for one (collective, size) on this rank."""

    def __init__(self, coll, count, dtype, n, rank, nbuf, root=0, device="cpu", separate=False):
        self.coll, self.n, self.rank, self.dtype, self.device = coll, n, rank, dtype, device
        # --rows separate: all_gather's outputs and gather's and scatter's rows are n
        # tensors of their own (the list form most code passes), not views of one tensor;
        # fill() and check() copy them to and from the tensor, untimed.
        self.separate = separate and coll in ("all_gather_into_tensor", "gather", "scatter")
        self.root_arg = root  # rooted collectives' root; -1: t % n, rotating
        seg = count // n if coll in SEGMENTED else count
        self.seg = seg
        self.P = torch.arange(7, dtype=dtype, device=device).repeat((seg + 6) // 7)[:seg].contiguous()
        if coll == "all_to_allv":
            # lens[r][k] = s(r, k); rank r's input rows are lens[r], its output rows lens[k][r].
            self.lens = [[split(r, k, seg) for k in range(n)] for r in range(n)]
            self.in_splits = self.lens[rank]
            self.out_splits = [self.lens[k][rank] for k in range(n)]
            self.in_rep = torch.tensor(self.in_splits, device=device)
            self.out_rep = torch.tensor(self.out_splits, device=device)
            pl = torch.arange(7, dtype=dtype, device=device).repeat((2 * seg + 6) // 7 + 1)
            self.base = torch.cat([pl[:s] for s in self.out_splits])
            self.base_in = torch.cat([pl[:s] for s in self.in_splits])
            in_count, out_count = sum(self.in_splits), sum(self.out_splits)
        else:
            in_count = {"all_gather_into_tensor": seg, "reduce_scatter_tensor": n * seg,
                        "all_to_all_single": n * seg, "gather": seg, "scatter": n * seg}.get(coll, seg)
            out_count = {"all_gather_into_tensor": n * seg, "reduce_scatter_tensor": seg,
                         "all_to_all_single": n * seg, "gather": n * seg, "scatter": seg}.get(coll, 0)
        self.in_count, self.out_count = in_count, out_count
        self.ins = [torch.zeros(in_count, dtype=dtype, device=device) for _ in range(nbuf)]
        self.outs = [torch.zeros(out_count, dtype=dtype, device=device) for _ in range(nbuf)] if out_count else None
        if self.separate:
            self.rows = [[torch.zeros(seg, dtype=dtype, device=device) for _ in range(n)] for _ in range(nbuf)]
        elif coll == "gather":
            self.rows = [list(o.view(n, seg).unbind(0)) for o in self.outs]
        elif coll == "scatter":
            self.rows = [list(i.view(n, seg).unbind(0)) for i in self.ins]
        if coll in ("all_reduce", "reduce_scatter_tensor"):
            self.base = self.P * n  # expected minus the constant
            self.nseg = 1
        elif coll in ("broadcast", "scatter"):
            self.base = self.P
            self.nseg = 1
        elif coll != "all_to_allv":  # every output segment is a constant + P
            self.base = self.P.expand(n, seg)
            self.nseg = n
        self.el = self.P.element_size()
        self.bytes_in = in_count * self.el

    def root(self, t):
        return t % self.n if self.root_arg < 0 else self.root_arg % self.n

    def c(self, r, t):
        return (r + t) % 5 + 1

    def g(self, r, k, t):
        return (r * self.n + k + t) % 11 + 1

    def fill(self, i, t):
        n, r, inp, coll = self.n, self.rank, self.ins[i], self.coll
        if coll == "barrier":
            return
        if coll in ("all_reduce", "all_gather_into_tensor", "gather"):
            torch.add(self.P, self.c(r, t), out=inp)
        elif coll == "broadcast":
            if r == self.root(t):
                torch.add(self.P, self.c(r, t), out=inp)
            else:
                inp.fill_(-1 if self.dtype != torch.uint8 else 255)
        elif coll == "all_to_allv":
            add = torch.tensor([self.g(r, k, t) for k in range(n)], dtype=self.dtype, device=self.device)
            torch.add(self.base_in, add.repeat_interleave(self.in_rep), out=inp)
        else:
            rows = inp.view(n, self.seg)
            rows.copy_(self.P.expand(n, self.seg))
            if coll == "reduce_scatter_tensor":
                add = [self.c(r, t) + k for k in range(n)]
            else:  # all_to_all; scatter, where only the root's rows are sent
                add = [self.g(r, k, t) for k in range(n)]
            rows.add_(torch.tensor(add, dtype=self.dtype, device=self.device).view(n, 1))
            if self.separate:
                for row, src in zip(self.rows[i], rows.unbind(0)):
                    row.copy_(src)

    def expected_consts(self, t):
        n, r = self.n, self.rank
        if self.coll == "all_reduce":
            return [sum(self.c(k, t) for k in range(n))]
        if self.coll == "broadcast":
            return [self.c(self.root(t), t)]
        if self.coll == "reduce_scatter_tensor":
            return [sum(self.c(k, t) for k in range(n)) + n * r]
        if self.coll in ("all_gather_into_tensor", "gather"):
            return [self.c(k, t) for k in range(n)]
        if self.coll == "scatter":
            return [self.g(self.root(t), r, t)]
        return [self.g(k, r, t) for k in range(n)]

    def result(self, i):
        return self.outs[i] if self.outs is not None else self.ins[i]

    def check(self, i, t):
        """Number of wrong elements in buffer i's result for iteration t (0 = right)."""
        if self.coll == "barrier":
            return 0  # no result: returning at all is its only effect
        if self.coll == "gather" and self.rank != self.root(t):
            return 0  # only the root receives
        out = self.result(i)
        if self.separate and self.coll != "scatter":
            torch.stack(self.rows[i], out=out.view(self.n, -1))
        k = torch.tensor(self.expected_consts(t), dtype=self.dtype, device=self.device)
        if self.coll == "all_to_allv":
            out.sub_(k.repeat_interleave(self.out_rep))
            return 0 if torch.equal(out, self.base) else int((out != self.base).sum())
        view = out.view(self.nseg, -1)
        view.sub_(k.view(self.nseg, 1))
        if torch.equal(view, self.base.view(self.nseg, -1)):
            return 0
        return int((view != self.base.view(self.nseg, -1)).sum())

    def op(self, group, i, t):
        """The collective on buffer i, through the public torch.distributed API."""
        inp = self.ins[i]
        c = self.coll
        if c == "all_reduce":
            dist.all_reduce(inp, group=group)
        elif c == "broadcast":
            dist.broadcast(inp, group=group, group_src=self.root(t))
        elif c == "all_gather_into_tensor":
            if self.separate:
                dist.all_gather(self.rows[i], inp, group=group)
            else:
                _ALL_GATHER(self.outs[i], inp, group=group)
        elif c == "reduce_scatter_tensor":
            _REDUCE_SCATTER(self.outs[i], inp, group=group)
        elif c == "all_to_all_single":
            dist.all_to_all_single(self.outs[i], inp, group=group)
        elif c == "all_to_allv":
            dist.all_to_all_single(self.outs[i], inp, self.out_splits, self.in_splits, group=group)
        elif c == "barrier":
            dist.barrier(group=group)
        elif c == "gather":
            root = self.root(t)
            dist.gather(inp, self.rows[i] if self.rank == root else None, group=group, group_dst=root)
        else:
            root = self.root(t)
            dist.scatter(self.outs[i], self.rows[i] if self.rank == root else None, group=group,
                         group_src=root)


# ------------------------------------------------------------------- self-test


def _emulate(coll, n, count, dtype, t, fault, root=-1):
    """Every rank's check() result after an emulated call (torch arithmetic on all
    inputs), optionally with a fault: 'elem' (one wrong element on the rank that must
    see it), 'noop' (the call did nothing), 'swap' (two segments swapped)."""
    cases = [Case(coll, count, dtype, n, r, 1, root) for r in range(n)]
    for c in cases:
        c.fill(0, t)
    ins = [c.ins[0].to(torch.float64) for c in cases]
    seg = cases[0].seg
    rt = cases[0].root(t)
    total = sum(ins) if coll in REDUCING else None
    for r, c in enumerate(cases):
        if coll == "all_reduce":
            res = total
        elif coll == "broadcast":
            res = ins[rt]
        elif coll == "all_gather_into_tensor":
            res = torch.cat(ins)
        elif coll == "gather":
            res = torch.cat(ins) if r == rt else c.outs[0].to(torch.float64)
        elif coll == "scatter":
            res = ins[rt][r * seg:(r + 1) * seg]
        elif coll == "reduce_scatter_tensor":
            res = total[r * seg:(r + 1) * seg]
        elif coll == "all_to_allv":
            offs = [sum(c.lens[k][:r]) for k in range(n)]
            res = torch.cat([ins[k][offs[k]:offs[k] + c.lens[k][r]] for k in range(n)])
        else:
            res = torch.cat([ins[k][r * seg:(r + 1) * seg] for k in range(n)])
        res = res.to(dtype).clone()
        if fault == "elem" and r == _fault_rank(coll, rt):
            res[-1] += 1
        if fault == "swap" and r == _fault_rank(coll, rt):
            res[:2 * seg] = torch.cat([res[seg:2 * seg], res[:seg]])
        if fault != "noop":
            c.result(0).copy_(res)
    return [c.check(0, t) for c in cases]


def _fault_rank(coll, root):
    return root if coll == "gather" else 1


def self_test() -> int:
    """The checker against emulated right and wrong results; returns the failures."""
    failures = 0
    colls = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
             "all_to_all_single", "all_to_allv", "gather", "scatter"]
    for name, dt in DTYPES.items():
        for coll in colls:
            for n in (2, 3, 4):
                for t in range(6):
                    cnt = 7 * n * 3
                    faults = ["ok", "elem", "noop"] + (
                        ["swap"] if coll in ("all_gather_into_tensor", "all_to_all_single", "gather")
                        else [])
                    root = -1 if t % 2 else 1  # rotating and fixed roots
                    for f in faults:
                        got = _emulate(coll, n, cnt, dt, t, f, root)
                        rt = t % n if root < 0 else root % n
                        if f == "ok":
                            good = all(w == 0 for w in got)
                        elif f in ("elem", "swap"):
                            good = got[_fault_rank(coll, rt)] > 0
                        elif coll == "gather":
                            good = got[rt] > 0 and all(w == 0 for r, w in enumerate(got) if r != rt)
                        else:  # the root of a broadcast already holds its answer
                            good = all(w > 0 for r, w in enumerate(got)
                                       if not (coll == "broadcast" and r == rt))
                        if not good:
                            failures += 1
                            print(f"self-test: {coll} {name} n={n} t={t} {f}: wrong elems {got}")
    print(f"self-test: checker {'ok' if not failures else 'FAILED'} "
          f"({len(DTYPES)} dtypes x {len(colls)} collectives x worlds 2-4, right and faulty results)")
    return failures
