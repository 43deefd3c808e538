#!/usr/bin/env bash
# Checks the dynamic symbol table of a built libzenflow.so: every defined dynamic symbol must
# be a zf_ function of the C ABI (nothing of libstdc++ or of zenflow's C++ internals leaks,
# see cmake/zenflow.map), and every function declared ZF_API in cpp/include/zenflow/*.h must
# be there. Exits non-zero, listing the offenders, otherwise.
#
#   bash tools/check_exports.sh build-tests/libzenflow.so
set -euo pipefail
cd "$(dirname "$0")/.."
library=${1:?usage: tools/check_exports.sh path/to/libzenflow.so}

# nm -D --defined-only: "ADDRESS TYPE NAME"; the NAME field of versioned symbols may carry
# @VERSION, which is not part of the name.
mapfile -t exported < <(nm -D --defined-only "$library" | awk '{print $3}' | sed 's/@.*//' | sort -u)
if [ "${#exported[@]}" -eq 0 ]; then
  echo "check_exports: $library exports nothing (not a shared library?)" >&2
  exit 1
fi
status=0
foreign=$(printf '%s\n' "${exported[@]}" | grep -v '^zf_' || true)
if [ -n "$foreign" ]; then
  echo "check_exports: $library exports symbols outside the C ABI (only zf_* may be):" >&2
  echo "$foreign" | sed 's/^/  /' >&2
  status=1
fi
# The names declared ZF_API: the identifier just before the parameter list.
mapfile -t declared < <(sed -n 's/^ZF_API[^(]*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)(.*/\1/p' \
  cpp/include/zenflow/*.h | sort -u)
missing=$(comm -23 <(printf '%s\n' "${declared[@]}") <(printf '%s\n' "${exported[@]}"))
if [ -n "$missing" ]; then
  echo "check_exports: declared ZF_API in cpp/include/zenflow but not exported by $library:" >&2
  echo "$missing" | sed 's/^/  /' >&2
  status=1
fi
soname=$(objdump -p "$library" | awk '$1 == "SONAME" {print $2}')
if [ "$status" -eq 0 ]; then
  echo "check_exports: $library (SONAME ${soname:-none}) exports exactly the ${#declared[@]} zf_ functions of the headers"
fi
exit "$status"
