#!/usr/bin/env bash
# The whole test suite: the C/C++ tests on a core-only build (no Python, no torch: the core
# must not need them), then the Python tests against the installed zenflow. Installs its own
# test dependencies first (tools/test_deps.sh).
#
# CUDA: where nvcc is found, the test build compiles cuda/ even without a GPU (for the visible
# GPU's architecture, else for 90 alone), so the kernels at least compile everywhere; the GPU
# tests themselves skip without a GPU. ZENFLOW_WITH_CUDA / ZENFLOW_CUDA_ARCHS override this.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
phase() { echo "run_all.sh: [$((SECONDS - started)) s] $*" >&2; }

phase "test dependencies"
bash tools/test_deps.sh

if [ -z "${ZENFLOW_WITH_CUDA:-}" ] && [ -z "${ZENFLOW_CUDA_ARCHS:-}" ] &&
  { command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ]; } &&
  ! nvidia-smi --query-gpu=compute_cap --format=csv,noheader > /dev/null 2>&1; then
  export ZENFLOW_CUDA_ARCHS=90
fi

build_dir=${ZENFLOW_TEST_BUILD_DIR:-build-tests}
phase "configure the core-only C/C++ test build in $build_dir"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DZENFLOW_BUILD_PYTHON=OFF -DZENFLOW_BUILD_TESTS=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_Python=ON -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON
phase "build"
cmake --build "$build_dir"
phase "C/C++ tests (ctest)"
ctest --test-dir "$build_dir" --output-on-failure

# ---- libzenflow for other runtimes: the installed package, its exports, and the C ABI fuzzed
phase "installed package from $build_dir: exports, cmake --install, CMake and pkg-config consumers (tools/test_install.sh)"
ZENFLOW_INSTALL_BUILD_DIR=$build_dir bash tools/test_install.sh
if [ "${ZENFLOW_FUZZ:-1}" != 0 ]; then
  phase "fuzz the C ABI: the corpus, then the fixed campaign (tools/run_fuzz.sh; ZENFLOW_FUZZ=0 skips it)"
  bash tools/run_fuzz.sh
fi
# ---- end of the installed-package and fuzz block

phase "Python tests (pytest, against the installed zenflow)"
# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
status=0
# --durations: the slowest tests, in the log, for whoever next looks at CI's time.
python -m pytest tests/python -q -rs --durations=15 || status=$?
if [ "$status" -eq 5 ]; then
  echo "run_all.sh: pytest collected no tests" >&2
  exit 1
fi
phase "done (pytest status $status)"
exit "$status"
