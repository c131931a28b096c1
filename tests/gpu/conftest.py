"""tests/gpu: ringx on CUDA tensors, for a machine with a GPU (`make test-gpu`).

Without one (torch.cuda.is_available() False), or with a ringx built without
CUDA, every test skips from one place with gpu_world.skip_reason(), so the
directory can sit in any test run and says in one line why it did nothing.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_world  # noqa: E402


@pytest.fixture(autouse=True)
def _needs_a_gpu():
    reason = gpu_world.skip_reason()
    if reason is not None:
        pytest.skip(reason)


def pytest_report_header(config):
    import torch

    reason = gpu_world.skip_reason()
    if reason is not None:
        return f"tests/gpu: all skipped: {reason}"
    return (f"tests/gpu: {torch.cuda.device_count()} GPU(s) ({torch.cuda.get_device_name(0)}), "
            f"world size {gpu_world.world_size()}")
