"""Ranks that disagree on a setting that shapes a schedule (RINGX_SHM_BYTES, RINGX_ALGO,
RINGX_CHUNK_BYTES, RINGX_SHM) get a clear error from init_process_group on every rank,
naming the setting, each value and the ranks, instead of a SIGBUS or a hang later.

One world of 2 processes runs every case in turn: each rank sets its own environment,
calls init_process_group on a fresh prefix of one TCPStore, and reports what it raised;
an override that names no algorithm is a ValueError on every rank too; and a case where
the ranks agree must build a group whose all_reduce (several shared-memory slots long)
is right.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

import harness
from ports import free_port

pytestmark = pytest.mark.skipif(harness.BACKEND != "ringx", reason="RINGX_* settings are ringx's")

TIMEOUT = 180

# (name, {variable: (rank 0's value, rank 1's value)}); None = unset.
CASES = [
    ("shm_bytes", {"RINGX_SHM_BYTES": ("65536", "1048576")}),
    ("algo", {"RINGX_ALGO": ("ring", None)}),
    ("chunk", {"RINGX_CHUNK_BYTES": ("4096", "8192")}),
    ("shm", {"RINGX_SHM": ("0", None)}),
    ("bad_algo", {"RINGX_ALGO": ("nope", "nope")}),
    ("agree", {"RINGX_SHM_BYTES": ("65536", "65536"), "RINGX_SHM": ("1", None)}),
]

RANK_SCRIPT = r'''
import datetime, json, os, sys
import torch
import torch.distributed as dist
import ringx  # noqa: F401

rank, port, cases = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
base = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
results = {}
variables = {var for _, env in cases for var in env}
for name, env in cases:
    for var in variables:
        os.environ.pop(var, None)
    for var, values in env.items():
        if values[rank] is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = values[rank]
    try:
        dist.init_process_group("ringx", store=dist.PrefixStore(name, base), rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=20))
    except Exception as e:
        results[name] = [type(e).__name__, str(e)]
        continue
    try:
        n = 300_000  # 1.2 MB: many 64 KiB slots
        t = torch.arange(n, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(t)
        ok = torch.equal(t, torch.arange(n, dtype=torch.float32) * 3)
        results[name] = ["returned", "all_reduce correct" if ok else "all_reduce WRONG"]
    finally:
        dist.destroy_process_group()
print("RESULTS " + json.dumps(results), flush=True)
'''


def run_world():
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
        for case in CASES:
            for var in case[1]:
                env.pop(var, None)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(rank), str(port), json.dumps(CASES)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            out, _ = p.communicate()
            pytest.fail(f"a rank hung past {TIMEOUT} s:\n{out[-4000:]}")
        outs.append((p.returncode, out))
    results = []
    for rank, (rc, out) in enumerate(outs):
        assert rc == 0, f"rank {rank} exited {rc} ({'signal ' + str(-rc) if rc < 0 else 'status'}):\n{out[-4000:]}"
        line = [x for x in out.splitlines() if x.startswith("RESULTS ")]
        assert line, f"rank {rank} printed no results:\n{out[-4000:]}"
        results.append(json.loads(line[-1][len("RESULTS "):]))
    return results


def test_ranks_that_disagree_on_schedule_settings_fail_at_init_naming_them():
    results = run_world()
    for name, env in CASES:
        for rank in (0, 1):
            kind, msg = results[rank][name]
            if name == "agree":
                assert (kind, msg) == ("returned", "all_reduce correct"), (rank, kind, msg)
                continue
            if name == "bad_algo":  # agreed, but names nothing: the same error on every rank
                assert kind == "ValueError", (rank, kind, msg)
                assert "RINGX_ALGO entry 'nope' names no algorithm" in msg, msg
                continue
            (var, values), = env.items()
            shown = [v if v is not None else ("1" if var == "RINGX_SHM" else "unset") for v in values]
            assert kind == "ValueError", (name, rank, kind, msg)
            assert msg.startswith(f"ringx: creating the process group (rank {rank}): "
                                  f"the ranks disagree on {var}: "), msg
            assert f"'{shown[0]}' on rank 0, '{shown[1]}' on rank 1" in msg, msg
