"""ringx: a torch.distributed backend with its own ring and tree collectives over UCX.

Importing this package registers the backend name "ringx" for CPU and CUDA
devices, so ``torch.distributed.init_process_group(backend="ringx")`` works.
Installing the package also registers a ``torch.backends`` entry point, so
the import happens by itself when torch loads (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns that off).
"""



def _autoload():
    """The torch.backends entry point: importing the package registers it.

    Defined before anything imports torch: when a script imports ringx first,
    torch's import runs this entry point while ringx is still half-imported.
    """


import libucx  # noqa: E402

# UCX's libraries live in the libucx wheel; load them before our extension
# resolves its symbols against them.
libucx.load_library()

import torch.distributed as dist  # noqa: E402

from . import _C  # noqa: E402

__all__ = ["algorithms", "monitored_barrier"]
__version__ = "0.1.0"

algorithms = _C.algorithms


def _create_backend(dist_opts, backend_opts):
    return _C.ProcessGroupRingx(
        dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout
    )


def _register():
    if "ringx" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(
        "ringx", _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )


_register()


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """``torch.distributed.monitored_barrier`` for ringx groups.

    torch's own function refuses every backend but gloo before it reaches the
    backend; this one calls the group directly. Rank 0 waits for every other
    rank; a rank that does not arrive within ``timeout`` is named in the
    ``DistBackendError`` rank 0 raises (all missing ranks with
    ``wait_all_ranks=True``). As with any ringx timeout, the group is unusable
    afterwards.
    """
    group = group or dist.group.WORLD
    if timeout is None:
        timeout = dist.default_pg_timeout
    return group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
