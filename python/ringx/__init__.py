"""ringx: a torch.distributed backend with its own ring and tree collectives over UCX.

Importing this package registers the backend name "ringx" for CPU and CUDA
devices, so ``torch.distributed.init_process_group(backend="ringx")`` works.
Installing the package also registers a ``torch.backends`` entry point, so
the import happens by itself when torch loads (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns that off).

A ringx built for another torch cannot load its extension. Imported by torch's
autoload, it then warns once and lets ``import torch`` succeed; imported
explicitly, it raises an ImportError that names both torch versions and the fix.
"""

import datetime as _datetime
import sys as _sys
import warnings as _warnings

try:
    from ._build_info import torch_version as _built_for_torch
    from ._build_info import version as __version__
except ImportError:  # an install without its build record: still never break torch
    _built_for_torch = __version__ = "unknown"

# Why the extension could not be loaded, when it could not.
_load_error = None


def _autoload():
    """The torch.backends entry point: importing the package registers it.

    Defined before anything imports torch: when a script imports ringx first,
    torch's import runs this entry point while ringx is still half-imported.
    When the import failed under torch's autoload, the half-loaded package is
    forgotten, so that a later explicit ``import ringx`` runs again and raises.
    """
    if _load_error is not None:
        for name in [n for n in _sys.modules if n == __name__ or n.startswith(__name__ + ".")]:
            del _sys.modules[name]


def _torch_in_use():
    torch = _sys.modules.get("torch")
    found = getattr(torch, "__version__", None)
    if found:
        return str(found)
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - only for the message
        return "unknown"


def _load_failure_message(err):
    import os

    if isinstance(err, ImportError) and str(err).startswith("ringx: "):
        return str(err)
    site = os.environ.get("RINGX_UCX_LIBRARY_PATH")
    if site and "undefined symbol" in str(err):
        return (f"ringx {__version__} could not load its extension against the UCX in "
                f"RINGX_UCX_LIBRARY_PATH={site}, which lacks what ringx calls ({err}); rebuild ringx "
                "against that UCX (README, \"Many hosts\": RINGX_UCX=system) or unset the variable")
    in_use = _torch_in_use()
    if in_use.split("+")[0] == _built_for_torch.split("+")[0]:
        which = f"it was built for torch {_built_for_torch}, and torch {in_use} is in use"
    else:
        which = f"it was built for torch {_built_for_torch}, but torch {in_use} is in use"
    return (
        f"ringx {__version__} could not load its extension: {which}. "
        "Rebuild ringx against the torch in use: "
        "pip install --no-build-isolation --force-reinstall ringx "
        "(from a ringx checkout: pip install --no-build-isolation --force-reinstall .). "
        f"The extension's error was: {type(err).__name__}: {err}"
    )


def _torch_autoload_depth():
    """While torch's import loads the torch.backends entry points: how many frames
    above the module's own frame torch's loader is (a warnings stacklevel); else None."""
    frame, depth = _sys._getframe(2), 2
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_import_device_backends" and "torch" in code.co_filename:
            return depth
        # warnings counts no frames of the import machinery.
        if not ("importlib" in code.co_filename and "_bootstrap" in code.co_filename):
            depth += 1
        frame = frame.f_back
    return None


def _version_tuple(text):
    parts = []
    for p in str(text).split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


# UCX's memory hooks (its own mmap, munmap and malloc) feed the registration
# caches of RDMA devices, which the libucx wheel has none of. They cost about
# 0.4 s per process at load, and they hang a child forked while another thread
# was inside munmap: the child's munmap calls the parent's cache, whose lock the
# fork copied held (seen in fault_scripts/fork_churn.py, 2026-11-30). So the
# wheel's UCX loads without them unless the user set UCX_MEM_* themselves; a
# site's UCX (RINGX_UCX_LIBRARY_PATH, a system build) keeps its defaults.
_MEMORY_HOOKS_OFF = {"UCX_MEM_EVENTS": "no", "UCX_MEM_MALLOC_HOOKS": "no", "UCX_MEM_MMAP_HOOK_MODE": "none"}


class _without_memory_hooks:
    """UCX reads these once, as it loads: set only for the load, so that other
    programs this process starts get UCX's defaults."""

    def __enter__(self):
        import os

        self._set = []
        if not any(name in os.environ for name in _MEMORY_HOOKS_OFF):
            for name, value in _MEMORY_HOOKS_OFF.items():
                os.environ[name] = value
                self._set.append(name)

    def __exit__(self, *exc):
        import os

        for name in self._set:
            os.environ.pop(name, None)
        return False


