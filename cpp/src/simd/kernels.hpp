// Host kernels behind runtime SIMD dispatch. Each ISA level fills one KernelTable in its
// own translation unit (kernels_<level>.cpp, compiled with that level's flags only);
// active_kernels() returns the table chosen at start-up. Entry points take raw pointers,
// never vector types, so callers need no ISA flags.
#pragma once

#include <cstdint>

#include "zenflow/zenflow.h"

namespace zf {
namespace simd {

struct KernelTable {
  zf_simd_level level;

  // acc[j] += sum over r < rows of x[r * row_stride + j]^2 for j < cols: fp32 sums over
  // blocks of 8 rows added into fp64 acc (see kernels_impl.hpp). Each column is summed in
  // row order with the same roundings at every level, so all levels agree bit for bit.
  void (*column_sq_accumulate_f32)(const float* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc);
  void (*column_sq_accumulate_bf16)(const uint16_t* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc);
  void (*column_sq_accumulate_f16)(const uint16_t* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc);
};

const KernelTable* kernel_table_scalar();
#if defined(ZENFLOW_HAVE_X86_SIMD)
const KernelTable* kernel_table_avx2();
const KernelTable* kernel_table_avx512();
#endif

// Table of the active level (see zf_simd_level_active()).
const KernelTable& active_kernels();
// Table of a given level; nullptr when the level is not compiled in.
const KernelTable* kernel_table(zf_simd_level level);

}  // namespace simd
}  // namespace zf
