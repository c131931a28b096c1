"""A ringx wheel built for one torch release, beside another (make torch-compat).

Needs two venvs with different torch releases and a ringx wheel built in each, given by
RINGX_COMPAT_{A,B}_PYTHON and RINGX_COMPAT_{A,B}_WHEEL (the Makefile passes them). Checks:

* pip refuses to install either wheel together with the other venv's torch, and says
  which torch the wheel requires;
* forced in anyway (--no-deps, as an upgrade of torch after ringx does), `import torch`
  still works and warns once, naming both versions and the fix; `import ringx` raises an
  ImportError with that message; `pip check` names the broken requirement.
"""

import os
import re
import subprocess

import pytest

TIMEOUT = 300


def side(name):
    py, wheel = os.environ.get(f"RINGX_COMPAT_{name}_PYTHON"), os.environ.get(f"RINGX_COMPAT_{name}_WHEEL")
    if not py or not wheel:
        pytest.fail(f"RINGX_COMPAT_{name}_PYTHON and RINGX_COMPAT_{name}_WHEEL must be set: run make torch-compat")
    return py, wheel


def run(cmd, env=None):
    full = dict(os.environ)
    full.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    full.pop("PYTHONPATH", None)
    full.update(env or {})
    p = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


def torch_versions(py):
    """(torch.__version__, the version in torch's metadata): 2.14.1+cu130 and 2.14.1 for one wheel."""
    rc, out, err = run([py, "-c", "import importlib.metadata as m, torch; print(torch.__version__, m.version('torch'))"],
                       env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert rc == 0, err
    return tuple(out.split())


def wheel_torch_pin(wheel):
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    pins = re.findall(r"^Requires-Dist: torch\s*==\s*(\S+)", text, re.M)
    assert len(pins) == 1, text
    return pins[0]


@pytest.fixture(scope="module")
def sides():
    a, b = side("A"), side("B")
    va, vb = torch_versions(a[0]), torch_versions(b[0])
    assert va[1].split("+")[0] != vb[1].split("+")[0], f"both venvs have torch {va[1]}"
    return {"A": (*a, *va), "B": (*b, *vb)}


@pytest.mark.parametrize("wheel_from,into", [("A", "B"), ("B", "A")])
def test_pip_refuses_a_wheel_with_another_torch(sides, wheel_from, into):
    _, wheel, built_for, _ = sides[wheel_from]
    py, _, have, _ = sides[into]
    assert wheel_torch_pin(wheel) == built_for.split("+")[0]
    rc, out, err = run([py, "-m", "pip", "install", "--dry-run", "--no-index", wheel,
                        f"torch=={have.split('+')[0]}"])
    text = out + err
    assert rc != 0, text
    assert f"depends on torch=={built_for.split('+')[0]}" in text, text
    assert "conflicting dependencies" in text, text


@pytest.fixture(scope="module")
def forced(sides, tmp_path_factory):
    """A venv whose torch is B's (through a .pth) with A's wheel installed without its deps.

    B's site-packages holds B's own ringx too: A's is installed with --ignore-installed,
    so that pip leaves B's alone, and shadows it (the venv's own site-packages comes first
    on sys.path, and importlib.metadata and pip take the first distribution of a name).
    """
    py_b = sides["B"][0]
    wheel_a = sides["A"][1]
    venv = tmp_path_factory.mktemp("forced") / "venv"
    rc, _, err = run([py_b, "-m", "venv", "--without-pip", str(venv)])
    assert rc == 0, err
    py = str(venv / "bin" / "python")
    rc, site, err = run([py, "-c", "import site; print(site.getsitepackages()[0])"])
    assert rc == 0, err
    site = site.strip()
    rc, b_site, err = run([py_b, "-c", "import importlib.metadata as m; print(m.distribution('torch').locate_file(''))"])
    assert rc == 0, err
    with open(os.path.join(site, "torch_from_b.pth"), "w") as f:
        f.write(b_site.strip() + "\n")
    rc, out, err = run([py_b, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--no-index",
                        "--ignore-installed", wheel_a])
    assert rc == 0, out + err
    rc, where, err = run([py, "-c", "import importlib.metadata as m; print(m.distribution('ringx').locate_file(''))"])
    assert rc == 0 and os.path.samefile(where.strip(), site), (where, err)
    return py


def test_forced_pair_pip_check_names_the_requirement(sides, forced):
    py_b, have = sides["B"][0], sides["B"][3]
    built_for = sides["A"][3].split("+")[0]
    rc, out, err = run([py_b, "-m", "pip", "--python", forced, "check"])
    assert rc != 0
    assert re.search(rf"ringx \S+ has requirement torch=={re.escape(built_for)}, but you have torch {re.escape(have)}",
                     out + err), out + err


def test_forced_pair_import_torch_warns_once_and_works(sides, forced):
    built_for, have = sides["A"][2], sides["B"][2]
    rc, out, err = run([forced, "-c", "import torch, sys; print('TORCH', torch.__version__, "
                                      "int(torch.ones(4).sum()), 'ringx' in sys.modules)"])
    assert rc == 0, f"import torch failed:\n{err[-4000:]}"
    assert f"TORCH {have} 4 False" in out, out
    warnings = [line for line in err.splitlines() if "RuntimeWarning" in line]
    assert len(warnings) == 1, err
    assert f"it was built for torch {built_for}, but torch {have} is in use" in warnings[0], warnings[0]
    assert "pip install --no-build-isolation --force-reinstall ringx" in warnings[0], warnings[0]
    assert "Failed to load the backend extension" not in err, err


@pytest.mark.parametrize("code", ["import torch; import ringx", "import ringx"])
def test_forced_pair_import_ringx_raises_the_clear_message(sides, forced, code):
    built_for, have = sides["A"][2], sides["B"][2]
    rc, out, err = run([forced, "-c", code])
    assert rc != 0, out
    last = err.strip().splitlines()[-1]
    assert last.startswith("ImportError: ringx "), err[-4000:]
    assert f"it was built for torch {built_for}, but torch {have} is in use" in last, last
    assert "pip install --no-build-isolation --force-reinstall ringx" in last, last
