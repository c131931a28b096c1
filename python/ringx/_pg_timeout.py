"""torch's ``_set_pg_timeout`` for ringx groups.

torch 2.13 sets the new timeout only on gloo and NCCL backends and warns for the
others ("Set timeout is now only supported for either nccl or gloo"), although
``Backend.set_timeout`` reaches any backend that implements it, ringx included.
``import ringx`` wraps the function so that a group's ringx backends take the
timeout too, through that call; the group's other backends are left to torch's
own function, as before.
"""

import torch.distributed.distributed_c10d as _c10d

from . import _C, _torch_patch


def _ringx_and_other_backends(group):
    ringx, other = [], []
    for device in group._device_types:
        backend = group._get_backend(device)
        (ringx if isinstance(backend, _C.ProcessGroupRingx) else other).append(backend)
    return ringx, other


def _also_for_ringx(set_pg_timeout):
    def _set_pg_timeout(timeout, group=None):
        target = _c10d._get_default_group() if group is None else group
        if _c10d._rank_not_in_group(target) or not isinstance(target, _c10d.ProcessGroup):
            return set_pg_timeout(timeout, group)
        ringx, other = _ringx_and_other_backends(target)
        if other or not ringx:
            set_pg_timeout(timeout, group)
        for backend in ringx:
            backend.set_timeout(timeout)

    return _set_pg_timeout


def install():
    _torch_patch.wrap("_set_pg_timeout", _also_for_ringx)
