// Index arithmetic of the column ops, shared by the CUDA kernels and their host twins
// (ZF_HOST_DEVICE): which matrix column a compact or packed position stands for, where
// a packed element lives, and element loads/stores in the three float dtypes.
#pragma once

#include <cstdint>

#include "common/float_convert.hpp"
#include "zenflow/zenflow.h"

namespace zf {

// The j-th (0-based) column of [0, n) that is not in `selected` (k ascending, distinct
// indices). Before selected[s] lie selected[s] - s unselected columns, a non-decreasing
// sequence in s; the answer is j plus the number of s with selected[s] - s <= j, found by
// binary search: O(log k), no complement list.
ZF_HOST_DEVICE static inline int64_t unselected_column(const int32_t* selected, int32_t k, int64_t j) {
  int32_t lo = 0, hi = k;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(selected[mid]) - mid <= j) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return j + lo;
}

// Matrix column of compact position c: selected[c], or c itself when every column is
// selected (selected == nullptr, the dense case).
ZF_HOST_DEVICE static inline int64_t selected_column(const int32_t* selected, int64_t c) {
  return selected ? static_cast<int64_t>(selected[c]) : c;
}

// Position of `column` in an ascending list, or -1.
ZF_HOST_DEVICE static inline int32_t find_in_sorted(const int32_t* list, int32_t length, int32_t column) {
  int32_t lo = 0, hi = length;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (list[mid] < column) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return (lo < length && list[lo] == column) ? lo : -1;
}

// Packed (column-major) element (r, j) of a matrix region starting at `offset`.
ZF_HOST_DEVICE static inline int64_t packed_index(int64_t offset, int64_t rows, int64_t j, int64_t r) {
  return offset + j * rows + r;
}

// Element (r, c) of a row-major [rows, cols] array.
ZF_HOST_DEVICE static inline int64_t row_major_index(int64_t cols, int64_t r, int64_t c) { return r * cols + c; }

ZF_HOST_DEVICE static inline float load_as_float(const void* base, int32_t dtype, int64_t index) {
  if (dtype == ZF_DTYPE_F32) return static_cast<const float*>(base)[index];
  const uint16_t bits = static_cast<const uint16_t*>(base)[index];
  return dtype == ZF_DTYPE_BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

// Rounds to nearest even for the 16-bit types (the same rounding on host and device).
ZF_HOST_DEVICE static inline void store_from_float(void* base, int32_t dtype, int64_t index, float value) {
  if (dtype == ZF_DTYPE_F32) {
    static_cast<float*>(base)[index] = value;
  } else {
    static_cast<uint16_t*>(base)[index] = dtype == ZF_DTYPE_BF16 ? f32_to_bf16(value) : f32_to_f16(value);
  }
}

}  // namespace zf
