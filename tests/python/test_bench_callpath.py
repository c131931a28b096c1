"""benchmarks/callpath.py's reading of callgrind_annotate: the program total, each entry
point's largest inclusive count (a recursive function listed twice counts once), and the
split into ringx's part and the rest per call. (Running valgrind itself takes a minute,
so it is not part of make test: `python benchmarks/callpath.py`.)"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
import callpath  # noqa: E402

ANNOTATE = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
96,494,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
95,000,000 (98.45%)  ceval.c:_PyEval_EvalFrameDefault [/lib/libpython3.11.so.1.0]
23,724,000 (24.59%)  ???:ringx::ProcessGroupRingx::allreduce(std::vector<at::Tensor>&, c10d::AllreduceOptions const&) [/x/_C.so]
 2,260,000 ( 2.34%)  ???:ringx::WorkRingx::~WorkRingx() [/x/_C.so]
 1,130,000 ( 1.17%)  ???:ringx::WorkRingx::~WorkRingx()'2 [/x/_C.so]
   958,000 ( 0.99%)  ???:ringx::WorkRingx::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >) [/x/_C.so]
"""


def test_parse_takes_the_total_and_each_entry_points_largest_inclusive_count():
    parsed = callpath.parse_inclusive(ANNOTATE, callpath.ENTRY_POINTS["ringx"])
    assert parsed["total"] == 96_494_000
    assert list(parsed["entry_points"].values()) == [23_724_000, 958_000, 2_260_000]
    row = callpath.per_call(parsed, "ringx", 8, 2000)
    assert row["total_per_call"] == 48_247
    assert row["backend_per_call"] == (23_724_000 + 958_000 + 2_260_000) / 2000
    assert row["rest_per_call"] == row["total_per_call"] - row["backend_per_call"]


def test_gloo_reports_its_total_only():
    row = callpath.per_call(callpath.parse_inclusive(ANNOTATE, callpath.ENTRY_POINTS["gloo"]), "gloo", 8, 2000)
    assert row["total_per_call"] == 48_247
    assert row["backend_per_call"] is None and row["rest_per_call"] is None


def test_parse_refuses_output_without_a_total():
    with pytest.raises(ValueError, match="PROGRAM TOTALS"):
        callpath.parse_inclusive("nothing here\n", callpath.ENTRY_POINTS["ringx"])
