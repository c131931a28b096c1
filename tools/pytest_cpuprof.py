"""A pytest plugin that writes, per test, the CPU its pytest process tree spent: every
live descendant's own time plus the children each has reaped (the harness's forkserver
and its worlds, the fault launcher's ranks, torchrun's workers). CPU, not wall time, is
what make test runs short of on 2 cores: its pytest runs share them.

    PYTHONPATH=tools CPUPROF_OUT=/tmp/cpu.jsonl .venv/bin/python -m pytest -p pytest_cpuprof tests/python/...
    (or PYTEST_ADDOPTS="-p pytest_cpuprof" PYTHONPATH=$PWD/tools make py-test)
    python tools/pytest_cpuprof.py /tmp/cpu.jsonl ...   # the sums per test file

One JSON line per test: id, wall s, cpu s (the tree's), machine s (every CPU's busy
time, /proc/stat). Processes that leave the tree (reparented to init) are not counted.
"""
import collections
import json
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
_out = None
_me = os.getpid()


def _tree_cpu():
    kids = {}
    stats = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(")") + 2:].split()
        ppid = int(rest[1])
        cpu = sum(int(x) for x in rest[11:15])
        kids.setdefault(ppid, []).append(int(p))
        stats[int(p)] = cpu
    total, stack = 0, [_me]
    while stack:
        p = stack.pop()
        total += stats.get(p, 0)
        stack.extend(kids.get(p, []))
    return total / HZ


def _busy():
    with open("/proc/stat") as f:
        v = f.readline().split()[1:]
    return sum(int(v[i]) for i in (0, 1, 2, 5, 6, 7)) / HZ


def pytest_configure(config):
    global _out
    path = os.environ.get("CPUPROF_OUT", f"cpuprof-{_me}.jsonl")
    _out = open(path, "a", buffering=1)


_state = {}


def pytest_runtest_logstart(nodeid, location):
    _state[nodeid] = (time.monotonic(), _tree_cpu(), _busy())


def pytest_runtest_logfinish(nodeid, location):
    t0, c0, b0 = _state.pop(nodeid)
    _out.write(json.dumps({"id": nodeid, "wall": time.monotonic() - t0, "cpu": _tree_cpu() - c0,
                           "machine": _busy() - b0}) + "\n")


def main(paths):
    by_file = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for path in paths:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                sums = by_file[row["id"].split("::")[0]]
                sums[0] += row["cpu"]
                sums[1] += row["wall"]
                sums[2] += 1
    print(f"{'cpu s':>8} {'wall s':>8} {'tests':>5}  file")
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0]):
        print(f"{cpu:8.1f} {wall:8.1f} {n:5d}  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
