#!/bin/bash
# The prepared GPU run (issue 41): on a lent GPU machine, in one call and
# under RINGX_DEVICE_BUDGET seconds (default 450), without network access:
#
#   build     ringx with CUDA for the GPU's own architecture, into a folder of its own
#   smoke     tests/gpu/smoke.py, 2 ranks under torchrun
#   contexts  tests/gpu/contexts.py, 3 ranks: one CUDA context per rank, on its own device
#   ipc       tests/gpu -k ipc: every collective on RINGX_CUDA_PATH=ipc against the CPU, and
#             the INFO log saying ipc was taken (never run on a GPU before: first, and
#             stopped at the second failure so that a hang leaves budget for the rest)
#   sweep     all_reduce on ipc at world 3 (the ranks share the GPU), each algorithm forced
#             in turn (RINGX_IPC_ALGO=one_shot, two_shot, ring) at 8 B .. 64 MiB, and nccl
#             at world 1 at the same sizes: what the ipc cost model's constants
#             (csrc/core/device_paths/ipc_cost.cc) are to be fitted to
#   bench     benchmarks/collectives.py --device cuda at 8 B, 1 MiB and 64 MiB: ringx at
#             world 2 (the ranks share the GPU) for each data path the build offers
#             (staged, ipc), and ringx beside nccl at world 1 (nccl refuses two ranks on one GPU)
#   tests     the rest of tests/gpu, the default non-blocking wait among its cases, in the time left
#
# Here, before the call (once a session; build/ is ignored, so it is carried):
#   make device-wheels
# The call (the device tool's run, from the repo root):
#   command: tests/gpu/device_run.sh build/device-wheels   carry: ["build/device-wheels"]
#   timeout_s: 540
# Without a GPU, or with --dry-run, it says what it would run and exits 0.
#
# What comes back ($OUT, at most 8 files): steps.log (each step, its exit and
# time), logs.tar.gz (every log and the bench JSONs) and the bench JSONs (the
# sweep's four in one, bench-ipc-sweep.json).
# Afterwards: the JSONs go to docs/bench/gpu-<date>-*.json and what they show
# to docs/cuda.md.
#
# The distribution's compiler is used (RINGX_DEVICE_CC/CXX override): the
# image's /opt/gcc links libstdc++ statically, which the build refuses.
set -u
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
WHEELS=${1:?usage: tests/gpu/device_run.sh [--dry-run] <folder with the libucx-cu13 wheel>}
OUT=${OUT:-/tmp/ringx-device-out}
WORK=$(mktemp -d /tmp/ringx-device-XXXX)
SITE=${RINGX_DEVICE_SITE:-/tmp/ringx-site}
PY=${PYTHON:-$(command -v python3)}
BUDGET=${RINGX_DEVICE_BUDGET:-450}
START=$SECONDS
mkdir -p "$OUT" "$SITE"

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  [ $DRY = 1 ] || echo "device_run.sh: no GPU here (nvidia-smi finds none): a dry run"
  DRY=1
fi

step() { echo "== +$((SECONDS - START))s $*" | tee -a "$OUT/steps.log"; }
left() { echo $((BUDGET - (SECONDS - START))); }
# run_step NAME LOG LIMIT CMD...: CMD under a timeout of LIMIT seconds or
# what the budget leaves (less 20 s to pack), its output in LOG.
run_step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local t=$(($(left) - 20))
  [ "$t" -lt "$limit" ] && limit=$t
  if [ $DRY = 1 ]; then
    step "$name: would run (at most ${limit}s, log $log): $*"
    return 0
  fi
  if [ "$limit" -lt 10 ]; then
    step "$name: skipped, the budget is spent"
    return 124
  fi
  step "$name: starting (at most ${limit}s)"
  timeout -k 10 "$limit" "$@" > "$WORK/$log" 2>&1
  local rc=$?
  step "$name: exit $rc$([ $rc = 124 ] && echo ' (timed out)')"
  tail -15 "$WORK/$log"
  return $rc
}

if [ $DRY = 0 ]; then
  step "machine"
  {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
    "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
    command -v nvcc && nvcc --version | tail -1
    nproc
  } > "$WORK/machine.log" 2>&1
  cat "$WORK/machine.log"
fi

CC= CXX=
for v in 13 12 ""; do
  [ -x "/usr/bin/g++${v:+-$v}" ] && [ -x "/usr/bin/gcc${v:+-$v}" ] || continue
  CC=/usr/bin/gcc${v:+-$v} CXX=/usr/bin/g++${v:+-$v}
  break
done
CC=${RINGX_DEVICE_CC:-$CC} CXX=${RINGX_DEVICE_CXX:-$CXX}
if [ $DRY = 0 ] && { [ -z "$CC" ] || [ -z "$CXX" ]; }; then
  step "no /usr/bin/g++ here; name one with RINGX_DEVICE_CC/CXX"
  exit 1
fi
export CC CXX CUDAHOSTCXX=$CXX
# The GPU's own architecture only: one target keeps the build short.
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
ls "$WHEELS"/libucx_cu13-*.whl > /dev/null 2>&1 || step "no libucx_cu13 wheel in $WHEELS: run 'make device-wheels' here first"

