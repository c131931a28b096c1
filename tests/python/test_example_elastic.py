"""examples/elastic_ddp.py, the README's example of surviving a death: its own
launcher, two ranks killed in turn, the survivors shrink and finish with equal
parameters (the script checks that and exits non-zero otherwise)."""

import os
import subprocess
import sys

import harness
import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "elastic_ddp.py")


@pytest.mark.skipif(harness.BACKEND != "ringx", reason="the example shrinks ringx groups")
def test_the_elastic_example_survives_two_deaths():
    r = subprocess.run([sys.executable, EXAMPLE, "--nproc", "4", "--steps", "14", "--kill", "2@4", "--kill", "0@9"],
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "2 of 4 ranks finished with equal parameters" in out, out
    assert out.count("ranks [2] died") == 3 and out.count("ranks [0] died") == 2, out
