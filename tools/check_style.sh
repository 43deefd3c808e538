#!/usr/bin/env bash
# clang-format (file-based, .clang-format) on C/C++/CUDA and ruff (lint + format) on Python.
# Pass --fix to rewrite files instead of checking them.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t sources < <(git ls-files -co --exclude-standard -- '*.c' '*.h' '*.cpp' '*.hpp' '*.cu' '*.cuh')
mapfile -t python_paths < <(git ls-files -co --exclude-standard -- '*.py')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${sources[@]}"
  ruff check --fix "${python_paths[@]}"
  ruff format "${python_paths[@]}"
else
  clang-format --dry-run -Werror "${sources[@]}"
  ruff check "${python_paths[@]}"
  ruff format --check "${python_paths[@]}"
fi
echo "style: ${#sources[@]} C/C++/CUDA files and ${#python_paths[@]} Python files clean"
