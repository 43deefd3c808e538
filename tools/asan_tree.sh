#!/usr/bin/env bash
# The one Clang ASan+UBSan build tree of the libFuzzer target and of the sanitized C/C++ test
# suite (issue 25: one build per configuration). tools/run_fuzz.sh builds the fuzzer in it,
# tools/run_sanitizers.sh the tests; both configure it here, identically, so whichever runs
# second finds the library's objects built.
#
#   bash tools/asan_tree.sh [TARGET...]     # configure build-asan/, then build the targets
#
# RelWithDebInfo: optimised like the shipped library (the sanitizers then see the code the
# compiler really generates), with line numbers in the reports. Host-only: the sanitizer
# runtimes cannot see into CUDA kernels. ZENFLOW_SANITIZE_BUILD_PREFIX moves the tree
# (PREFIX-asan).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "asan_tree.sh: $*" >&2; }
build_dir=${ZENFLOW_SANITIZE_BUILD_PREFIX:-build}-asan
if ! command -v clang > /dev/null || ! command -v clang++ > /dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get > /dev/null; then
    say "apt-get install clang (libFuzzer, ASan, UBSan)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang > /dev/null
  else
    say "FAIL: clang and clang++ are needed (Debian: apt-get install -y clang)"
    exit 1
  fi
fi
# A tree configured by another compiler (an older checkout built it with GCC) starts afresh:
# CMake cannot switch the compiler of an existing tree.
if [ -f "$build_dir/CMakeCache.txt" ] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++' "$build_dir/CMakeCache.txt"; then
  say "$build_dir was configured with another compiler: configuring it afresh"
  rm -rf "$build_dir"
fi
# The CUDA switches of the caller's environment (tests/run_all.sh sets ZENFLOW_CUDA_ARCHS)
# would override the host-only setting.
env -u ZENFLOW_WITH_CUDA -u ZENFLOW_CUDA_ARCHS cmake -S . -B "$build_dir" -G Ninja \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DZENFLOW_SANITIZE=address,undefined -DZENFLOW_BUILD_FUZZERS=ON -DZENFLOW_WITH_CUDA=OFF \
  -DZENFLOW_BUILD_PYTHON=OFF -DZENFLOW_BUILD_TESTS=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_Python=ON -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON > /dev/null
if [ $# -gt 0 ]; then cmake --build "$build_dir" --target "$@"; fi
