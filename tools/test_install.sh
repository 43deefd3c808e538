#!/usr/bin/env bash
# The installed package, tested as a user would use it (issue 14): builds libzenflow and the
# benchmark bin/zenflow_bench, checks the library's exports (tools/check_exports.sh), runs
# `cmake --install` into a temporary prefix, checks the installed tree (headers, versioned
# library and SONAME, CMake package, pkg-config file, bin/zenflow_bench, which it runs once),
# then builds the separate project tests/consumer/ against that prefix twice, once with CMake's
# find_package(zenflow) and once with pkg-config, and runs both programs.
#
#   bash tools/test_install.sh                                    # its own build-install/
#   ZENFLOW_INSTALL_BUILD_DIR=build-tests bash tools/test_install.sh
#
# With ZENFLOW_INSTALL_BUILD_DIR naming a configured build tree (tests/run_all.sh passes its
# test build), that tree is installed as it is: libzenflow is built once per configuration
# (issue 25). Otherwise build-install/ is configured as libzenflow alone (host-only, no tests,
# no Python) and kept between runs. The consumer is one C file.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
say() { echo "test_install.sh: $*" >&2; }

build_dir=${ZENFLOW_INSTALL_BUILD_DIR:-build-install}
work=$(mktemp -d "${TMPDIR:-/tmp}/zenflow-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

if [ -n "${ZENFLOW_INSTALL_BUILD_DIR:-}" ] && [ -f "$build_dir/CMakeCache.txt" ]; then
  say "build libzenflow in $build_dir (as configured there)"
else
  say "build libzenflow (CUDA off) in $build_dir"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZENFLOW_WITH_CUDA=OFF \
    -DZENFLOW_BUILD_PYTHON=OFF -DZENFLOW_BUILD_TESTS=OFF -DZENFLOW_BUILD_EXAMPLES=OFF > /dev/null
fi
cmake --build "$build_dir" --target zenflow zenflow_bench
bash tools/check_exports.sh "$build_dir/libzenflow.so"

say "cmake --install into $prefix"
cmake --install "$build_dir" --prefix "$prefix" > /dev/null
version=$(sed -n 's/^project(zenflow VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
libdir=$(dirname "$(find "$prefix" -name "libzenflow.so.$version" | head -n 1)")
expected=(
  "$prefix/include/zenflow/zenflow.h" "$prefix/include/zenflow/engine.h" "$prefix/include/zenflow/zenflow.hpp"
  "$libdir/libzenflow.so.$version" "$libdir/libzenflow.so" "$libdir/cmake/zenflow/zenflowConfig.cmake"
  "$libdir/cmake/zenflow/zenflowConfigVersion.cmake" "$libdir/cmake/zenflow/zenflowTargets.cmake"
  "$libdir/pkgconfig/zenflow.pc" "$prefix/bin/zenflow_bench"
)
for path in "${expected[@]}"; do
  [ -e "$path" ] || { say "FAIL: not installed: ${path#"$prefix"/}"; exit 1; }
done
soname=$(objdump -p "$libdir/libzenflow.so.$version" | awk '$1 == "SONAME" {print $2}')
major_minor=${version%.*}
case "$version" in 0.*) want_soname=libzenflow.so.$major_minor ;; *) want_soname=libzenflow.so.${version%%.*} ;; esac
[ "$soname" = "$want_soname" ] || { say "FAIL: SONAME '$soname', expected '$want_soname'"; exit 1; }
[ -L "$libdir/$soname" ] || { say "FAIL: no $soname symlink"; exit 1; }
bash tools/check_exports.sh "$libdir/libzenflow.so.$version"
say "installed benchmark: bin/zenflow_bench (the installed library against plain C loops)"
"$prefix/bin/zenflow_bench" --quick --rounds 1 --elements 65536 --json > "$work/bench.json"
grep -q '"speedup_vs_peer"' "$work/bench.json" || { say "FAIL: zenflow_bench printed no ratios"; exit 1; }

# The consumer runs from a copy, outside the source tree, so that nothing can reach back
# into cpp/include or the build directory.
cp -r tests/consumer "$work/consumer-src"

say "consumer with CMake: find_package(zenflow CONFIG REQUIRED), zenflow::zenflow"
cmake -S "$work/consumer-src" -B "$work/consumer-cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" > /dev/null
cmake --build "$work/consumer-cmake"
grep -q "$prefix" "$work/consumer-cmake/CMakeCache.txt" || { say "FAIL: CMake did not use $prefix"; exit 1; }
"$work/consumer-cmake/consumer"

say "consumer with pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig
pc_version=$(pkg-config --modversion zenflow)
[ "$pc_version" = "$version" ] || { say "FAIL: pkg-config version '$pc_version', expected '$version'"; exit 1; }
# shellcheck disable=SC2046  # pkg-config's flags are meant to be split
"${CC:-cc}" -std=c99 -Wall -Wextra -pedantic -Werror $(pkg-config --cflags zenflow) \
  "$work/consumer-src/consumer.c" -o "$work/consumer-pkgconfig" $(pkg-config --libs zenflow) \
  -Wl,-rpath,"$(pkg-config --variable=libdir zenflow)"
# The program must load the installed library, not one of a build tree.
loaded=$(ldd "$work/consumer-pkgconfig" | awk -v so="$soname" '$1 == so {print $3}')
[ -n "$loaded" ] && [ "$(readlink -f "$loaded")" = "$(readlink -f "$libdir/$soname")" ] ||
  { say "FAIL: the pkg-config build does not load $libdir/$soname"; ldd "$work/consumer-pkgconfig" >&2; exit 1; }
"$work/consumer-pkgconfig"
say "passed (CMake and pkg-config consumers of zenflow $version, SONAME $soname)"