def _load_ucx():
    """Loads the UCX the extension binds to, before the extension: libraries
    already loaded under UCX's sonames are the ones the loader gives it.

    The libucx wheel's by default; RINGX_UCX_LIBRARY_PATH names the site's (its
    RDMA transports), and a ringx built against the site's UCX finds it where
    the system's loader looks. Returns the folder asked for, or None.
    """
    import os

    site = os.environ.get("RINGX_UCX_LIBRARY_PATH") or None
    if site is None and _built_ucx != "system":
        import libucx

        with _without_memory_hooks():
            libucx.load_library()
        return None
    import ctypes

    for name in ("libucm.so.0", "libucs.so.0", "libuct.so.0", "libucp.so.0"):
        path = os.path.join(site, name) if site else name
        try:
            # Lazily: libucm and libucs call each other, so the first cannot
            # bind every function until the second is loaded.
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | os.RTLD_LAZY)
        except OSError as err:
            where = f"RINGX_UCX_LIBRARY_PATH={site}" if site else "the system's library path"
            raise ImportError(f"ringx: cannot load UCX's {name} from {where}: {err}. Point "
                              "RINGX_UCX_LIBRARY_PATH at the folder holding the site's libucp.so.0, "
                              "or unset it to use the libucx wheel's UCX") from err
    return site


def _check_ucx_version(site):
    """A UCX older than the headers ringx was built with may lack what ringx
    calls: refuse it with the fix, rather than fail later in a collective."""
    running = _C._ucx()["version"]
    if _version_tuple(running) < _version_tuple(_built_ucx_version):
        where = f"RINGX_UCX_LIBRARY_PATH={site}" if site else "the system's library path"
        raise ImportError(f"ringx: the UCX from {where} is {running}, older than the UCX "
                          f"{_built_ucx_version} ringx was built against. Rebuild ringx against it "
                          "(README, \"Many hosts\": RINGX_UCX=system) or use a newer UCX")


try:
    from ._build_info import ucx as _built_ucx
    from ._build_info import ucx_version as _built_ucx_version
except ImportError:
    _built_ucx, _built_ucx_version = "wheel", "0"

try:
    _site_ucx = _load_ucx()

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as _c10d

    from . import _C

    if _site_ucx is not None:
        _check_ucx_version(_site_ucx)
except Exception as _err:  # noqa: BLE001 - every failure gets the same clear message
    _depth = _torch_autoload_depth()
    if _depth is None:
        raise ImportError(_load_failure_message(_err)) from _err
    _load_error = _load_failure_message(_err)
    # Attributed to torch's loader, the line the user's `import torch` led to.
    _warnings.warn(_load_error, RuntimeWarning, stacklevel=_depth)

__all__ = ["algorithms", "monitored_barrier"]


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


if _load_error is None:
    algorithms = _C.algorithms
    _register()
    from . import _coalescing, _monitored_barrier, _pg_timeout, _shrink

    _coalescing.install()
    _monitored_barrier.install()
    _pg_timeout.install()
    _shrink.install()


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """``torch.distributed.monitored_barrier`` for ringx groups.

    torch's own function refuses every backend but gloo before it reaches the
    backend; ``import ringx`` makes it call this one for ringx groups, which
    calls the group directly. Rank 0 waits for every other rank; a rank that
    does not arrive within ``timeout`` is named in the ``DistBackendError``
    rank 0 raises (all missing ranks with ``wait_all_ranks=True``). As with any
    ringx timeout, the group is unusable afterwards. Arguments as torch's: a
    float timeout is read as seconds, with torch's warning.
    """
    if _c10d._rank_not_in_group(group):
        _c10d._warn_not_in_group("monitored_barrier")
        return None
    if timeout is None:
        timeout = dist.default_pg_timeout
    elif isinstance(timeout, float):
        _warnings.warn(
            "Please specify timeout arg as a timedelta. "
            f"Converting current value of {timeout} assuming it represents seconds",
            stacklevel=2,
        )
        timeout = _datetime.timedelta(seconds=timeout)
    _c10d._check_valid_timeout(timeout)
    group = _c10d._get_default_group() if group is None else group
    return group.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
