"""tests/gpu/device_run.sh, the prepared GPU run, as far as a machine without a GPU
can check it: its dry run names every step and exits cleanly, and what the GPU
machine will run parses."""

import os
import py_compile
import shutil
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(REPO, "tests", "gpu", "device_run.sh")
STEPS = ["build", "smoke", "contexts", "tests/gpu, the ipc cases", "ipc all_reduce one_shot, world 3",
         "ipc all_reduce two_shot, world 3", "ipc all_reduce ring, world 3", "nccl all_reduce, world 1",
         "bench staged, world 2", "bench staged beside nccl, world 1", "tests/gpu"]


def dry_run(tmp_path, *args):
    out = tmp_path / "out"
    return subprocess.run(["bash", SCRIPT, *args, str(tmp_path / "wheels")], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "OUT": str(out)}), out


def test_the_dry_run_names_every_step_and_exits_cleanly(tmp_path):
    r, out = dry_run(tmp_path, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    for step in STEPS:
        assert f"s {step}: would run" in r.stdout, (step, r.stdout)
    assert "no libucx_cu13 wheel" in r.stdout
    assert "dry run: nothing ran" in (out / "steps.log").read_text()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a machine with nvidia-smi may have a GPU")
def test_without_a_gpu_it_falls_back_to_the_dry_run(tmp_path):
    r, _ = dry_run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no GPU here" in r.stdout and "nothing ran" in r.stdout


def test_the_scripts_the_gpu_machine_runs_compile():
    for name in ("smoke.py", "contexts.py", "gpu_cases.py", "gpu_world.py"):
        py_compile.compile(os.path.join(REPO, "tests", "gpu", name), doraise=True)
    subprocess.run(["bash", "-n", SCRIPT], check=True)
