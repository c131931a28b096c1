"""What the installed package says about itself: its version, the torch its metadata
requires, `python -m ringx`, the knob tables (README, docs/settings.md), and what torch's autoload does
when ringx's extension cannot load.

Each check runs a fresh interpreter of this venv, so it sees the package as a user would.
The mismatch between two real torch releases is tested by tests/compat (make torch-compat);
here the extension's failure is simulated by a `libucx` that cannot load.
"""

import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

import harness

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="tests ringx's own package")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 120


def python(*args, env=None, cwd=None):
    """Run this venv's python with args; (returncode, stdout, stderr)."""
    full = dict(os.environ)
    full.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    full.update(env or {})
    p = subprocess.run([sys.executable, *args], env=full, cwd=cwd, capture_output=True, text=True,
                       timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


@functools.cache
def info():
    """(ringx version, torch version ringx was built for, torch in use) from a fresh interpreter."""
    rc, out, err = python("-c", "import ringx, ringx._build_info as b, torch; "
                          "print(ringx.__version__); print(b.torch_version); print(torch.__version__)")
    assert rc == 0, err
    return tuple(out.split())


def test_version_comes_from_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        want = tomllib.load(f)["project"]["version"]
    version, _, _ = info()
    assert version == want
    assert importlib.metadata.version("ringx") == want


def test_wheel_requires_exactly_the_torch_it_was_built_for():
    _, built_for, in_use = info()
    assert built_for == in_use, "this venv's ringx was built against another torch: make build"
    torch_reqs = [r for r in importlib.metadata.requires("ringx") if re.match(r"torch\b", r)]
    assert torch_reqs == [f"torch=={built_for.split('+')[0]}"], torch_reqs


def test_cuda_build_info_is_consistent():
    """A CUDA build (RINGX_CUDA) names its architectures and needs a CUDA torch; a CPU build names none."""
    rc, out, err = python("-c", "import json, torch, ringx._build_info as b; "
                          "print(json.dumps([b.cuda, b.cuda_archs, torch.version.cuda]))")
    assert rc == 0, err
    cuda, archs, torch_cuda = json.loads(out)
    rc, report, err = python("-m", "ringx")
    assert rc == 0, err
    if cuda:
        assert torch_cuda, "ringx was built with CUDA but this torch is a CPU build"
        assert archs, "a CUDA build lists the architectures it was compiled for"
        assert f"CUDA on (architectures {', '.join(archs)})" in report, report
    else:
        assert archs == []
        assert "CUDA off" in report, report


def test_python_m_ringx_reports_what_a_bug_report_needs():
    rc, out, err = python("-m", "ringx", env={"RINGX_CHUNK_BYTES": "4096"})
    assert rc == 0, err
    version, built_for, in_use = info()
    lines = out.splitlines()
    assert lines[0].startswith(f"ringx {version} ("), out
    assert re.search(rf"built for torch {re.escape(built_for)}, with \S+ \d", out), out
    assert "CUDA off" in out or "CUDA on" in out, out
    assert re.search(r"^  CUDA data paths \(RINGX_CUDA_PATH\): staged, resident, ipc\b", out, re.M), out
    assert re.search(r"^  ipc all_reduce algorithms \(RINGX_IPC_ALGO\): auto, one_shot, two_shot, ring\b", out,
                     re.M), out
    assert re.search(r"CPU kernels for .*default; this CPU runs \S+", out), out
    assert f"torch {in_use} (" in out, out
    ucx = re.search(r"^UCX (\d+\.\d+\.\d+) \((\S+)\)$", out, re.M)
    assert ucx, out
    assert os.path.basename(ucx.group(2)).startswith("libucp"), ucx.group(2)
    assert os.path.exists(ucx.group(2)), ucx.group(2)
    assert re.search(r"^  ringx was built against UCX \d+\.\d+\.\d+ \(the (libucx wheel|system)'s\)$", out, re.M), out
    transports = re.search(r"^  transports: (.*)$", out, re.M).group(1).split(", ")
    for tl in ("self", "tcp", "posix"):
        assert any(t.startswith(tl + "/") for t in transports), transports
    assert re.search(r"^shared memory between ranks: (yes|NO) \(.+\)$", out, re.M), out
    assert re.search(r"^single copy \(CMA, process_vm_readv\): (yes|NO) \(.+\)$", out, re.M), out
    rc, names, err = python("-c", "from ringx import _C; print(' '.join(s['name'] for s in _C._settings()))")
    assert rc == 0, err
    for name in names.split():
        assert re.search(rf"^  [* ][= ] {name}\s+\S", out, re.M), f"{name} missing:\n{out}"
    assert re.search(r"^  \*= RINGX_CHUNK_BYTES\s+4096\s+\(default 262144\)$", out, re.M), out
    assert re.search(r"^   = RINGX_SHM_BYTES\s+\d+\s+\(default a quarter of one core's L2", out, re.M), out
    assert re.search(r"^   = RINGX_ALGO\s+unset\s+\(default unset \(cost model\)\)$", out, re.M), out


@pytest.mark.parametrize("doc", ["README.md", "docs/settings.md"])
def test_knob_table_is_the_settings_table(doc):
    rc, table, err = python("-m", "ringx", "--markdown-settings")
    assert rc == 0, err
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    block = re.search(r"<!-- settings-table: begin .*?-->\n(.*?)\n<!-- settings-table: end -->", text, re.S)
    assert block, f"{doc} has no settings-table markers"
    assert block.group(1).strip() == table.strip(), (
        f"{doc}'s knob table differs from the settings table in csrc/core/common/settings.cc; "
        "paste the output of `python -m ringx --markdown-settings` between its markers "
        "(README.md and docs/settings.md)")


@pytest.fixture
def broken_ucx(tmp_path):
    """A PYTHONPATH on which ringx's first import (libucx) fails, as a mismatched build would."""
    pkg = tmp_path / "libucx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('raise ImportError("simulated: this libucx cannot load")\n')
    return {"PYTHONPATH": str(tmp_path)}


def test_autoload_failure_is_one_warning_and_torch_imports(broken_ucx):
    rc, out, err = python("-c", "import torch; t = torch.ones(3); print('TORCH_OK', int(t.sum()))",
                          env=broken_ucx)
    assert rc == 0, f"import torch failed:\n{err[-4000:]}"
    assert "TORCH_OK 3" in out
    version, built_for, in_use = info()
    warnings = [line for line in err.splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1, err
    w = warnings[0]
    assert f"ringx {version} could not load its extension" in w, w
    assert f"built for torch {built_for}" in w and f"torch {in_use} is in use" in w, w
    assert "pip install --no-build-isolation --force-reinstall ringx" in w, w
    assert "simulated: this libucx cannot load" in w, w
    assert "Failed to load the backend extension" not in err, err


@pytest.mark.parametrize("code", ["import torch; import ringx", "import ringx"])
def test_explicit_import_raises_the_same_clear_message(broken_ucx, code):
    rc, out, err = python("-c", code, env=broken_ucx)
    assert rc != 0, out
    last = err.strip().splitlines()[-1]
    assert last.startswith("ImportError: ringx "), err[-4000:]
    assert "could not load its extension: it was built for torch" in last, last
    assert "pip install --no-build-isolation --force-reinstall ringx" in last, last
