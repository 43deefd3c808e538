#!/usr/bin/env bash
# The GPU check of zenflow (benchmarks/device/README.md): builds from source on the GPU
# machine, runs the GPU pytest tests (kernels and the engine's CUDA backend), then the
# engine part: a short engine run under compute-sanitizer memcheck and racecheck, the
# end-to-end engine benchmark (bench_engine_gpu.py, ~1B bf16 parameters) and the demo on the
# GPU; then the kernel part: the C++ tests, the CPU kernel tests again with
# ZENFLOW_SIMD=avx512, the kernel GPU tests under compute-sanitizer memcheck (small sizes),
# the stats/top-k/pack/exchange GPU tests under racecheck, synccheck and initcheck (small
# sizes, a few tests each), then the kernel benchmark at the 7B shapes (bf16, k = 10%) and at
# lm_head + fp16 + k = 1%. Offline; hard cap 8 minutes (ZENFLOW_CHECK_BUDGET_S): a step that
# would start past the budget is reported as skipped, so the parts run in priority order.
#
#   bash benchmarks/device/check.sh          # results and log under $OUT (or benchmarks/results)
#   ZENFLOW_CHECK_PARTS=engine bash benchmarks/device/check.sh   # build + the engine part only
#   ZENFLOW_CHECK_PARTS=kernels bash benchmarks/device/check.sh  # build + the kernel part only
#
# Exit status: 0 when every step passed, 1 otherwise (the log names the failing steps).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PARTS=${ZENFLOW_CHECK_PARTS:-all}                    # all | engine | kernels
case $PARTS in all | engine | kernels) ;; *)
  echo "ZENFLOW_CHECK_PARTS: expected all, engine or kernels, got '$PARTS'" >&2
  exit 2
  ;;
esac
part() { [[ $PARTS == all || $PARTS == "$1" ]]; }
OUT=${OUT:-$ROOT/benchmarks/results}
mkdir -p "$OUT"
STAMP=$(date +%Y-%m-%d)
LOG=$OUT/$STAMP-device-check.log
: >"$LOG"
BUILD=${ZENFLOW_DEVICE_BUILD:-$ROOT/build-device}
PYTHON=${PYTHON:-python}
export ZENFLOW_CUDA_ARCHS=${ZENFLOW_CUDA_ARCHS:-90}  # one architecture: half the compile time
BUDGET=${ZENFLOW_CHECK_BUDGET_S:-470}                # whole script, seconds
START=$SECONDS
FAILED=()

say() { echo "== $* [$((SECONDS - START)) s]" | tee -a "$LOG"; }

# run NAME LIMIT_S CMD...: runs CMD with its output in the log, within its own limit and
# the script's remaining budget; records a failure instead of stopping.
run() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - (SECONDS - START)))
  if ((left < 20)); then
    say "SKIPPED $name (time budget spent)"
    FAILED+=("$name (skipped: budget)")
    return
  fi
  ((limit > left)) && limit=$left
  say "$name (limit ${limit} s)"
  if timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1; then
    say "ok $name"
  else
    say "FAILED $name (status $?)"
    FAILED+=("$name")
  fi
}

say "zenflow device check ($PARTS) in $ROOT, archs $ZENFLOW_CUDA_ARCHS, $(nproc) cores"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$LOG" 2>&1 || true

# One CMake build: libzenflow, the C++ tests, and zenflow._C placed next to the Python
# sources (python/zenflow), so PYTHONPATH=python imports it. GoogleTest is optional.
PYBIND11_DIR=$("$PYTHON" -m pybind11 --cmakedir 2>/dev/null)
configure() {
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZENFLOW_WITH_CUDA=ON \
    -DZENFLOW_BUILD_PYTHON=ON -DZENFLOW_BUILD_TESTS="$1" -Dpybind11_DIR="$PYBIND11_DIR" \
    -DPython_EXECUTABLE="$(command -v "$PYTHON")" -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$ROOT/python/zenflow"
}
HAVE_CTEST=1
if ! configure ON >>"$LOG" 2>&1; then
  say "configure with tests failed (no GoogleTest?): building without the C++ tests"
  rm -rf "$BUILD"
  HAVE_CTEST=0
  configure OFF >>"$LOG" 2>&1 || FAILED+=("configure")
fi
run "build" 240 cmake --build "$BUILD" -j "$(nproc)"

export PYTHONPATH=$ROOT/python:$ROOT/tests/python${PYTHONPATH:+:$PYTHONPATH}
run "zenflow info" 30 "$PYTHON" -m zenflow info
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
[[ -x $SANITIZER ]] && export PATH="$(dirname "$SANITIZER"):$PATH"  # test_gpu_engine.py looks it up

# The GPU tests of the part(s) asked for; the engine's sanitizer runs are a step of their own.
case $PARTS in
  all) GPU_TESTS=("$ROOT/tests/python") ;;
  engine) GPU_TESTS=("$ROOT/tests/python/test_gpu_engine.py" "$ROOT/tests/python/test_data_parallel.py") ;;
  kernels) GPU_TESTS=("$ROOT/tests/python" --ignore "$ROOT/tests/python/test_gpu_engine.py"
    --ignore "$ROOT/tests/python/test_data_parallel.py") ;;
esac
run "pytest gpu" 150 "$PYTHON" -m pytest -q -m gpu -k "not compute_sanitizer" "${GPU_TESTS[@]}"

