"""MPI as a measured backend of benchmarks/collectives.py, through mpi4py.

The ranks are started by `mpiexec` from the benchmark-only MPI venv (Makefile target
`bench-mpi-venv`), whose python also sees the main venv's packages (torch), so these
ranks run the same worker as the torch ranks: the same buffers (torch tensors, handed
to MPI by address), fills, checks, patterns and statistics. Only the call differs:

    all_reduce      MPI_Allreduce, in place          reduce_scatter  MPI_Reduce_scatter_block
    all_gather      MPI_Allgather                    all_to_all      MPI_Alltoall
    all_to_allv     MPI_Alltoallv (the same splits)  broadcast       MPI_Bcast
    gather          MPI_Gather                       scatter         MPI_Scatter
    barrier         MPI_Barrier

Data moves as MPI_BYTE; the reductions use the dtype's MPI type (float16 and bfloat16
have none in the MPI standard: reported as unsupported).
"""

from __future__ import annotations

import torch

from _collectives_cases import REDUCING

try:
    from mpi4py import MPI
except ImportError:  # the torch ranks never import this module's calls
    MPI = None


def _mpi_types():
    return {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE, torch.int32: MPI.INT32_T,
            torch.int64: MPI.INT64_T, torch.int8: MPI.INT8_T, torch.uint8: MPI.UINT8_T}


def library() -> str:
    return " ".join(MPI.Get_library_version().strip("\x00 \n").splitlines()[0].split())


class MpiVariant:
    """A backend as measured (the interface of the worker's TorchVariant): MPI_COMM_WORLD."""

    def __init__(self, label):
        self.label = label
        self.device = torch.device("cpu")  # MPI ranks work on host buffers
        self.comm = MPI.COMM_WORLD
        self.broken = None
        self._case = None
        self._bufs = None

    def enter(self):
        pass

    def leave(self, n):
        pass

    def sync(self):
        self.comm.Barrier()

    def _prepare(self, case):
        """MPI buffer specs per rotating buffer, built once per case (not in the timed loop)."""
        if case.coll in REDUCING and case.dtype not in _mpi_types():
            raise NotImplementedError(f"MPI does not support reductions in {case.dtype}")
        el, n = case.el, case.n
        dt = _mpi_types().get(case.dtype, MPI.BYTE) if case.coll in REDUCING else MPI.BYTE

        def spec(t):  # [buffer, type]: mpi4py takes the count from the length (per rank where blocked)
            return [MPI.buffer.fromaddress(t.data_ptr(), t.numel() * el), dt]

        bufs = []
        for i in range(len(case.ins)):
            b = {"in": spec(case.ins[i])}
            if case.outs is not None:
                b["out"] = spec(case.outs[i])
            if case.coll == "all_to_allv":
                sc = [s * el for s in case.in_splits]
                rc = [s * el for s in case.out_splits]
                sd = [sum(sc[:k]) for k in range(n)]
                rd = [sum(rc[:k]) for k in range(n)]
                b["in"] = [b["in"][0], (sc, sd), MPI.BYTE]
                b["out"] = [b["out"][0], (rc, rd), MPI.BYTE]
            bufs.append(b)
        self._case, self._bufs = case, bufs

    def call(self, case, i, t):
        if case.coll == "barrier":  # no buffers to hand over
            self.comm.Barrier()
            return
        if self._case is not case:
            self._prepare(case)
        b, c, comm = self._bufs[i], case.coll, self.comm
        if c == "all_reduce":
            comm.Allreduce(MPI.IN_PLACE, b["in"], op=MPI.SUM)
        elif c == "broadcast":
            comm.Bcast(b["in"], root=case.root(t))
        elif c == "all_gather_into_tensor":
            comm.Allgather(b["in"], b["out"])
        elif c == "reduce_scatter_tensor":
            comm.Reduce_scatter_block(b["in"], b["out"], op=MPI.SUM)
        elif c == "all_to_all_single":
            comm.Alltoall(b["in"], b["out"])
        elif c == "all_to_allv":
            comm.Alltoallv(b["in"], b["out"])
        elif c == "gather":
            root = case.root(t)
            comm.Gather(b["in"], b["out"] if case.rank == root else None, root=root)
        else:
            root = case.root(t)
            comm.Scatter(b["in"] if case.rank == root else None, b["out"], root=root)
