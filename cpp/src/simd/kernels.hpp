// Host kernels behind runtime SIMD dispatch. Each ISA level fills one KernelTable in its
// own translation unit (kernels_<level>.cpp, compiled with that level's flags only);
// active_kernels() returns the table chosen at start-up. Entry points take raw pointers,
// never vector types, so callers need no ISA flags.
#pragma once

#include <cstdint>
#include <string>

#include "common/adam_math.hpp"
#include "zenflow/zenflow.h"

namespace zf {
namespace simd {

// One Adam/AdamW step over `count` contiguous elements; every pointer is at the first one.
struct AdamStepArgs {
  float* param;  // fp32 master
  float* exp_avg;
  float* exp_avg_sq;
  void* grad;  // grad_dtype: f32, bf16 or f16; written only when zero_grad
  zf_dtype grad_dtype;
  void* out;  // nullptr, or receives the updated param in out_dtype (f32, bf16 or f16)
  zf_dtype out_dtype;
  bool zero_grad;
  bool stream_out;   // a bf16/f16 `out` is written with non-temporal stores (large calls)
  float grad_scale;  // applied to the gradient before anything else
  // The window's last accumulate fused into its update (the engine's window close): the
  // gradient is first fma(grad, accumulate_scale, accumulator[i]) -- +0.0f for a null
  // accumulator -- as the accumulate kernel would have stored it, and that fp32 value is
  // then scaled by grad_scale; the accumulator is read, never written. grad may be `out`
  // itself (each element is read before it is written). Never with zero_grad.
  bool fuse_accumulate;
  const float* accumulator;  // fp32, indexed as param
  float accumulate_scale;
  AdamStepScalars scalars;
};

// One block of a pack or scatter (zf_pack_columns / zf_scatter_columns): `width` columns of a
// row-major matrix [rows, row_stride] against `width` contiguous packed columns of `rows`
// values each (packed element (r, j) at packed[j * rows + r]). columns[j] is the matrix column
// of packed column j, ascending.
struct PackBlockArgs {
  void* matrix;
  zf_dtype matrix_dtype;
  int64_t rows;
  int64_t row_stride;
  const int64_t* columns;
  int64_t width;
  void* packed;
  zf_dtype packed_dtype;
  float scale;  // pack only: multiplies every value before the rounding to packed_dtype
};

// One pass of the streaming roof (zf_host_stream_bandwidth, cpp/src/common/stream_roof.cpp):
// `streams` arrays of `count` elements each, 2 or 4 bytes an element. Each vector of elements
// reads every read stream and sums them (as fp32; 2-byte streams as bf16), and writes the sum
// times `scale` to every written stream: a read and written stream is updated in place. The
// traffic of a kernel of that shape with almost no arithmetic.
constexpr int kMaxStreamPassStreams = 16;
struct StreamPassArgs {
  int streams;
  void* data[kMaxStreamPassStreams];
  int bytes[kMaxStreamPassStreams];  // 2 or 4
  bool read[kMaxStreamPassStreams];
  bool write[kMaxStreamPassStreams];
  bool stream;    // write-only streams take non-temporal stores (data aligned to 64 bytes)
  bool prefetch;  // the read streams are prefetched in software ahead
  bool blocked;   // block by block (each read stream's block summed in L1, then each written
                  // stream's block stored), not vector by vector across all streams
  float scale;
};

struct KernelTable {
  zf_simd_level level;

  // acc[j] += sum over r < rows of x[r * row_stride + j]^2 for j < cols: fp32 sums over
  // blocks of 8 rows added into fp64 acc (see kernels_impl.hpp). Each column is summed in
  // row order with the same roundings at every level, so all levels agree bit for bit.
  void (*column_sq_accumulate_f32)(const float* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc);
  void (*column_sq_accumulate_bf16)(const uint16_t* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc);
  void (*column_sq_accumulate_f16)(const uint16_t* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc);

  // adam_update_element (common/adam_math.hpp) on every element, computed identically at
  // every level; see kernels_adam_impl.hpp.
  void (*adam_step)(const AdamStepArgs& args, int64_t count);
  // acc[i] = accumulate_element(acc[i], x[i], scale) for i < count; x is f32, bf16 or f16.
  // overwrite: acc[i] = accumulate_element(0.0f, x[i], scale), acc not read (a window's
  // first accumulate: the bits of adding into a zeroed accumulator, without reading it).
  // stream (with overwrite only): acc is written with non-temporal stores after a head that
  // aligns it; the same values (large calls: the accumulator is read next a step later, out
  // of cache, so fetching its lines before writing them would be wasted traffic).
  void (*accumulate)(float* acc, const void* x, zf_dtype x_dtype, int64_t count, float scale, bool overwrite,
                     bool stream);

  // Transposing copies of one block (see kernels_pack_impl.hpp); every element is computed as
  // column_index.hpp defines it, so all levels agree bit for bit:
  //   pack:    packed[j * rows + r] = store_packed(load_matrix(M[r, columns[j]]) * scale)
  //   scatter: M[r, columns[j]] = store_matrix(load_packed(packed[j * rows + r]))
  void (*pack_block)(const PackBlockArgs& args);
  void (*scatter_block)(const PackBlockArgs& args);

  // The streaming roof's pass (StreamPassArgs) over `count` elements.
  void (*stream_pass)(const StreamPassArgs& args, int64_t count);
};

const KernelTable* kernel_table_scalar();
#if defined(ZENFLOW_HAVE_X86_SIMD)
const KernelTable* kernel_table_avx2();
const KernelTable* kernel_table_avx512();
#endif

// The level the environment variable ZENFLOW_SIMD asks for, given the supported one.
// `warning` is empty when the request is honoured as written (or absent); otherwise it says
// why not and which level is used instead (the supported one).
struct EnvironmentLevel {
  zf_simd_level level;
  std::string warning;
};
EnvironmentLevel level_from_environment_value(const char* requested, zf_simd_level supported);

// Table of the active level (see zf_simd_level_active()).
const KernelTable& active_kernels();
// Table of a given level; nullptr when the level is not compiled in.
const KernelTable* kernel_table(zf_simd_level level);

}  // namespace simd
}  // namespace zf
