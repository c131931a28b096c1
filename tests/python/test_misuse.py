"""Misuse raises a clear error (ringx only): ValueError / TypeError / RuntimeError (or a
subclass, e.g. c10::DistBackendError), whose text names ringx and the op and says what is
wrong; the group stays usable afterwards.  The cases are listed in cases_misuse.CASES."""

import re

import pytest

import cases_misuse as cases
import harness
import refs

pytestmark = pytest.mark.skipif(
    harness.BACKEND != "ringx",
    reason="error contract of ringx; gloo raises different errors (or crashes, or hangs) here")


def _params():
    return [pytest.param(name, ws, id=f"ws{ws}-{name}") for name, (_, _, _, sizes)
            in cases.CASES.items() for ws in sizes]


@pytest.mark.parametrize("name,ws", _params())
def test_misuse_raises_clear_error(worlds, name, ws):
    _, op_re, keyword_groups, _ = cases.CASES[name]
    results = worlds.run(ws, cases.misuse, name=name, timeout=30)
    failures = []
    for r, res in enumerate(results):
        where = f"rank {r}: {name} (world {ws})"
        out = res["outcome"]
        if out[0] == "returned":
            failures.append(f"{where}: returned instead of raising")
        else:
            _, tname, ok_type, text = out
            low = text.lower()
            if not ok_type:
                failures.append(f"{where}: raised {tname}, expected a ValueError/TypeError/"
                                f"RuntimeError: {text!r}")
            if "ringx" not in low:
                failures.append(f"{where}: message does not name ringx: {tname}: {text!r}")
            if not re.search(op_re, low):
                failures.append(f"{where}: message does not name the op (/{op_re}/): {text!r}")
            missing = [g for g in keyword_groups if not any(k in low for k in g)]
            if missing:
                failures.append(f"{where}: message does not say what is wrong (none of "
                                f"{' / '.join(map(repr, missing))}): {text!r}")
        if res["sanity"] != float(ws):
            failures.append(f"{where}: all_reduce afterwards gave {res['sanity']}")
    assert not failures, refs.report(failures)
