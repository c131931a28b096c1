"""benchmarks/floor.py end to end, briefly: every case runs (--switch's too), the
collective's ranks make the same number of calls (half the loaded floor's), the
process-group cases time torch's op around their loop, and the JSON holds what the table
printed."""

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "floor.py")


def test_floor_benchmark_times_every_case_and_writes_its_json(tmp_path):
    out = tmp_path / "floor.json"
    run = subprocess.run([sys.executable, SCRIPT, "--seconds", "0.3", "--repeats", "1", "--settle", "2",
                          "--switch", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(out.read_text())
    assert data["meta"]["world"] == 2
    (row,) = data["runs"]
    for case in ("op-alone", "op-xN", "w1-alone", "w1-xN", "fake-xN", "fake-xN-yield", "w1-xN-yield", "wN"):
        r = row[case]
        assert r["calls"] > 0 and 0 < r["p10"] <= r["p50"] <= r["p90"], (case, r)
        assert r["cpu_per_call"] > 0, (case, r)
        assert len(r["each_p50"]) == (1 if case.endswith("alone") else 2), (case, r)
        assert r["p50"] == max(r["each_p50"]), (case, r)
        # The process-group cases time torch's op before and after their loop.
        want = 0 if case.startswith("op") else 2
        assert all(len(x) == want and all(v > 0 for v in x) for x in r["each_op_p50"]), (case, r)
    assert row["wN"]["calls"] == row["w1-xN"]["calls"] // 2
    assert abs(row["added"] - (row["wN"]["p50"] - row["w1-xN"]["p50"])) < 1e-9
    assert abs(row["above_torch"] - (row["wN"]["p50"] - row["fake-xN"]["p50"])) < 1e-9
    assert "w2 adds" in run.stdout and "what the collective adds" in run.stdout
    assert "above torch's path" in run.stdout
