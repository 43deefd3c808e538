#!/usr/bin/env bash
# The libFuzzer target fuzz/fuzz_c_abi.cpp (Clang, ASan+UBSan, host-only), built in the one
# Clang ASan+UBSan tree it shares with the sanitized test suite (tools/asan_tree.sh).
#
#   bash tools/run_fuzz.sh                    # the deterministic gate (CI, tests/run_all.sh)
#   bash tools/run_fuzz.sh --explore SECONDS  # an exploratory campaign, random seed
#
# The gate runs every committed input of fuzz/corpus/ once, then a fixed campaign: the same
# ZENFLOW_FUZZ_MUTANTS inputs (50000 by default, about 20 s) mutated from the corpus with a
# fixed seed by fuzz/mutate_corpus.py, each run once. Nothing in it depends on a random seed
# or on thread timing, so the same commit passes or fails the same way every time.
#
# The exploratory campaign is libFuzzer's own, guided by coverage, from the corpus, with a
# random seed (it prints it as "Seed: N"; ZENFLOW_FUZZ_SEED=N repeats its start) for SECONDS.
# New inputs go to build-asan/fuzz-new/ (kept, so that a developer can merge the useful
# ones into the corpus, see fuzz/README.md); the committed corpus is not changed.
#
# Either way, any crash, sanitizer report, leak, timeout (10 s for one input) or runaway
# allocation fails the run and leaves the input in build-asan/artifacts/. Replay it with
# `build-asan/fuzz/zenflow_fuzz_c_abi build-asan/artifacts/crash-...`; once fixed, commit it
# to fuzz/corpus/ with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "run_fuzz.sh: $*" >&2; }
mode=gate
seconds=0
case "${1:-}" in
  "") ;;
  --explore)
    mode=explore
    seconds=${2:-}
    [[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { say "--explore needs a number of seconds"; exit 2; }
    ;;
  *) say "unknown argument '$1' (none, or --explore SECONDS)"; exit 2 ;;
esac
build_dir=${ZENFLOW_SANITIZE_BUILD_PREFIX:-build}-asan
started=$SECONDS
say "build the fuzz target in $build_dir"
bash tools/asan_tree.sh zenflow_fuzz_c_abi
fuzzer=$build_dir/fuzz/zenflow_fuzz_c_abi
say "built in $((SECONDS - started)) s"
mkdir -p "$build_dir/artifacts"
# -timeout: a single input running 10 s is a hang; -rss_limit_mb: a runaway allocation.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
common=(-timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$build_dir/artifacts/")

if [ "$mode" = explore ]; then
  mkdir -p "$build_dir/fuzz-new"
  seed=${ZENFLOW_FUZZ_SEED:-0}  # 0: libFuzzer picks one (and prints it)
  say "exploring for $seconds s (seed ${seed/#0/random}); new inputs in $build_dir/fuzz-new/"
  "$fuzzer" -seed="$seed" -max_total_time="$seconds" "${common[@]}" "$build_dir/fuzz-new" fuzz/corpus
  say "passed: $seconds s without a crash, sanitizer report or leak"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/zenflow-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
corpus_files=$(find fuzz/corpus -type f | wc -l)
say "replay the committed corpus: $corpus_files inputs, each once"
started=$SECONDS
"$fuzzer" -runs=0 "${common[@]}" fuzz/corpus 2> "$work/replay.log" || { cat "$work/replay.log" >&2; exit 1; }
say "corpus replayed in $((SECONDS - started)) s: $(grep -m1 -o 'INITED.*corp: [0-9]*' "$work/replay.log")"
mutants=${ZENFLOW_FUZZ_MUTANTS:-50000}
if [ "$mutants" -gt 0 ]; then
  say "fixed campaign: $mutants inputs mutated from the corpus with seed 1 (fuzz/mutate_corpus.py), each once"
  started=$SECONDS
  "${PYTHON:-python3}" fuzz/mutate_corpus.py fuzz/corpus "$work/mutants" "$mutants" 1
  "$fuzzer" -runs=0 "${common[@]}" "$work/mutants" 2> "$work/campaign.log" || { cat "$work/campaign.log" >&2; exit 1; }
  say "campaign ran in $((SECONDS - started)) s: $(grep -m1 -o 'INITED.*corp: [0-9]*' "$work/campaign.log")"
fi
say "passed: $corpus_files corpus inputs and $mutants fixed-campaign inputs without a crash, sanitizer report or leak"
