"""torch's ``monitored_barrier`` for ringx groups.

torch 2.13's ``dist.monitored_barrier`` refuses every backend but gloo in Python
("monitored_barrier is only implemented for GLOO backend.") before it reaches the
backend, although ``ProcessGroup.monitored_barrier`` reaches any backend that implements
it, ringx included. ``import ringx`` wraps the function so that a group whose CPU backend
is ringx runs ringx's monitored barrier; every other group goes to torch's own function,
as before.
"""

import functools

import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from . import _torch_patch


def _also_for_ringx(monitored_barrier):
    @functools.wraps(monitored_barrier)
    def wrapped(group=None, timeout=None, wait_all_ranks=False):
        if not dist.is_initialized() or _c10d._rank_not_in_group(group) or not _torch_patch.is_ringx(group):
            return monitored_barrier(group, timeout, wait_all_ranks)
        from . import monitored_barrier as ringx_monitored_barrier

        return ringx_monitored_barrier(group, timeout, wait_all_ranks)

    return wrapped


def install():
    _torch_patch.wrap("monitored_barrier", _also_for_ringx)
