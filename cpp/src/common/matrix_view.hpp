// A parameter seen as a matrix [rows, cols] (docs/design.md section 2): 0-D as [1, 1], 1-D
// [n] as [1, n], more dimensions as [shape[0], product of the rest]. Shared by the ops,
// their plans and the CUDA launchers.
#pragma once

#include <cstdint>

#include "zenflow/zenflow.h"

namespace zf {

struct MatrixView {
  int64_t rows;
  int64_t cols;
};

inline MatrixView matrix_view(const zf_tensor& t) {
  if (t.ndim == 0) return {1, 1};
  if (t.ndim == 1) return {1, t.shape[0]};
  // Saturates at INT64_MAX: an empty tensor's sizes are not bounded by validation ([0, 2^62,
  // 2] is empty), and callers reject that many columns (more than int32 indices address).
  int64_t cols = 1;
  for (int d = 1; d < t.ndim; ++d) {
    if (__builtin_mul_overflow(cols, t.shape[d], &cols)) cols = INT64_MAX;
  }
  return {t.shape[0], cols};
}

}  // namespace zf
