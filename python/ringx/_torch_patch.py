"""How ``import ringx`` puts its wrapper around a function of torch.distributed, and
how a wrapper tells a ringx group from another.

torch itself and users find these functions both in ``distributed_c10d`` and under
``torch.distributed``; both names get the wrapper, once however often ringx is imported.
"""

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from . import _C


def is_ringx(group, device=None):
    """Whether `group` (None: the default group) runs ringx on `device` (None: the CPU)."""
    target = _c10d._get_default_group() if group is None else group
    try:
        backend = target._get_backend(device if device is not None else torch.device("cpu"))
    except Exception:  # noqa: BLE001 - no such backend: not ours
        return False
    return isinstance(backend, _C.ProcessGroupRingx)


def wrap(name, make_wrapper):
    """Replaces torch's function `name` by make_wrapper(torch's function)."""
    current = getattr(_c10d, name, None)
    if current is None or getattr(current, "_ringx_wrapped", False):
        return
    wrapped = make_wrapper(current)
    wrapped._ringx_wrapped = True
    setattr(_c10d, name, wrapped)
    if getattr(dist, name, None) is current:
        setattr(dist, name, wrapped)
