"""ringx on CUDA tensors (needs a GPU: see conftest.py and README, CUDA)."""

import pytest

import gpu_cases
import gpu_world


def _check(problems):
    assert not problems, "\n".join(problems)


def test_all_reduce_every_op_and_dtype():
    _check(gpu_world.run(gpu_cases.all_reduce_matrix, seed=1))


def test_data_movement_collectives():
    _check(gpu_world.run(gpu_cases.data_movement, seed=2))


def test_caller_stream_pending_then_work_after_wait():
    _check(gpu_world.run(gpu_cases.pending_caller_stream, seed=3))


def test_two_collectives_on_two_streams():
    _check(gpu_world.run(gpu_cases.two_streams, seed=4))


@pytest.mark.parametrize("hook", [None, "allreduce_hook", "fp16_compress_hook", "ringx_bf16_compress_hook"])
def test_ddp_step(hook):
    _check(gpu_world.run(gpu_cases.ddp_step, seed=5, hook=hook))


@pytest.mark.parametrize("backend", ["ringx", "cuda:ringx,cpu:gloo"])
def test_device_id_and_backend_string(backend):
    _check(gpu_world.run(gpu_cases.routed_to_ringx, backend=backend, seed=6))
