#!/usr/bin/env bash
# Installs what tests/run_all.sh needs and a fresh machine may lack: pytest, numpy, cmake and
# ninja from pip (into the active Python), transformers, accelerate and lightning for the
# integration tests (optional), GoogleTest from apt (root only; libgtest-dev), and ccache when
# apt can provide it (optional: it only makes rebuilds faster). Installs nothing that is
# already there.
set -euo pipefail

python=${PYTHON:-python}
say() { echo "test_deps.sh: $*" >&2; }

missing_pip=()
"$python" -c "import pytest" 2>/dev/null || missing_pip+=("pytest>=7")
"$python" -c "import numpy" 2>/dev/null || missing_pip+=(numpy)
# the demo's accuracy test (tests/python/test_demo.py) runs the demo: its extra's packages
"$python" -c "import tokenizers" 2>/dev/null || missing_pip+=("tokenizers>=0.15")
"$python" -c "import tqdm" 2>/dev/null || missing_pip+=("tqdm>=4.60")
"$python" -c "import matplotlib" 2>/dev/null || missing_pip+=("matplotlib>=3.5")
command -v cmake > /dev/null || missing_pip+=("cmake>=3.25")
command -v ninja > /dev/null || missing_pip+=(ninja)
if [ ${#missing_pip[@]} -gt 0 ]; then
  say "pip install ${missing_pip[*]}"
  "$python" -m pip install -q --disable-pip-version-check "${missing_pip[@]}"
fi

# The integration tests (tests/python/test_integrations.py): zenflow's "integrations" extra.
# Optional: without them those tests skip. torch is pinned to the installed build, so that
# pip never swaps it for another (a bare torch requirement pulls a multi-GB CUDA build).
# ZENFLOW_TEST_INTEGRATIONS=0 leaves them out.
if [ "${ZENFLOW_TEST_INTEGRATIONS:-1}" != 0 ]; then
  missing_integrations=()
  "$python" -c "import transformers" 2>/dev/null || missing_integrations+=("transformers>=4.40")
  "$python" -c "import accelerate" 2>/dev/null || missing_integrations+=("accelerate>=0.26")
  "$python" -c "import lightning" 2>/dev/null || missing_integrations+=("lightning>=2.1")
  if [ ${#missing_integrations[@]} -gt 0 ]; then
    torch_version=$("$python" -c "import torch; print(torch.__version__)" 2>/dev/null || true)
    constraints=$(mktemp)
    [ -n "$torch_version" ] && echo "torch==$torch_version" > "$constraints"
    say "pip install ${missing_integrations[*]} (torch kept at ${torch_version:-whatever pip picks})"
    "$python" -m pip install -q --disable-pip-version-check -c "$constraints" "${missing_integrations[@]}" ||
      say "could not install ${missing_integrations[*]}: the integration tests will skip"
    rm -f "$constraints"
  fi
fi

# GoogleTest: CMake's FindGTest looks for the headers and the static libraries.
have_gtest() {
  [ -n "${GTEST_ROOT:-}" ] && return 0
  [ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || return 1
  local lib
  for lib in /usr/lib/*/libgtest.{a,so} /usr/lib/libgtest.{a,so} /usr/lib64/libgtest.{a,so} \
    /usr/local/lib/libgtest.{a,so} /usr/local/lib64/libgtest.{a,so}; do
    [ -f "$lib" ] && return 0
  done
  return 1
}
missing_apt=()
have_gtest || missing_apt+=(libgtest-dev)
command -v ccache > /dev/null || missing_apt+=(ccache)
command -v pkg-config > /dev/null || missing_apt+=(pkgconf)  # tools/test_install.sh
if [ ${#missing_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get > /dev/null; then
    say "apt-get install ${missing_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # ccache is a convenience: its absence must not stop the tests.
    apt-get install -y -qq libgtest-dev > /dev/null 2>&1 || have_gtest || true
    apt-get install -y -qq ccache > /dev/null 2>&1 || say "ccache not available (builds are just slower)"
    command -v pkg-config > /dev/null || apt-get install -y -qq pkgconf > /dev/null 2>&1 ||
      say "pkg-config not available: the installed-package test will say so"
  fi
  if ! have_gtest; then
    say "GoogleTest is missing and cannot be installed here (needs root and apt-get)."
    say "Install it (Debian/Ubuntu: sudo apt-get install libgtest-dev; conda: conda install gtest),"
    say "or point CMake at an installed copy with GTEST_ROOT=/path/to/gtest."
    exit 1
  fi
fi