# ---- the engine's CUDA backend (issue 12) ----
if part engine; then
  # A short engine run (bf16 and fp16, re-selections, overlap, the split form, an overflow)
  # under memcheck and racecheck, in subprocesses of test_gpu_engine.py.
  if [[ -x $SANITIZER ]]; then
    run "engine under compute-sanitizer memcheck, racecheck" 150 env ZENFLOW_SANITIZER_TIMEOUT_S=70 \
      "$PYTHON" -m pytest -q -m gpu -k compute_sanitizer "$ROOT/tests/python/test_gpu_engine.py"
  else
    say "compute-sanitizer not found"
    FAILED+=("engine compute-sanitizer (not found)")
  fi
  run "engine benchmark" 150 "$PYTHON" "$ROOT/benchmarks/device/bench_engine_gpu.py" \
    --out "$OUT/$STAMP-engine-gpu.json"
  [[ -f $OUT/$STAMP-engine-gpu.json ]] &&
    "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["table"])' "$OUT/$STAMP-engine-gpu.json"
  # The demo's largest preset ("large"; there is no ~1B preset: bench_engine_gpu.py is the
  # 1B run), 40 steps per run: pretraining, the tokenizer and three runs fit in its limit.
  if "$PYTHON" -c "import tokenizers, matplotlib" >/dev/null 2>&1; then
    run "demo --device cuda" 120 "$PYTHON" -m zenflow demo --device cuda --model-size large --steps 40 \
      --no-progress --out "$OUT/$STAMP-demo-cuda" --cache "$BUILD/demo-cache"
    [[ -f $OUT/$STAMP-demo-cuda/table.md ]] && cat "$OUT/$STAMP-demo-cuda/table.md"
  else
    say "SKIPPED demo --device cuda (the demo needs the tokenizers and matplotlib packages)"
    FAILED+=("demo --device cuda (tokenizers/matplotlib missing)")
  fi
fi

# ---- the kernels (issue 4) ----
if part kernels && ((HAVE_CTEST)); then
  run "ctest" 60 ctest --test-dir "$BUILD" --output-on-failure -j 8
  run "ctest, ZENFLOW_SIMD=avx512" 60 env ZENFLOW_SIMD=avx512 ctest --test-dir "$BUILD" --output-on-failure -j 8
fi
part kernels && run "pytest cpu, ZENFLOW_SIMD=avx512" 60 env ZENFLOW_SIMD=avx512 "$PYTHON" -m pytest -q -m "not gpu" "$ROOT/tests/python"

# memcheck sees torch's real allocations only without its caching allocator.
if ! part kernels; then
  :
elif [[ -x $SANITIZER ]]; then
  run "compute-sanitizer memcheck (small)" 150 env ZENFLOW_GPU_SMALL=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$SANITIZER" --tool memcheck --error-exitcode 1 --target-processes all \
    "$PYTHON" -m pytest -q -x -m gpu -k "not graph and not cupy" "$ROOT/tests/python/test_gpu_kernels.py"
  # The shared-memory / barrier / uninitialised-read tools on the kernels that use shared
  # memory and tickets, through the smallest tests that reach every path (multi-launch
  # lists, scalar and vector loads); racecheck is the slowest, so it sees the fewest.
  SMALL_TESTS="$ROOT/tests/python/test_gpu_hazards.py"
  run "compute-sanitizer racecheck (small)" 60 env ZENFLOW_GPU_SMALL=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$SANITIZER" --tool racecheck --racecheck-report hazard --error-exitcode 1 --target-processes all \
    "$PYTHON" -m pytest -q -x -m gpu -k "unaligned or several_launches" "$SMALL_TESTS"
  run "compute-sanitizer synccheck (small)" 45 env ZENFLOW_GPU_SMALL=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$SANITIZER" --tool synccheck --error-exitcode 1 --target-processes all \
    "$PYTHON" -m pytest -q -x -m gpu -k "unaligned or several_launches or bitwise" "$SMALL_TESTS"
  run "compute-sanitizer initcheck (small)" 45 env ZENFLOW_GPU_SMALL=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$SANITIZER" --tool initcheck --error-exitcode 1 --target-processes all \
    "$PYTHON" -m pytest -q -x -m gpu -k "unaligned or several_launches or bitwise" "$SMALL_TESTS"
else
  say "compute-sanitizer not found"
  FAILED+=("compute-sanitizer (not found)")
fi

if part kernels; then
  run "benchmark" 120 "$PYTHON" "$ROOT/benchmarks/device/bench_gpu.py" --out "$OUT/$STAMP-gpu-kernels.md"
  [[ -f $OUT/$STAMP-gpu-kernels.md ]] && cat "$OUT/$STAMP-gpu-kernels.md"
  run "benchmark lm_head fp16 1%" 60 "$PYTHON" "$ROOT/benchmarks/device/bench_gpu.py" --layers 2 --lm-head \
    --dtype float16 --ratio 0.01 --reps 5 --out "$OUT/$STAMP-gpu-kernels-lm-head-fp16.md"
  [[ -f $OUT/$STAMP-gpu-kernels-lm-head-fp16.md ]] && cat "$OUT/$STAMP-gpu-kernels-lm-head-fp16.md"
fi

say "done in $((SECONDS - START)) s"
if ((${#FAILED[@]})); then
  printf 'FAILED: %s\n' "${FAILED[@]}" | tee -a "$LOG"
  exit 1
fi
echo "all device checks passed" | tee -a "$LOG"
