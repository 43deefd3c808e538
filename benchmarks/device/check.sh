#!/usr/bin/env bash
# The GPU check of zenflow (benchmarks/device/README.md): one command, at most 8 minutes,
# on the lent GPU machine (offline; python3, torch with CUDA, pybind11, cmake, ninja;
# optional: cupy, compute-sanitizer). Steps in priority order, so that a short lease still
# yields the numbers that matter most:
#
#   1 build               libzenflow + zenflow._C with CUDA (sm_90), placed in python/zenflow
#   2 kernel benchmark    bench_gpu.py: 7B shapes bf16 k=10%, then lm_head fp16 k=1%
#   3 GPU tests           pytest -m gpu (-v -rfE, a per-test timeout, unbuffered)
#   4 engine benchmark    bench_engine_gpu.py (~1B bf16 parameters)
#   5 sanitizers          compute-sanitizer: the engine's short runs (memcheck, racecheck),
#                         the kernel tests (memcheck), the hazard tests (racecheck, synccheck,
#                         initcheck); no -x, print limits
#   6 demo                python -m zenflow demo --device cuda (tiny model, 30 steps)
#
# Each step has its own limit and an estimate of its time on an H200 with 16 cores (from
# the counts: ~45 C++/CUDA translation units, 107 GPU tests, ...); a step that would start
# past the budget (ZENFLOW_CHECK_BUDGET_S, 470 s) is reported as skipped, and a started step
# gets at most the time left.
#
# Outputs under $OUT (the device tool's folder; default benchmarks/results), at most 7 files:
#   <date>-device-check.md       every step: status, seconds, limit; failing tests by name
#   <date>-device-check.log      every step's output
#   <date>-gpu-kernels.md        the two kernel benchmark tables
#   <date>-engine-gpu.json/.md   the engine benchmark (every number / its table)
#   <date>-demo-cuda.md          the demo's table
#
#   bash benchmarks/device/check.sh
#   ZENFLOW_CHECK_DRY_RUN=1 bash benchmarks/device/check.sh   # no build, no GPU work: the plan,
#       every file and test selection checked (pytest --collect-only), the budget simulated
#       with the estimates; run in CI with a fake nvidia-smi (tests/python/test_device_check.py)
#
# Exit status: 0 when every step passed; 1 when a step failed or was skipped; 2 when there
# is no GPU (nvidia-smi lists none) or the arguments are wrong.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$ROOT/benchmarks/results}
mkdir -p "$OUT"
STAMP=$(date +%Y-%m-%d)
LOG=$OUT/$STAMP-device-check.log
SUMMARY=$OUT/$STAMP-device-check.md
BUILD=${ZENFLOW_DEVICE_BUILD:-$ROOT/build-device}
PYTHON=${PYTHON:-python3}
DRY=${ZENFLOW_CHECK_DRY_RUN:-0}
BUDGET=${ZENFLOW_CHECK_BUDGET_S:-470}
TEST_TIMEOUT=${ZENFLOW_TEST_TIMEOUT_S:-60}
export ZENFLOW_CUDA_ARCHS=${ZENFLOW_CUDA_ARCHS:-90} # one architecture: half the compile time
export PYTHONUNBUFFERED=1
SELF=(bash "$ROOT/benchmarks/device/check.sh" --run-step)

# ---- the steps' bodies (each runs in its own process: `check.sh --run-step NAME`, so that
# its limit can end it and everything it started) ----

build() { # the library and the Python module only (CI builds and runs the C++ tests)
  local pybind11_dir
  pybind11_dir=$("$PYTHON" -m pybind11 --cmakedir) || return 1
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZENFLOW_WITH_CUDA=ON \
    -DZENFLOW_BUILD_PYTHON=ON -DZENFLOW_BUILD_TESTS=OFF -DZENFLOW_BUILD_EXAMPLES=OFF \
    -Dpybind11_DIR="$pybind11_dir" -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$ROOT/python/zenflow" || return 1
  cmake --build "$BUILD" -j "$(nproc)" --target _C || return 1
  "$PYTHON" -m zenflow info
}

kernels() { # the two kernel benchmark tables, in one file
  local table=$OUT/$STAMP-gpu-kernels.md part
  part=$(mktemp)
  "$PYTHON" "$ROOT/benchmarks/device/bench_gpu.py" --reps 5 --out "$part" || return 1
  cat "$part" >"$table"
  echo >>"$table"
  "$PYTHON" "$ROOT/benchmarks/device/bench_gpu.py" --layers 2 --lm-head --dtype float16 --ratio 0.01 \
    --reps 5 --out "$part" || return 1
  cat "$part" >>"$table"
  rm -f "$part"
  cat "$table"
}