build() {
  "$PY" -m pip install --no-index --no-deps --upgrade --target "$SITE" "$WHEELS"/libucx_cu13-*.whl || return 1
  # --upgrade: without it pip keeps a ringx already in the folder.
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip install -v --no-index --no-deps --no-build-isolation --upgrade \
    --target "$SITE" -C cmake.define.RINGX_CUDA=on -C cmake.define.CMAKE_C_COMPILER="$CC" \
    -C cmake.define.CMAKE_CXX_COMPILER="$CXX" -C cmake.define.CMAKE_CUDA_HOST_COMPILER="$CUDAHOSTCXX" \
    ${ARCH:+-C cmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH-real"} . || return 1
  readelf -d "$SITE"/ringx/_C*.so | grep NEEDED
}
# The wheel's CMake config is found through its entry point, so the build
# must see the folder it went into.
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
if ! run_step build build.log 240 build; then
  tar -C "$WORK" -czf "$OUT/logs.tar.gz" .
  exit 1
fi

TORCHRUN=$(dirname "$PY")/torchrun
run_step smoke smoke.log 90 "$TORCHRUN" --nproc-per-node 2 tests/gpu/smoke.py
run_step contexts contexts.log 90 "$TORCHRUN" --nproc-per-node 3 tests/gpu/contexts.py
run_step "tests/gpu, the ipc cases" tests-gpu-ipc.log 150 \
  env RINGX_GPU_TEST_TIMEOUT=${RINGX_GPU_TEST_TIMEOUT:-45} "$PY" -m pytest tests/gpu -v -k ipc --maxfail=2 \
  -p no:cacheprovider -rfE --durations=0

# The data paths this build offers (RINGX_CUDA_PATH's values).
PATHS=staged
if [ $DRY = 0 ]; then
  PATHS=$("$PY" -c "from ringx import _C
v = [s['values'] for s in _C._settings() if s['name'] == 'RINGX_CUDA_PATH'][0]
print(' '.join(p for p in ('staged', 'ipc') if '\`' + p + '\`' in v))")
else
  step "bench: the paths are read from the build (staged, and ipc where RINGX_CUDA_PATH offers it)"
fi
# World 3: from 3 ranks the three algorithms differ in traffic (at 2 the ring only adds
# steps), and it is what tests/gpu puts on one GPU already.
SWEEP=(benchmarks/collectives.py --device cuda --colls all_reduce --sizes 8,4K,64K,1M,8M,64M
  --pattern back-to-back --budget 0.1 --no-bound --timeout 55 --pg-timeout 30)
if [ $DRY = 1 ] || [[ " $PATHS " == *" ipc "* ]]; then
  for a in one_shot two_shot ring; do
    run_step "ipc all_reduce $a, world 3" "sweep-ipc-$a.log" 60 \
      env RINGX_CUDA_PATH=ipc RINGX_IPC_ALGO=$a "$PY" "${SWEEP[@]}" --world 3 --backends ringx --fit \
      --json "$WORK/sweep-ipc-$a-w3.json"
  done
  run_step "nccl all_reduce, world 1" sweep-nccl.log 45 \
    "$PY" "${SWEEP[@]}" --world 1 --backends nccl --json "$WORK/sweep-nccl-w1.json"
  # One file back for the four (at most 8 come back): each run's JSON under its name.
  [ $DRY = 1 ] || "$PY" -c 'import json, os, sys
print(json.dumps({os.path.basename(p)[:-5]: json.load(open(p)) for p in sys.argv[2:]}), file=open(sys.argv[1], "w"))' \
    "$WORK/bench-ipc-sweep.json" "$WORK"/sweep-*.json
fi

BENCH=(benchmarks/collectives.py --device cuda --sizes 8,1M,64M --pattern back-to-back --budget 0.2
  --timeout 150 --pg-timeout 60)
for p in $PATHS; do
  run_step "bench $p, world 2" "bench-$p.log" 160 \
    env RINGX_CUDA_PATH=$p "$PY" "${BENCH[@]}" --world 2 --backends ringx --json "$WORK/bench-ringx-$p-w2.json"
done
run_step "bench staged beside nccl, world 1" bench-nccl.log 120 \
  "$PY" "${BENCH[@]}" --world 1 --backends ringx,nccl --json "$WORK/bench-ringx-nccl-w1.json"

run_step "tests/gpu" tests-gpu.log 400 \
  env RINGX_GPU_TEST_TIMEOUT=${RINGX_GPU_TEST_TIMEOUT:-45} "$PY" -m pytest tests/gpu -v -k "not ipc" -p no:cacheprovider \
  -rfE --durations=0

if [ $DRY = 0 ]; then
  cp "$WORK"/bench-*.json "$OUT"/ 2> /dev/null
  tar -C "$WORK" -czf "$OUT/logs.tar.gz" .
  step "done: $(ls "$OUT" | tr '\n' ' ')"
else
  step "dry run: nothing ran"
fi
rm -rf "$WORK"
