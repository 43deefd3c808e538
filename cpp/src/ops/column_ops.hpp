// Shared validation and views of the column ops (adamw_selected_columns, pack, scatter,
// exchange): the matrix view of a parameter, selected-index lists and column states.
#pragma once

#include <cstdint>
#include <string>

#include "common/tensor.hpp"
#include "zenflow/optim.h"

namespace zf {

// A parameter seen as [rows, cols]: 0-D as [1, 1], 1-D [n] as [1, n], more dimensions as
// [shape[0], product of the rest] (DESIGN.md section 2).
struct MatrixView {
  int64_t rows;
  int64_t cols;
};

inline MatrixView matrix_view(const zf_tensor& t) {
  if (t.ndim == 0) return {1, 1};
  if (t.ndim == 1) return {1, t.shape[0]};
  int64_t cols = 1;
  for (int d = 1; d < t.ndim; ++d) cols *= t.shape[d];
  return {t.shape[0], cols};
}

// Descriptor, dtype f32/f16/bf16, contiguous, on `device`, fewer than 2^31 columns.
MatrixView check_float_matrix(const zf_tensor* t, const std::string& name, const zf_device& device,
                              const std::string& device_source);

// i32 1-D contiguous list of k <= n indices on `device`; returns k. On the host (CPU
// tensors) also checks that the indices are ascending, distinct and in [0, n).
int64_t check_selected(const zf_tensor* t, const std::string& name, int64_t n, const zf_device& device,
                       const std::string& device_source);

// A contiguous f32 (or i32 for steps) tensor of exactly `elements` elements on `device`.
void check_state_tensor(const zf_tensor& t, const std::string& name, zf_dtype dtype, int64_t elements,
                        const zf_device& device, const std::string& device_source);

// True when the master tensor is present (non-empty); then it must be f32 of `elements`.
bool check_master(const zf_tensor& t, const std::string& name, int64_t elements, const zf_device& device,
                  const std::string& device_source);

}  // namespace zf
