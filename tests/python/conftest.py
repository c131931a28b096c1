"""pytest glue for the ringx suite: backend choice and the shared worlds of workers.

RINGX_TEST_BACKEND selects the backend under test ("ringx" by default; "gloo" runs the
same suite against torch's own backend, which is how the suite itself is checked).
See harness.py for how worlds work and how to add a case.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

_POOL = None


def pytest_report_header(config):
    return (f"ringx tests: backend={harness.BACKEND} case_timeout={harness.CASE_TIMEOUT:g}s "
            f"pg_timeout={harness.PG_TIMEOUT:g}s")


@pytest.fixture(scope="session")
def backend():
    return harness.BACKEND


@pytest.fixture(scope="session")
def worlds():
    """WorldPool: `worlds.run(world_size, case_fn, **kwargs)` -> per-rank results."""
    global _POOL
    pool = harness.WorldPool(harness.BACKEND)
    _POOL = pool
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def forced_worlds():
    """forced_worlds(size): the session's world of `size` for forced-algorithm cases
    (cases_forced), its ranks logging each call's algorithm (RINGX_DEBUG=INFO)."""
    made = {}

    def get(size):
        if size not in made:
            made[size] = harness.World(size, env={"RINGX_DEBUG": "INFO"})
        return made[size]

    try:
        yield get
    finally:
        for w in made.values():
            w.close()


def pytest_terminal_summary(terminalreporter):
    if _POOL is None:
        return
    if _POOL.unclean_exits:
        terminalreporter.write_sep("-", "workers that did not exit cleanly at shutdown")
        for line in _POOL.unclean_exits:
            terminalreporter.write_line(line)
    if os.environ.get("RINGX_TEST_KEEP_LOGS") == "1":
        terminalreporter.write_line(f"worker logs kept in {_POOL.log_dir}")
