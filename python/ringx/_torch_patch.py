"""How ``import ringx`` puts its wrapper around a function of torch.distributed.

torch itself and users find these functions both in ``distributed_c10d`` and under
``torch.distributed``; both names get the wrapper, once however often ringx is imported.
"""

import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d


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
