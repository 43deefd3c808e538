#!/usr/bin/env bash
# The whole test suite: the C/C++ tests on a core-only build (no Python, no torch: the
# core must not need them), then the Python tests against the installed zenflow.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${ZENFLOW_TEST_BUILD_DIR:-build-tests}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DZENFLOW_BUILD_PYTHON=OFF -DZENFLOW_BUILD_TESTS=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_Python=ON -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON
cmake --build "$build_dir"
ctest --test-dir "$build_dir" --output-on-failure

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
status=0
python -m pytest tests/python -q -rs || status=$?
if [ "$status" -eq 5 ]; then
  echo "run_all.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
