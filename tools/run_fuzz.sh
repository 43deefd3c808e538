#!/usr/bin/env bash
# Builds the libFuzzer target fuzz/fuzz_c_abi.cpp (Clang, -fsanitize=fuzzer,address,undefined,
# host-only) in build-fuzz/ and runs it for a bounded time from the committed seed corpus
# fuzz/corpus/ (new inputs go to a temporary directory; the committed corpus is not changed).
# Any crash, sanitizer report, leak, timeout or out-of-memory fails the run and leaves the
# input in build-fuzz/artifacts/.
#
#   bash tools/run_fuzz.sh              # 60 s (ZENFLOW_FUZZ_SECONDS to change)
#
# Grow the seed corpus: run longer, then
#   build-fuzz/fuzz/zenflow_fuzz_c_abi -merge=1 fuzz/corpus NEW_INPUTS_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "run_fuzz.sh: $*" >&2; }
seconds=${ZENFLOW_FUZZ_SECONDS:-60}
build_dir=${ZENFLOW_FUZZ_BUILD_DIR:-build-fuzz}
if ! command -v clang > /dev/null || ! command -v clang++ > /dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get > /dev/null; then
    say "apt-get install clang (libFuzzer)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang > /dev/null
  else
    say "FAIL: clang and clang++ are needed (Debian: apt-get install -y clang)"
    exit 1
  fi
fi
started=$SECONDS
say "configure and build in $build_dir"
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DZENFLOW_BUILD_FUZZERS=ON -DZENFLOW_WITH_CUDA=OFF -DZENFLOW_BUILD_PYTHON=OFF -DZENFLOW_BUILD_TESTS=OFF \
  -DZENFLOW_BUILD_EXAMPLES=OFF > /dev/null
cmake --build "$build_dir" --target zenflow_fuzz_c_abi
say "built in $((SECONDS - started)) s; fuzzing for $seconds s"
work=$(mktemp -d "${TMPDIR:-/tmp}/zenflow-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$build_dir/artifacts"
# One job; -timeout: a single input running 10 s is a hang; -rss_limit_mb: a runaway allocation.
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  "$build_dir/fuzz/zenflow_fuzz_c_abi" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/" "$work" fuzz/corpus
say "passed: $seconds s without a crash, sanitizer report or leak"
