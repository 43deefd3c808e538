// Header-only C++ layer over the zenflow C ABI: exceptions instead of status codes,
// descriptor builders, and RAII guards for the process-wide settings. Everything here
// is inline and calls only the exported C functions, so it adds no ABI of its own.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "zenflow/zenflow.h"

namespace zenflow {

class Error : public std::runtime_error {
 public:
  Error(zf_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  zf_status status() const noexcept { return status_; }

 private:
  zf_status status_;
};

// Throws zenflow::Error with zf_last_error()'s text when status is not ZF_SUCCESS.
inline void check(zf_status status) {
  if (status != ZF_SUCCESS) throw Error(status, zf_last_error());
}

constexpr zf_device cpu_device() { return zf_device{ZF_DEVICE_CPU, 0}; }
constexpr zf_device cuda_device(int index) { return zf_device{ZF_DEVICE_CUDA, index}; }

// A contiguous (row-major) descriptor over memory the caller owns.
inline zf_tensor contiguous_tensor(void* data, zf_dtype dtype, const std::vector<int64_t>& shape,
                                   zf_device device = cpu_device()) {
  if (shape.size() > ZF_MAX_DIMS) throw Error(ZF_ERROR_INVALID_VALUE, "shape: too many dimensions");
  zf_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[static_cast<size_t>(d)];
    t.strides[d] = stride;
    stride *= shape[static_cast<size_t>(d)];
  }
  return t;
}

// ---- ops (see zenflow/norms.h and zenflow/topk.h for the contracts) ----

inline size_t column_stats_workspace_bytes(const std::vector<zf_tensor>& grads, const std::vector<zf_tensor>& col_sq,
                                           const zf_tensor& total_sq, const zf_tensor& nonfinite, uint32_t flags = 0) {
  size_t bytes = 0;
  check(zf_column_stats(grads.data(), col_sq.data(), grads.size(), &total_sq, &nonfinite, flags, nullptr, &bytes,
                        nullptr));
  return bytes;
}

inline void column_stats(const std::vector<zf_tensor>& grads, const std::vector<zf_tensor>& col_sq,
                         const zf_tensor& total_sq, const zf_tensor& nonfinite, uint32_t flags = 0,
                         void* workspace = nullptr, size_t workspace_bytes = 0, zf_stream stream = nullptr) {
  if (grads.size() != col_sq.size()) throw Error(ZF_ERROR_INVALID_VALUE, "col_sq: length differs from grads");
  check(zf_column_stats(grads.data(), col_sq.data(), grads.size(), &total_sq, &nonfinite, flags, workspace,
                        workspace ? &workspace_bytes : nullptr, stream));
}

inline size_t select_topk_workspace_bytes(const std::vector<zf_tensor>& scores,
                                          const std::vector<zf_tensor>& out_indices) {
  size_t bytes = 0;
  check(zf_select_topk_columns(scores.data(), out_indices.data(), scores.size(), nullptr, &bytes, nullptr));
  return bytes;
}

inline void select_topk_columns(const std::vector<zf_tensor>& scores, const std::vector<zf_tensor>& out_indices,
                                void* workspace = nullptr, size_t workspace_bytes = 0, zf_stream stream = nullptr) {
  if (scores.size() != out_indices.size())
    throw Error(ZF_ERROR_INVALID_VALUE, "out_indices: length differs from scores");
  check(zf_select_topk_columns(scores.data(), out_indices.data(), scores.size(), workspace,
                               workspace ? &workspace_bytes : nullptr, stream));
}

// ---- RAII guards for process-wide settings ----

// Forces a SIMD level for its lifetime (tests sweep the levels with it).
class ScopedSimdLevel {
 public:
  explicit ScopedSimdLevel(zf_simd_level level) : previous_(zf_simd_level_active()) { check(zf_set_simd_level(level)); }
  ~ScopedSimdLevel() { zf_set_simd_level(previous_); }
  ScopedSimdLevel(const ScopedSimdLevel&) = delete;
  ScopedSimdLevel& operator=(const ScopedSimdLevel&) = delete;

 private:
  zf_simd_level previous_;
};

// Resizes the host pool for its lifetime.
class ScopedNumThreads {
 public:
  explicit ScopedNumThreads(int num_threads) : previous_(zf_get_num_threads()) {
    check(zf_set_num_threads(num_threads, nullptr, 0));
  }
  ~ScopedNumThreads() { zf_set_num_threads(previous_, nullptr, 0); }
  ScopedNumThreads(const ScopedNumThreads&) = delete;
  ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

 private:
  int previous_;
};

inline std::vector<zf_simd_level> supported_simd_levels() {
  std::vector<zf_simd_level> levels;
  for (int level = ZF_SIMD_SCALAR; level <= zf_simd_level_supported(); ++level) {
    levels.push_back(static_cast<zf_simd_level>(level));
  }
  return levels;
}

}  // namespace zenflow