engine() {
  local json=$OUT/$STAMP-engine-gpu.json
  "$PYTHON" "$ROOT/benchmarks/device/bench_engine_gpu.py" --steps 8 --out "$json" || return 1
  "$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["table"])' "$json" |
    tee "$OUT/$STAMP-engine-gpu.md"
}

# compute-sanitizer with torch's caching allocator off (memcheck sees real allocations only
# then), small sizes, a print limit; the selections are checked by the dry run.
TESTS=$ROOT/tests/python
GPU_TESTS=(-m gpu -k "not compute_sanitizer" "$TESTS")
ENGINE_SANITIZER=(-m gpu -k compute_sanitizer "$TESTS/test_gpu_engine.py")
KERNEL_MEMCHECK=(-m gpu -k "not graph and not cupy and not sweep" "$TESTS/test_gpu_kernels.py")
HAZARDS=(-m gpu -k "unaligned or several_launches or bitwise" "$TESTS/test_gpu_hazards.py")
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
sanitize() { # TOOL [tool options] -- pytest arguments
  local tool=()
  while [[ $1 != -- ]]; do
    tool+=("$1")
    shift
  done
  shift
  ZENFLOW_GPU_SMALL=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SANITIZER" --error-exitcode 1 --print-limit 20 \
    --target-processes all --tool "${tool[@]}" "$PYTHON" -m pytest -q -rfE -p no:cacheprovider "$@"
}
sanitize_engine() {
  ZENFLOW_SANITIZER_TIMEOUT_S=25 "$PYTHON" -m pytest -v -rfE -p no:cacheprovider "${ENGINE_SANITIZER[@]}"
}
sanitize_kernels() { sanitize memcheck -- "${KERNEL_MEMCHECK[@]}"; }
sanitize_races() { sanitize racecheck --racecheck-report hazard -- "${HAZARDS[@]}"; }
sanitize_sync_init() {
  local status=0
  sanitize synccheck -- "${HAZARDS[@]}" || status=1
  sanitize initcheck -- "${HAZARDS[@]}" || status=1
  return $status
}

gpu_tests() {
  ZENFLOW_TEST_TIMEOUT_S="$TEST_TIMEOUT" "$PYTHON" -m pytest -v -rfE -p no:cacheprovider "${GPU_TESTS[@]}"
}

demo() { # the three runs on the GPU (UTF-8 bytes when the tokenizers package is missing)
  local dir
  dir=$(mktemp -d)
  "$PYTHON" -m zenflow demo --device cuda --model-size tiny --steps 30 --no-progress --out "$dir" \
    --cache "$BUILD/demo-cache" || return 1
  cp "$dir/table.md" "$OUT/$STAMP-demo-cuda.md" && cat "$dir/table.md"
}

if [[ ${1:-} == --run-step ]]; then
  [[ $DRY == 0 ]] && export PYTHONPATH=$ROOT/python:$TESTS${PYTHONPATH:+:$PYTHONPATH}
  [[ -x $SANITIZER ]] && export PATH="$(dirname "$SANITIZER"):$PATH" # test_gpu_engine.py looks it up
  "$2"
  exit $?
fi

START=$SECONDS
SIMULATED=0 # the dry run's clock: the estimates of the steps "run" so far
FAILED=()
: >"$LOG"

elapsed() { echo $((SECONDS - START + SIMULATED)); }
say() { echo "== $* [$(elapsed) s]" | tee -a "$LOG"; }
note() { echo "$*" >>"$SUMMARY"; }

cat >"$SUMMARY" <<EOF
# zenflow device check, $STAMP

$( ((DRY)) && echo "DRY RUN (no build, no GPU work; times are the estimates)")

| step | status | seconds | limit | estimate |
|---|---|---:|---:|---:|
EOF

# step NAME LIMIT_S ESTIMATE_S CMD...: runs CMD with its output in the log, within its own
# limit and the budget left; records the result in the summary instead of stopping.
step() {
  local name=$1 limit=$2 estimate=$3
  shift 3
  local left=$((BUDGET - $(elapsed)))
  if ((left < 20)); then
    say "SKIPPED $name (budget spent)"
    note "| $name | SKIPPED (budget) | - | $limit | $estimate |"
    FAILED+=("$name (skipped: budget)")
    return
  fi
  ((limit > left)) && limit=$left
  say "$name (limit $limit s, estimate $estimate s)"
  echo "\$ $*" >>"$LOG"
  local started=$SECONDS status=0
  if ((DRY)); then
    SIMULATED=$((SIMULATED + estimate))
  else
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1 || status=$?
  fi
  local took=$((SECONDS - started))
  ((DRY)) && took=$estimate
  if ((status == 0)); then
    say "ok $name (${took} s)"
    note "| $name | ok | $took | $limit | $estimate |"
  else
    local why="status $status"
    ((status == 124 || status == 137)) && why="killed at its limit"
    say "FAILED $name ($why, ${took} s)"
    note "| $name | FAILED ($why) | $took | $limit | $estimate |"
    FAILED+=("$name")
  fi
}

