"""Short soak: tests/soak.py with 4 ranks and ~500 random collectives, every result checked.

`make soak` runs the long version (20,000 ops).  RINGX_SOAK_OPS changes the count here.
"""

import os
import subprocess
import sys

import pytest

import harness



ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS = int(os.environ.get("RINGX_SOAK_OPS", "500"))


@pytest.mark.skipif(harness.BACKEND != "ringx", reason="the soak mixes AVG and dtypes gloo lacks")
@pytest.mark.parametrize("seed", [11])
def test_soak_short(seed):
    limit = 90 + OPS * 0.05
    cmd = [sys.executable, os.path.join(ROOT, "tests", "soak.py"), "--world-size", "4", "--ops", str(OPS),
           "--seed", str(seed), "--timeout", "60", "--limit", str(limit), "--self-check"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 60)
    out = proc.stdout + proc.stderr
    print(out)
    summary = [line for line in out.splitlines() if line.startswith(("soak: PASS", "soak: FAIL"))]
    assert proc.returncode == 0 and summary and summary[-1].startswith("soak: PASS"), out[-6000:]
