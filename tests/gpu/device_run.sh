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
# On the H200 of 2026-11-27 the build took 42 s and smoke.py 13 s; a hung
# tests/gpu case took its RINGX_GPU_TEST_TIMEOUT plus 30-40 s (start-up and
# its stacks); how long a passing case takes was not recorded. Within a
# 15-minute lease (about a minute of it to start the machine), one call with
# RINGX_DEVICE_SUITE_TIMEOUT=400 and RINGX_GPU_TEST_TIMEOUT=45 leaves time for
# the reply; RINGX_DEVICE_STEPS=first runs one case alone.
#
# The distribution's compiler is used (RINGX_DEVICE_CC/CXX override): the
# image's /opt/gcc links libstdc++ statically, which the build refuses.
set -u
IMAGE_CXX=${CXX:-}
WHEELS=${1:?usage: tests/gpu/device_run.sh <folder with the libucx-cu13 wheel>}
OUT=${OUT:-/tmp/ringx-device-out}
SITE=${RINGX_DEVICE_SITE:-/tmp/ringx-site}
PY=${PYTHON:-$(command -v python3)}
mkdir -p "$OUT" "$SITE"
# The image sets CXX to /opt/gcc's wrapper, which links libstdc++ statically,
# so the environment's CC/CXX are not taken: RINGX_DEVICE_CC/CXX override.
CC= CXX=
for v in 13 12 ""; do
  [ -x "/usr/bin/g++${v:+-$v}" ] && [ -x "/usr/bin/gcc${v:+-$v}" ] || continue
  CC=/usr/bin/gcc${v:+-$v} CXX=/usr/bin/g++${v:+-$v}
  break
done
CC=${RINGX_DEVICE_CC:-$CC} CXX=${RINGX_DEVICE_CXX:-$CXX}
[ -n "$CC" ] && [ -n "$CXX" ] || { echo "device_run.sh: no /usr/bin/g++ here; name one with RINGX_DEVICE_CC/CXX"; exit 1; }
export CC CXX CUDAHOSTCXX=$CXX
step() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.log"; }

step "machine"
{
  nvidia-smi -L
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  echo "CC=$CC CXX=$CXX (the image's CXX: ${IMAGE_CXX:-unset})"; "$CXX" --version | head -1
  ls -l /usr/bin/g++* /opt/gcc/bin/g++
  command -v nvcc && nvcc --version | tail -1
  nproc
} > "$OUT/machine.log" 2>&1
cat "$OUT/machine.log"

# The GPU's own architecture only: one target keeps the build short.
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
CUDA=${RINGX_CUDA:-on}
[ -n "$ARCH" ] || CUDA=${RINGX_CUDA:-auto}
step "build, $(nproc) jobs (RINGX_CUDA=$CUDA, architecture ${ARCH:-none})"
"$PY" -m pip install --no-index --no-deps --upgrade --target "$SITE" "$WHEELS"/libucx_cu13-*.whl \
  > "$OUT/build.log" 2>&1 || { step "installing the libucx wheel failed"; tail -5 "$OUT/build.log"; exit 1; }
# The wheel's CMake config is found through its entry point, so the build
# must see the folder it went into. --upgrade: without it pip keeps a ringx
# already in the folder.
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip install -v --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" \
  -C cmake.define.RINGX_CUDA="$CUDA" -C cmake.define.CMAKE_C_COMPILER="$CC" \
  -C cmake.define.CMAKE_CXX_COMPILER="$CXX" -C cmake.define.CMAKE_CUDA_HOST_COMPILER="$CUDAHOSTCXX" ${ARCH:+-C cmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH-real"} . \
  >> "$OUT/build.log" 2>&1 || { step "build failed"; tail -30 "$OUT/build.log"; exit 1; }
readelf -d "$SITE"/ringx/_C*.so | grep NEEDED > "$OUT/needed.log"

# RINGX_DEVICE_STEPS picks what runs after the build (default: all three).
STEPS=" ${RINGX_DEVICE_STEPS:-smoke first all} "
if [[ $STEPS == *" smoke "* ]]; then
  step "smoke: 2 ranks"
  TORCHRUN=$(dirname "$PY")/torchrun
  PYTHONFAULTHANDLER=1 timeout -k 10 ${RINGX_DEVICE_SMOKE_TIMEOUT:-120} "$TORCHRUN" --nproc-per-node 2 \
    tests/gpu/smoke.py > "$OUT/smoke.log" 2>&1
  rc=$?
  tail -40 "$OUT/smoke.log"
  step "smoke: exit $rc"
fi

export RINGX_GPU_TEST_TIMEOUT=${RINGX_GPU_TEST_TIMEOUT:-60} PYTHONFAULTHANDLER=1
if [[ $STEPS == *" first "* ]]; then
  step "tests/gpu: the first test alone, its ranks' output shown"
  timeout -k 10 ${RINGX_DEVICE_FIRST_TIMEOUT:-180} "$PY" -m pytest -x -s -q -p no:cacheprovider \
    "tests/gpu/test_gpu.py::test_all_reduce_every_op_and_dtype[staged]" > "$OUT/gpu-first.log" 2>&1
  step "first test: exit $?"
  tail -30 "$OUT/gpu-first.log"
fi

if [[ $STEPS == *" all "* ]]; then
  step "tests/gpu: all"
  timeout -k 10 ${RINGX_DEVICE_SUITE_TIMEOUT:-420} "$PY" -m pytest tests/gpu -v -p no:cacheprovider -rfE \
    --durations=0 > "$OUT/gpu-all.log" 2>&1
  step "tests/gpu: exit $?"
  tail -40 "$OUT/gpu-all.log"
fi
