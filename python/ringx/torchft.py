"""torchft's reconfigurable process groups on ringx (``pip install ringx[torchft]``).

torchft keeps training across failures by rebuilding its process groups among
each quorum's members: ``configure(store_addr, replica_id, rank, world_size)``
drops the group it had (``abort``) and builds a new one on a fresh store prefix.
torchft ships gloo's and NCCL's; these are ringx's, used the same way::

    from ringx.torchft import ProcessGroupRingx
    manager = torchft.Manager(pg=ProcessGroupRingx(), ...)

``ProcessGroupRingx`` runs ringx in the training process, for CPU and CUDA
tensors. ``ProcessGroupBabyRingx`` runs it in a subprocess, as torchft's Baby
groups do, so that a group stuck in a collective can be killed with it.

A ringx group never blocks on a dead peer: a collective whose peer died fails
within about a second (faster than its timeout), and ``abort`` returns at once,
so ``errored()`` and the next quorum come without waiting out the timeout.
"""

from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

try:
    from torchft.process_group import ProcessGroupBaby, ProcessGroupWrapper
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("ringx.torchft needs torchft: pip install 'ringx[torchft]' (or pip install torchft)") from err

from torch.distributed import ProcessGroup as BaseProcessGroup
from torch.distributed import Store

from . import _C

__all__ = ["AbortOnFailure", "ProcessGroupRingx", "ProcessGroupBabyRingx"]


def _ringx_group(store: Store, rank: int, world_size: int, timeout: timedelta,
                 group_name: Optional[str] = None) -> BaseProcessGroup:
    """A torch ProcessGroup whose CPU and CUDA backend is one ringx backend, as
    init_process_group(backend="ringx") builds it."""
    pg = BaseProcessGroup(store, rank, world_size)
    pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
    backend = _C.ProcessGroupRingx(store, rank, world_size, timeout)
    if group_name is not None:
        pg._set_group_name(group_name)
    for device in ("cpu", "cuda"):
        pg._register_backend(torch.device(device), BaseProcessGroup.BackendType.CUSTOM, backend)
    return pg


class _ReportingWork(dist._Work):
    """A ringx Work whose ``wait()`` aborts its torchft group on a failure instead
    of raising it, as torchft's NCCL group does on a timeout: ``errored()`` then
    says so (with the cause), later calls find no group, and torchft's managed
    work meets the error in the Work's future (``Manager.wrap_future``), so the
    Manager skips the step and reconfigures. Raised from ``wait()``, torchft 0.2
    never builds its future chain, and its DDP hook fails on an assertion."""

    def __init__(self, group: "AbortOnFailure", work: dist._Work, pg: Optional[BaseProcessGroup]) -> None:
        super().__init__()
        self._group = group
        self._work = work
        self._pg = pg

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        except Exception as err:  # noqa: BLE001 - every failure goes to errored()
            self._group._fail(err, self._pg)
            return False

    def get_future(self) -> torch.futures.Future[Any]:
        return self._work.get_future()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self._work.block_current_stream()


class AbortOnFailure:
    """Mixed into a torchft ``ProcessGroupWrapper``: a collective whose ``wait()``
    fails aborts the group (``errored()`` names the cause) instead of raising, as
    torchft's NCCL group does on a timeout. ringx's group has it; torchft's gloo
    group can take it too (``class G(AbortOnFailure, ProcessGroupGloo)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._errored: Optional[Exception] = None

    def configure(self, *args: Any, **kwargs: Any) -> None:
        self._errored = None
        super().configure(*args, **kwargs)

    def _wrap_work(self, work: dist._Work, opts: object) -> dist._Work:
        return _ReportingWork(self, work, self._pg)

    def _fail(self, err: Exception, pg: Optional[BaseProcessGroup]) -> None:
        # A Work of a group that configure() has since replaced says nothing
        # of the group in use, which its failure must not abort.
        if pg is not self._pg:
            return
        if self._errored is None:
            self._errored = RuntimeError(f"ringx.torchft: the process group was aborted after: {err}")
        self.abort()

    def abort(self, errored: bool = True) -> None:
        # Set before the group goes, so that errored() tells the step that
        # raced with the abort why its collective failed.
        if errored and self._errored is None:
            self._errored = RuntimeError("ringx.torchft: the process group was aborted")
        super().abort(errored=errored)

    def errored(self) -> Optional[Exception]:
        return self._errored


class ProcessGroupRingx(AbortOnFailure, ProcessGroupWrapper):
    """torchft's reconfigurable process group on ringx, in the training process.

    Args:
        timeout: each collective's timeout, and the store's for reconfiguring.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)

    def configure(self, *args: Any, **kwargs: Any) -> None:
        # The old group is aborted once the new one is up, not before: the
        # process's groups share one UCX worker, which ends with the last of
        # them. Aborted first, the old group took the worker with it, and the
        # new one paid for a fresh worker and its wire-up to every peer: a
        # survivor's configure() took 29-79 ms on the 2-core VM, against 5-9
        # ms now that the survivors' endpoints serve the new group as they
        # are. configure() still returns only with the old group aborted, or
        # fails with it aborted, as torchft's do.
        old, self._pg = self._pg, None
        try:
            super().configure(*args, **kwargs)
        finally:
            if old is not None:
                old.abort()

    def _create_pg(self, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        name = None
        if self._group_rank is not None and self._group_world_size:
            name = f"torchft_quorum_{self._quorum_id}_rank_{self._group_rank % self._group_world_size}"
        return _ringx_group(store, rank, world_size, self._timeout, name)

    def getBackendName(self) -> str:
        return "torchft-ringx"


class ProcessGroupBabyRingx(ProcessGroupBaby):
    """torchft's subprocess ("baby") process group on ringx: the collectives run
    in a child process, which torchft kills to abort. Tensors move through
    shared memory (CPU) or CUDA IPC, as with torchft's other Baby groups."""

    @classmethod
    def _create_pg(cls, store: Store, rank: int, world_size: int) -> BaseProcessGroup:
        # A class method (torchft does not pickle the group into the child),
        # so the child's collectives take torch's default timeout.
        return _ringx_group(store, rank, world_size, timedelta(minutes=30))

    def getBackendName(self) -> str:
        return "torchft-baby-ringx"