# In a dry run: the file must exist.
need_file() {
  if [[ ! -e $1 ]]; then
    say "MISSING $1"
    FAILED+=("missing $1")
  fi
}

# In a dry run: the script's --help must know every flag the step gives it.
need_flags() { # command... -- flag...
  local command=() help
  while [[ $1 != -- ]]; do
    command+=("$1")
    shift
  done
  shift
  help=$("${command[@]}" --help 2>&1) || true
  local flag
  for flag in "$@"; do
    if ! grep -q -- "$flag" <<<"$help"; then
      say "UNKNOWN FLAG $flag for ${command[*]}"
      FAILED+=("unknown flag $flag")
    fi
  done
}

# In a dry run: the pytest selection must collect at least one test (a renamed test must
# not silently drop out of the GPU check).
need_tests() {
  local count
  count=$(cd "$ROOT" && "$PYTHON" -m pytest --collect-only -q -p no:cacheprovider "$@" 2>>"$LOG" |
    grep -c '::') || true
  echo "collected $count: $*" >>"$LOG"
  if ((count == 0)); then
    say "EMPTY test selection: $*"
    FAILED+=("empty selection: $*")
  fi
}

say "zenflow device check in $ROOT, archs $ZENFLOW_CUDA_ARCHS, $(nproc) cores, budget $BUDGET s$( ((DRY)) && echo ', DRY RUN')"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >>"$LOG" 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  say "no GPU visible (nvidia-smi lists none): nothing to check"
  note "| GPU | NONE VISIBLE | - | - | - |"
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$LOG" 2>&1 || true

if ((DRY)); then
  # The installed zenflow collects the tests (the real run imports the build in python/).
  export PYTHONPATH=$TESTS${PYTHONPATH:+:$PYTHONPATH}
fi

if ((DRY)); then
  need_flags "$PYTHON" "$ROOT/benchmarks/device/bench_gpu.py" -- --reps --out --layers --lm-head --dtype --ratio
  need_flags "$PYTHON" "$ROOT/benchmarks/device/bench_engine_gpu.py" -- --steps --out
  need_flags "$PYTHON" -m zenflow demo -- --device --model-size --steps --no-progress --out --cache
  need_tests "${GPU_TESTS[@]}"
fi
step "build" 150 60 "${SELF[@]}" build
step "kernel benchmark" 75 45 "${SELF[@]}" kernels
step "GPU tests" 170 100 "${SELF[@]}" gpu_tests
step "engine benchmark" 100 70 "${SELF[@]}" engine
if ((DRY)); then
  need_tests "${ENGINE_SANITIZER[@]}"
  need_tests "${KERNEL_MEMCHECK[@]}"
  need_tests "${HAZARDS[@]}"
elif [[ ! -x $SANITIZER ]]; then
  say "compute-sanitizer not found"
  note "| sanitizers | NOT FOUND | - | - | - |"
  FAILED+=("compute-sanitizer (not found)")
fi
if ((DRY)) || [[ -x $SANITIZER ]]; then
  step "sanitizer: engine (memcheck, racecheck)" 60 50 "${SELF[@]}" sanitize_engine
  step "sanitizer: kernels (memcheck)" 60 40 "${SELF[@]}" sanitize_kernels
  step "sanitizer: hazards (racecheck)" 30 15 "${SELF[@]}" sanitize_races
  step "sanitizer: hazards (synccheck, initcheck)" 30 20 "${SELF[@]}" sanitize_sync_init
fi
step "demo" 60 30 "${SELF[@]}" demo

# ---- the summary: failing tests by name, then the verdict
FAILING=$(grep -E '(FAILED|ERROR) tests/|^tests/python/.*::.* (FAILED|ERROR)' "$LOG" | sort -u | head -40)
if [[ -n $FAILING ]]; then
  note ""
  note "Failing tests:"
  note ""
  while IFS= read -r line; do note "- \`$line\`"; done <<<"$FAILING"
fi
note ""
say "done in $(elapsed) s"
if ((${#FAILED[@]})); then
  note "FAILED: ${FAILED[*]}"
  printf 'FAILED: %s\n' "${FAILED[@]}" | tee -a "$LOG"
  exit 1
fi
note "all device checks passed"
echo "all device checks passed" | tee -a "$LOG"
