#!/bin/bash
# tests/gpu on a lent GPU machine: the device tool's machines have torch in a
# venv and no package index. Builds ringx there with CUDA into a folder of
# its own, runs tests/gpu/smoke.py under torchrun, then tests/gpu; every log
# goes to $OUT (the device tool brings that folder back).
#
# Here, before the call: put the libucx-cu13 wheel for the machine's Python
# where the run carries it (build/ is ignored, so name it in `carry`):
#   .venv/bin/pip download libucx-cu13==1.22.0 --no-deps --only-binary :all: \
#       --python-version 3.12 -d build/device-wheels
# On the machine: tests/gpu/device_run.sh build/device-wheels
#
# The system compiler is used (CC/CXX/CUDAHOSTCXX, overridable): the image's
# /opt/gcc links libstdc++ statically, which the build now refuses.
set -u
WHEELS=${1:?usage: tests/gpu/device_run.sh <folder with the libucx-cu13 wheel>}
OUT=${OUT:-/tmp/ringx-device-out}
SITE=${RINGX_DEVICE_SITE:-/tmp/ringx-site}
PY=${PYTHON:-$(command -v python3)}
mkdir -p "$OUT" "$SITE"
export CC=${CC:-/usr/bin/gcc} CXX=${CXX:-/usr/bin/g++}
export CUDAHOSTCXX=${CUDAHOSTCXX:-$CXX}
step() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.log"; }

step "machine"
{
  nvidia-smi -L
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  "$CXX" --version | head -1
  command -v nvcc && nvcc --version | tail -1
} > "$OUT/machine.log" 2>&1
cat "$OUT/machine.log"

# The GPU's own architecture only: one target keeps the build short.
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
CUDA=${RINGX_CUDA:-on}
[ -n "$ARCH" ] || CUDA=${RINGX_CUDA:-auto}
step "build (RINGX_CUDA=$CUDA, architecture ${ARCH:-none})"
"$PY" -m pip install --no-index --no-deps --upgrade --target "$SITE" "$WHEELS"/libucx_cu13-*.whl \
  > "$OUT/build.log" 2>&1 || { step "installing the libucx wheel failed"; tail -5 "$OUT/build.log"; exit 1; }
# --upgrade: without it pip keeps a ringx already in the folder.
"$PY" -m pip install -v --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" \
  -C cmake.define.RINGX_CUDA="$CUDA" ${ARCH:+-C cmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH-real"} . \
  >> "$OUT/build.log" 2>&1 || { step "build failed"; tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
readelf -d "$SITE"/ringx/_C*.so | grep NEEDED > "$OUT/needed.log"

step "smoke: 2 ranks"
TORCHRUN=$(dirname "$PY")/torchrun
PYTHONFAULTHANDLER=1 timeout -k 10 120 "$TORCHRUN" --nproc-per-node 2 tests/gpu/smoke.py > "$OUT/smoke.log" 2>&1
rc=$?
tail -40 "$OUT/smoke.log"
step "smoke: exit $rc"

step "tests/gpu: the first test alone, its ranks' output shown"
export RINGX_GPU_TEST_TIMEOUT=${RINGX_GPU_TEST_TIMEOUT:-60} PYTHONFAULTHANDLER=1
timeout -k 10 180 "$PY" -m pytest -x -s -q -p no:cacheprovider \
  "tests/gpu/test_gpu.py::test_all_reduce_every_op_and_dtype[staged]" > "$OUT/gpu-first.log" 2>&1
step "first test: exit $?"
tail -30 "$OUT/gpu-first.log"

step "tests/gpu: all"
timeout -k 10 ${RINGX_DEVICE_SUITE_TIMEOUT:-420} "$PY" -m pytest tests/gpu -q -p no:cacheprovider -rfE \
  > "$OUT/gpu-all.log" 2>&1
step "tests/gpu: exit $?"
tail -40 "$OUT/gpu-all.log"
