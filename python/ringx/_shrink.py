"""torch's ``dist.shrink_group`` for ringx groups.

torch 2.13 builds the shrunk group itself once the backend returned it, and
makes two choices that do not fit ringx: it registers the backend under the
GLOO type for the CPU alone (so the shrunk group refuses CUDA tensors, which
ringx groups take, and reports itself as gloo to anything that reads the
type), and it keeps the parent's store, which an excluded rank may have taken
with it (an ``init_method=tcp://`` store lives in rank 0's process): cloning
it for the new group then waits out the store's timeout, and ``new_group`` on
a shrunk default group would use it too. ``import ringx`` wraps the step that
builds the group: a ringx group is registered as ringx groups are (the CUSTOM
type, for every device the parent served) on the store the survivors built it
on, which lives as long as they do. torch also names every group shrunk from
the same ranks alike (a hash of the parent's ranks), so the second of two
groups of the same ranks shrunk in one process failed to register ("A process
group is already registered under the name ..."); a ringx group is named after
its parent's name and the ranks that stay, which every survivor knows alike.
"""

import hashlib
import threading

import torch
from torch.distributed import distributed_c10d as _c10d

from . import _C, _torch_patch

_local = threading.local()


def _ringx_finalize(finalize):
    def _finalize_shrunk_group(group_info, excluded_ranks_set, new_backend):
        if not isinstance(new_backend, _C.ProcessGroupRingx):
            return finalize(group_info, excluded_ranks_set, new_backend)
        parent = group_info["process_group"]
        stay = [r for r in _c10d.get_process_group_ranks(parent) if r not in excluded_ranks_set]
        name = f"{_c10d._get_process_group_name(parent)}:shrunk:{stay}"
        _local.shrunk = {
            "store": new_backend._bootstrap_store(),
            "devices": list(parent._device_types),
            "name": hashlib.sha1(name.encode()).hexdigest(),
        }
        try:
            return finalize(group_info, excluded_ranks_set, new_backend)
        finally:
            _local.shrunk = None

    return _finalize_shrunk_group


def _survivors_store(extract):
    def _extract_group_metadata(target_pg):
        metadata = extract(target_pg)
        shrunk = getattr(_local, "shrunk", None)
        if shrunk is not None:
            metadata["store"] = shrunk["store"]
            metadata["new_group_name"] = shrunk["name"]
        return metadata

    return _extract_group_metadata


def _as_ringx_group(create):
    def _create_shrunk_process_group(new_backend, remaining_ranks, metadata, is_default_group):
        shrunk = getattr(_local, "shrunk", None)
        if shrunk is None:
            return create(new_backend, remaining_ranks, metadata, is_default_group)
        group_name = metadata["new_group_name"]
        store = _c10d.PrefixStore(f"{group_name}/", metadata["store"])
        pg = _c10d.ProcessGroup(store, new_backend.rank(), new_backend.size())
        custom = _c10d.ProcessGroup.BackendType.CUSTOM
        for device in shrunk["devices"] or [torch.device("cpu")]:
            pg._register_backend(torch.device(device), custom, new_backend)
        pg._set_default_backend(custom)
        if metadata.get("bound_device_id") is not None:
            pg.bound_device_id = metadata["bound_device_id"]
        pg._set_group_name(group_name)
        pg._set_group_desc(
            "default:shrunken" if is_default_group else f"{metadata['original_group_name']}:shrunk"
        )
        if metadata.get("backend_config") is not None:
            _c10d._world.pg_backend_config[pg] = metadata["backend_config"]
        return pg

    return _create_shrunk_process_group


def install():
    _torch_patch.wrap("_finalize_shrunk_group", _ringx_finalize)
    _torch_patch.wrap("_extract_group_metadata", _survivors_store)
    _torch_patch.wrap("_create_shrunk_process_group", _as_ringx_group)
