"""Cases on a group whose algorithms RINGX_ALGO forces.

ringx reads RINGX_ALGO when it builds a group, so a group made while it is set keeps
its algorithms for good. One world per size then serves every forced algorithm, a
group each, where a world started with the setting for each algorithm cost a start of
every rank (torch's and ringx's set-up) per algorithm and size.
"""

import os

import torch.distributed as dist

import harness

_GROUPS = {}


def _group(spec):
    if spec not in _GROUPS:
        saved = os.environ.get("RINGX_ALGO")
        os.environ["RINGX_ALGO"] = spec
        try:
            _GROUPS[spec] = dist.new_group()
        finally:
            if saved is None:
                del os.environ["RINGX_ALGO"]
            else:
                os.environ["RINGX_ALGO"] = saved
    return _GROUPS[spec]


def on_forced_group(spec, case, **kwargs):
    """case(**kwargs) on every rank with group= the world's group for RINGX_ALGO=spec."""
    return harness.resolve(case)(group=_group(spec), **kwargs)
