"""Ending a ringx coalescing block that its body leaves by an exception.

torch's ``_coalescing_manager`` ends a block (submits what it captured, calls the
backend's ``endCoalescing``) only when its body returns. A body that raises leaves the
group capturing: torch keeps appending the group's later all_reduces to its list, and the
backend keeps holding its later calls, so they silently never run. For ringx groups the
manager is wrapped so that such a block is ended as if its body had returned, then the
body's exception goes on; other backends' blocks behave as torch makes them.
"""

import contextlib
import functools
import sys
import warnings

from . import _torch_patch


def _ending_on_exception(manager):
    @functools.wraps(manager)
    @contextlib.contextmanager
    def _coalescing_manager(group=None, device=None, async_ops=False):
        block = manager(group, device, async_ops)
        cm = block.__enter__()
        try:
            yield cm
        except Exception as raised:
            if not _torch_patch.is_ringx(group, device):
                if not block.__exit__(*sys.exc_info()):
                    raise
                return
            try:
                block.__exit__(None, None, None)
            except Exception as ending:  # noqa: BLE001 - the body's exception comes first
                note = (f"ringx: ending the coalescing block also failed: "
                        f"{type(ending).__name__}: {ending}")
                if hasattr(raised, "add_note"):
                    raised.add_note(note)
                else:  # Python 3.10
                    warnings.warn(note, RuntimeWarning, stacklevel=3)
            raise
        block.__exit__(None, None, None)

    return _coalescing_manager


def install():
    """Wraps torch's manager where torch itself (batch_isend_irecv) and users
    (``dist._coalescing_manager``) find it."""
    _torch_patch.wrap("_coalescing_manager", _ending_on_exception)
