"""ringx on CUDA tensors (needs a GPU: see conftest.py and README, CUDA)."""

import pytest

import gpu_cases
import gpu_world


def _check(problems):
    assert not problems, "\n".join(problems)


# Every data path (RINGX_CUDA_PATH), the staged one also in pieces (a small
# RINGX_CUDA_STAGE_BYTES) and with a blocking wait(); ipc also through small
# buffers (each op in many rounds). On ipc the calls it does not take
# (uneven all_to_all, send/recv) run staged.
PATHS = {
    "staged": {},
    "staged-pieces": {"RINGX_CUDA_STAGE_BYTES": "65536"},
    "staged-blocking": {"RINGX_BLOCKING_WAIT": "1"},
    "resident": {"RINGX_CUDA_PATH": "resident"},
    "ipc": {"RINGX_CUDA_PATH": "ipc"},
    "ipc-rounds": {"RINGX_CUDA_PATH": "ipc", "RINGX_CUDA_IPC_BYTES": "65536"},
    "ipc-blocking": {"RINGX_CUDA_PATH": "ipc", "RINGX_BLOCKING_WAIT": "1"},
}
path = pytest.mark.parametrize("env", list(PATHS.values()), ids=list(PATHS))


@path
def test_all_reduce_every_op_and_dtype(env):
    _check(gpu_world.run(gpu_cases.all_reduce_matrix, env=env, seed=1))


@path
def test_data_movement_collectives(env):
    _check(gpu_world.run(gpu_cases.data_movement, env=env, seed=2))


@path
def test_caller_stream_pending_then_work_after_wait(env):
    _check(gpu_world.run(gpu_cases.pending_caller_stream, env=env, seed=3))


@path
def test_two_collectives_on_two_streams(env):
    _check(gpu_world.run(gpu_cases.two_streams, env=env, seed=4))


@pytest.mark.parametrize("hook", [None, "allreduce_hook", "fp16_compress_hook", "ringx_bf16_compress_hook"])
def test_ddp_step(hook):
    _check(gpu_world.run(gpu_cases.ddp_step, seed=5, hook=hook))


@pytest.mark.parametrize("backend", ["ringx", "cuda:ringx,cpu:gloo"])
def test_device_id_and_backend_string(backend):
    _check(gpu_world.run(gpu_cases.routed_to_ringx, backend=backend, seed=6))


def test_ipc_path_is_taken_where_it_applies(tmp_path):
    env = {"RINGX_CUDA_PATH": "ipc", "RINGX_DEBUG": "INFO"}
    _check(gpu_world.run(gpu_cases.ipc_taken, env=env, seed=7, log_path=str(tmp_path / "rank.log")))


def test_ddp_step_on_ipc():
    _check(gpu_world.run(gpu_cases.ddp_step, env={"RINGX_CUDA_PATH": "ipc"}, seed=5, hook=None))
