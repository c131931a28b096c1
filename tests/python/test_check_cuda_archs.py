"""tools/check_cuda_archs.py's verdicts on made-up cuobjdump findings (the tool itself
runs on the real extension in make torch-compat)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))

import check_cuda_archs as cca  # noqa: E402

# Mangled-name stand-ins: each carries its family's marker.
REDUCE = ["_Z9mapKernelI10ReduceStepILi0EEE", "_Z9mapKernelI10ReduceStepILi1EEE"]
SCALE = ["_Z9mapKernelI9ScaleStepILi0EEE"]
REDUCEN = ["_Z13reduceNKernelILi0EEv"]
FLAGS = ["_ZN5ringx15waitFlagsKernelEPKjS1_jPj", "_ZN5ringx17signalFlagsKernelEPjjj"]
EVERY = set(REDUCE + SCALE + REDUCEN + FLAGS)


def complete():
    found = {("sass", f"sm_{a}"): set(EVERY) for a in ("80", "90", "100")}
    found[("ptx", "sm_100")] = set(EVERY)
    return found


def test_everything_there_passes():
    assert cca.check(complete(), ["80", "90", "100"], ["100"]) == []


def test_a_missing_architecture_is_named():
    found = complete()
    del found[("sass", "sm_90")]
    assert cca.check(found, ["80", "90", "100"], ["100"]) == ["SASS for sm_90: missing (not one kernel)"]


def test_missing_ptx_is_named():
    found = complete()
    del found[("ptx", "sm_100")]
    assert cca.check(found, ["80", "90", "100"], ["100"]) == ["PTX for compute_100: missing (not one kernel)"]


def test_one_kernel_missing_from_one_architecture_is_named():
    found = complete()
    found[("sass", "sm_100")].discard(REDUCE[1])
    problems = cca.check(found, ["80", "90", "100"], ["100"])
    assert len(problems) == 1, problems
    assert problems[0].startswith("SASS for sm_100: 1 of 2 reduce kernels missing, e.g. "), problems


def test_a_family_absent_everywhere_fails():
    found = {k: {n for n in v if "ScaleStep" not in n} for k, v in complete().items()}
    assert cca.check(found, ["80", "90", "100"], ["100"]) == ["no scale kernel in any architecture"]
