"""The torch.backends entry point: init_process_group(backend="ringx") in a script that
never imports ringx works under torchrun, and TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off.

Only meaningful for ringx; each run is a real `python -m torch.distributed.run` with
2 workers, bounded by a timeout that kills its whole process group.
"""

import importlib.metadata
import os
import signal
import subprocess
import sys

import pytest

import harness

pytestmark = pytest.mark.skipif(
    harness.BACKEND != "ringx", reason="tests ringx's own torch.backends entry point")

TIMEOUT = 240

SCRIPT = '''\
import datetime
import sys

import torch
import torch.distributed as dist

NAME = "ringx"
try:
    dist.init_process_group(backend=NAME, timeout=datetime.timedelta(seconds=60))
except Exception as e:
    print(f"INIT_FAILED {type(e).__name__}: {e}", flush=True)
    sys.exit(3)
rank, ws = dist.get_rank(), dist.get_world_size()
t = torch.full((5,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((5,), ws * (ws + 1) / 2)), t
assert dist.get_backend() == NAME, dist.get_backend()
print(f"ENTRY_OK rank={rank} backend={dist.get_backend()}", flush=True)
dist.destroy_process_group()
'''


def run_bounded(cmd, env, timeout=TIMEOUT):
    """Run cmd in its own session; on timeout kill the whole group. (rc, output)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s; output:\n{out[-6000:]}")
    finally:
        try:  # torchrun's workers must not outlive it
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return p.returncode, out


def _torchrun(tmp_path, extra_env):
    names = [ep.name for ep in importlib.metadata.entry_points(group="torch.backends")]
    assert "ringx" in names, (f"no 'ringx' torch.backends entry point is installed (found {names}); "
                              "install ringx into this venv (pip install .)")
    script = tmp_path / "entry_script.py"
    script.write_text(SCRIPT)
    assert "import ringx" not in SCRIPT
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env.update(OMP_NUM_THREADS="1", **extra_env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(script)]
    return run_bounded(cmd, env)


def test_entry_point_autoloads_backend(tmp_path):
    rc, out = _torchrun(tmp_path, {})
    assert rc == 0, f"torchrun exited {rc}:\n{out[-6000:]}"
    for rank in (0, 1):
        assert f"ENTRY_OK rank={rank} backend=ringx" in out, out[-6000:]


def test_autoload_disabled_fails_naming_backend(tmp_path):
    rc, out = _torchrun(tmp_path, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert rc != 0, f"expected failure with autoload off; output:\n{out[-6000:]}"
    lines = [line for line in out.splitlines() if "INIT_FAILED" in line]
    assert lines, f"init_process_group did not fail as expected:\n{out[-6000:]}"
    assert all("ringx" in line for line in lines), "\n".join(lines)
