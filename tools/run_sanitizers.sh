#!/usr/bin/env bash
# Builds the C/C++ test suite under AddressSanitizer + UndefinedBehaviorSanitizer, then under
# ThreadSanitizer, and runs the whole ctest suite in each (host-only builds: no CUDA, no
# Python; under TSan all but the two fork tests TSan cannot run, see below). Any report fails
# the run: UBSan does not recover, ASan and TSan halt on the first error, and leak checking
# stays on.
#
#   bash tools/run_sanitizers.sh                 # both
#   bash tools/run_sanitizers.sh address,undefined
#   bash tools/run_sanitizers.sh thread
#
# ASan+UBSan: the Clang tree build-asan/ that the fuzzer shares (tools/asan_tree.sh; after
# tools/run_fuzz.sh only the tests are left to build). TSan: build-tsan/ with the default
# compiler. ZENFLOW_SANITIZE_BUILD_PREFIX moves both (PREFIX-asan, PREFIX-tsan).
#
# Tests run in parallel (ctest -j; ZENFLOW_SANITIZE_JOBS overrides the count): under ASan one
# per core, under TSan four per core, since a TSan process sleeps 1 s at exit (its
# atexit_sleep_ms, to catch races with threads that outlive main) and its tests mostly wait.
# The tests that measure time or wait with a deadline (the executor's latency and concurrency
# tests, the in-process collectives' timeout, the fork tests) run one at a time afterwards,
# since tests beside them under the sanitizers' slowdown would skew what they measure.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${ZENFLOW_SANITIZE_BUILD_PREFIX:-build}
cores=$(nproc 2> /dev/null || echo 2)
serial='^(Executor|WorkQueue|ThreadPool|ParallelRuntime|Fork|InProcessCollectives)\.'
if [ $# -eq 0 ]; then set -- address,undefined thread; fi

for sanitizers in "$@"; do
  targets=(zenflow_tests zenflow_c_api_test zenflow_c_abi_test zenflow_example_train_linear)
  started=$SECONDS
  case "$sanitizers" in
    address,undefined)
      build_dir=$prefix-asan
      jobs=${ZENFLOW_SANITIZE_JOBS:-$cores}
      echo "run_sanitizers.sh: [$sanitizers] configure and build in $build_dir (Clang, the fuzzer's tree)" >&2
      bash tools/asan_tree.sh
      ;;
    thread)
      build_dir=$prefix-tsan
      jobs=${ZENFLOW_SANITIZE_JOBS:-$((4 * cores))}
      echo "run_sanitizers.sh: [$sanitizers] configure and build in $build_dir" >&2
      # RelWithDebInfo: optimised like the shipped library (the sanitizers then see the code
      # the compiler really generates), with line numbers in the reports.
      env -u ZENFLOW_WITH_CUDA -u ZENFLOW_CUDA_ARCHS cmake -S . -B "$build_dir" -G Ninja \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZENFLOW_SANITIZE=thread -DZENFLOW_WITH_CUDA=OFF \
        -DZENFLOW_BUILD_PYTHON=OFF -DZENFLOW_BUILD_TESTS=ON \
        -DCMAKE_DISABLE_FIND_PACKAGE_Python=ON -DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON > /dev/null
      ;;
    *) echo "run_sanitizers.sh: unknown sanitizer set '$sanitizers' (address,undefined or thread)" >&2; exit 2 ;;
  esac
  # The OpenMP runtime test exists where CMake found OpenMP for C.
  if ninja -C "$build_dir" -t query zenflow_c_openmp_runtime_test > /dev/null 2>&1; then
    targets+=(zenflow_c_openmp_runtime_test)
  fi
  cmake --build "$build_dir" --target "${targets[@]}"
  echo "run_sanitizers.sh: [$sanitizers] built in $((SECONDS - started)) s; running ctest" >&2
  started=$SECONDS
  exclude=''
  if [ "$sanitizers" = thread ]; then
    # TSan cannot run the fork tests whose child, forked from a multithreaded parent, starts
    # threads, which TSan refuses ("starting new threads after multi-threaded fork is not
    # supported"; with die_after_fork=0 its thread registry still holds the parent's threads:
    # "dup thread with used id"). They run in the plain and the ASan+UBSan builds.
    # c_openmp_runtime: libgomp is not built with TSan, so TSan cannot see its barriers and
    # would report the team's hand-overs as races.
    exclude='^(Fork\.ChildUsesTheGlobalPool|ParallelRuntime\.AForkedChild|c_openmp_runtime$)'
    echo "run_sanitizers.sh: [thread] excluded (TSan does not support threads after a multithreaded fork): Fork.ChildUsesTheGlobalPool*, ParallelRuntime.AForkedChild*; (libgomp is not instrumented): c_openmp_runtime" >&2
  fi
  # abort_on_error is off: a report ends the process with exitcode, which ctest shows as a
  # plain failure together with the report. The fork tests' children _exit() on purpose,
  # which skips the leak check in the child only.
  export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  parallel_exclude=$serial${exclude:+|$exclude}
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" -E "$parallel_exclude"
  ctest --test-dir "$build_dir" --output-on-failure -R "$serial" ${exclude:+-E "$exclude"}
  echo "run_sanitizers.sh: [$sanitizers] ctest clean in $((SECONDS - started)) s" >&2
done
