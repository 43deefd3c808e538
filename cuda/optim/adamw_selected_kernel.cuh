// In-place AdamW on the selected columns of many matrices: two launches per batch of
// matrices, the update and then the step counts.
//
// Update: a block owns 32 consecutive compact columns of one matrix (a column tile) and one
// chunk of kAdamwRowsPerBlock rows; the grid covers column tiles x row chunks, so a tall
// matrix (a 128256-row lm_head) spreads over many blocks instead of one block per tile.
// Lane l of every warp handles compact column c = 32 * tile + l, warp w handles rows
// w, w + 8, ... of the chunk. Lanes of a warp then read 32 consecutive floats of each compact
// state array (one 128-byte line) and 32 selected elements of one row of W and G (the sectors
// holding them; docs/design.md section 5). Each thread keeps 4 rows of loads in flight, all
// loads issued before any conversion or arithmetic (the loop is specialised per gradient and
// parameter dtype, so no dtype switch sits between a 16-bit load and its use).
//
// Step scalars: the first warp computes each column's bias corrections once per block
// (adam_step_scalars, no libm pow) into shared memory; the other warps read them there.
//
// Step counts: every update block of a column reads steps[c] (the pre-increment count), so
// none of them may write it; the second, small kernel bumps each count once, after the update
// in stream order (no atomics, no workspace; a captured graph holds both nodes). Both take
// the step from adam_next_step_count (adam_math.hpp), which saturates at INT32_MAX: counts
// live on the device, where the host cannot check them at each step (the engine bounds them
// on the host instead, docs/design.md section 8).
//
// The element math is adam_update_element (cpp/src/common/adam_math.hpp), the same function
// the host twin calls, with every operation rounded as written there: bitwise equal results.
#pragma once

#include <cstdint>

#include "common/adam_math.hpp"
#include "common/column_index.hpp"

namespace zf {
namespace cuda {

constexpr int kAdamwColumnsPerBlock = 32;
constexpr int kAdamwRowWarps = 8;
constexpr int kAdamwThreads = kAdamwColumnsPerBlock * kAdamwRowWarps;
constexpr int kAdamwRowsInFlight = 4;
// 16 passes of 8 warps x 4 rows: long enough to hide the per-block step scalars, short
// enough that a 4096-row matrix with one column tile still fills 8 blocks.
constexpr int64_t kAdamwRowsPerBlock = 512;
// Three resident blocks per SM cap the update kernel at 80 registers with no spills (left to
// itself ptxas keeps every in-flight row's addresses live and takes 120: two blocks, 25%
// occupancy). 24 warps x 4 rows in flight are enough bytes in flight for HBM3e.
constexpr int kAdamwMinBlocksPerSm = 3;
constexpr int kAdamwStepThreads = 256;
constexpr int kAdamwMaxMatricesPerLaunch = 160;  // by-value table of about 19 KiB (limit: 32 KiB)

struct AdamwMatrix {
  void* param;
  const void* grad;
  const int32_t* selected;  // nullptr: every column (dense)
  float* master;            // nullptr: none, W itself is the fp32 source
  float* exp_avg;
  float* exp_avg_sq;
  int32_t* steps;
  int64_t rows;
  int64_t first_block;       // first update block of this matrix within the launch
  int64_t first_step_block;  // first block of this matrix in the step-count launch
  int32_t cols;
  int32_t k;
  int32_t column_tiles;  // ceil(k / kAdamwColumnsPerBlock)
  int32_t param_dtype;
  int32_t grad_dtype;
  int32_t grad_compact;  // 1: grad holds the selected columns only, [k, rows] (pack.h's layout)
  int32_t lr_index;      // this matrix's entry of the call's lr_device array
  double lr;
  double weight_decay;
};

struct AdamwLaunchTable {
  AdamwMatrix matrices[kAdamwMaxMatricesPerLaunch];
  const float* grad_scale;  // nullptr: 1
  const int32_t* noop;      // nullptr: never skip
  const float* lr_device;   // nullptr: use each matrix's lr; else read lr_device[lr_index] now
  int32_t count;
  int32_t decoupled;  // 1: AdamW, 0: Adam with L2 penalty
  double beta1;
  double beta2;
  double eps;
};

// Row chunks of a matrix in the update grid.
__host__ __device__ inline int64_t adamw_row_chunks(int64_t rows) {
  return (rows + kAdamwRowsPerBlock - 1) / kAdamwRowsPerBlock;
}

// Compact column c of `mat` as a matrix column, or -1 when c is past k or the index is outside
// [0, cols) (a -1 fill from a NaN top-k): such columns are skipped by both kernels.
__device__ inline int64_t adamw_column(const AdamwMatrix& mat, int64_t c) {
  if (c >= mat.k) return -1;
  const int64_t column = selected_column(mat.selected, c);
  return column >= 0 && column < mat.cols ? column : -1;
}

// The matrix whose blocks (numbered from its `first` member) hold block `block`: the last
// entry starting at or before it (entries with no blocks share the next one's start).
template <int64_t AdamwMatrix::*First>
__device__ inline int adamw_find_matrix(const AdamwLaunchTable& table, int64_t block) {
  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.matrices[mid].*First <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Storage words of the three float dtypes: load the raw word, convert after.
struct AdamwF32Word {
  using Bits = float;
  __device__ static float to_float(Bits bits) { return bits; }
  __device__ static Bits from_float(float value) { return value; }
};
struct AdamwBf16Word {
  using Bits = uint16_t;
  __device__ static float to_float(Bits bits) { return bf16_to_f32(bits); }
  __device__ static Bits from_float(float value) { return f32_to_bf16(value); }
};
struct AdamwF16Word {
  using Bits = uint16_t;
  __device__ static float to_float(Bits bits) { return f16_to_f32(bits); }
  __device__ static Bits from_float(float value) { return f32_to_f16(value); }
};

// Rows [row_begin, row_end) of compact column c (matrix column `column`) for one thread.
template <class GradWord, class ParamWord>
__device__ inline void adamw_update_rows(const AdamwMatrix& mat, int64_t c, int64_t column, int64_t row_begin,
                                         int64_t row_end, const AdamStepScalars& scalars, float scale) {
  using GradBits = typename GradWord::Bits;
  using ParamBits = typename ParamWord::Bits;
  const GradBits* grad = static_cast<const GradBits*>(mat.grad);
  ParamBits* param = static_cast<ParamBits*>(mat.param);
  const bool has_master = mat.master != nullptr;
  constexpr int kRowStride = kAdamwRowWarps * kAdamwRowsInFlight;
  for (int64_t base = row_begin; base < row_end; base += kRowStride) {
    GradBits g_bits[kAdamwRowsInFlight];
    ParamBits p_bits[kAdamwRowsInFlight];
    float p[kAdamwRowsInFlight], m[kAdamwRowsInFlight], v[kAdamwRowsInFlight];
    // Every load first, raw: W/G may not be proven distinct from the state, so the compiler
    // would not move loads above the stores by itself, and converting a 16-bit word right
    // after its load would stall on it.
#pragma unroll
    for (int j = 0; j < kAdamwRowsInFlight; ++j) {
      const int64_t r = base + j * kAdamwRowWarps;
      if (r < row_end) {
        const int64_t element = row_major_index(mat.cols, r, column);
        const int64_t slot = row_major_index(mat.k, r, c);
        g_bits[j] = grad[mat.grad_compact ? c * mat.rows + r : element];
        if (has_master) {
          p[j] = mat.master[slot];
        } else {
          p_bits[j] = param[element];
        }
        m[j] = mat.exp_avg[slot];
        v[j] = mat.exp_avg_sq[slot];
      }
    }
#pragma unroll
    for (int j = 0; j < kAdamwRowsInFlight; ++j) {
      const int64_t r = base + j * kAdamwRowWarps;
      if (r < row_end) {
        const int64_t element = row_major_index(mat.cols, r, column);
        const int64_t slot = row_major_index(mat.k, r, c);
        if (!has_master) p[j] = ParamWord::to_float(p_bits[j]);
        adam_update_element(p[j], m[j], v[j], adam_mul(GradWord::to_float(g_bits[j]), scale), scalars);
        mat.exp_avg[slot] = m[j];
        mat.exp_avg_sq[slot] = v[j];
        if (has_master) mat.master[slot] = p[j];
        param[element] = ParamWord::from_float(p[j]);
      }
    }
  }
}

template <class GradWord>
__device__ inline void adamw_update_rows_for_param(const AdamwMatrix& mat, int64_t c, int64_t column, int64_t row_begin,
                                                   int64_t row_end, const AdamStepScalars& scalars, float scale) {
  switch (mat.param_dtype) {
    case ZF_DTYPE_F32:
      adamw_update_rows<GradWord, AdamwF32Word>(mat, c, column, row_begin, row_end, scalars, scale);
      break;
    case ZF_DTYPE_BF16:
      adamw_update_rows<GradWord, AdamwBf16Word>(mat, c, column, row_begin, row_end, scalars, scale);
      break;
    default:
      adamw_update_rows<GradWord, AdamwF16Word>(mat, c, column, row_begin, row_end, scalars, scale);
      break;
  }
}

__global__ void __launch_bounds__(kAdamwThreads, kAdamwMinBlocksPerSm)
    adamw_selected_kernel(const AdamwLaunchTable table) {
  if (table.noop != nullptr && *table.noop != 0) return;  // uniform: the whole grid skips

  const int64_t block = blockIdx.x;
  const AdamwMatrix mat = table.matrices[adamw_find_matrix<&AdamwMatrix::first_block>(table, block)];
  const int64_t local = block - mat.first_block;
  const int64_t tile = local % mat.column_tiles, chunk = local / mat.column_tiles;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = tile * kAdamwColumnsPerBlock + lane;

  // The first warp turns each column's pre-increment count into its step scalars, once per
  // block: the double-double powers then cost one warp, not 8 (and not their registers).
  __shared__ AdamStepScalars column_scalars[kAdamwColumnsPerBlock];
  __shared__ int64_t columns[kAdamwColumnsPerBlock];
  if (warp == 0) {
    const int64_t column = adamw_column(mat, c);
    columns[lane] = column;
    if (column >= 0) {
      const double lr = table.lr_device != nullptr ? static_cast<double>(table.lr_device[mat.lr_index]) : mat.lr;
      const AdamHyperParams hyper{lr, table.beta1, table.beta2, table.eps, mat.weight_decay, table.decoupled != 0};
      column_scalars[lane] = adam_step_scalars(hyper, adam_next_step_count(mat.steps[c]));
    }
  }
  __syncthreads();
  const int64_t column = columns[lane];
  if (column < 0) return;  // no barrier follows
  const AdamStepScalars scalars = column_scalars[lane];
  const float scale = table.grad_scale != nullptr ? *table.grad_scale : 1.0f;
  const int64_t chunk_begin = chunk * kAdamwRowsPerBlock;
  const int64_t row_end = mat.rows < chunk_begin + kAdamwRowsPerBlock ? mat.rows : chunk_begin + kAdamwRowsPerBlock;
  const int64_t row_begin = chunk_begin + warp;
  switch (mat.grad_dtype) {
    case ZF_DTYPE_F32:
      adamw_update_rows_for_param<AdamwF32Word>(mat, c, column, row_begin, row_end, scalars, scale);
      break;
    case ZF_DTYPE_BF16:
      adamw_update_rows_for_param<AdamwBf16Word>(mat, c, column, row_begin, row_end, scalars, scale);
      break;
    default:
      adamw_update_rows_for_param<AdamwF16Word>(mat, c, column, row_begin, row_end, scalars, scale);
      break;
  }
}

// One thread per compact column: steps[c] <- the step the update used. Launched after the
// update kernel on the same stream, so every update block has read the old count.
__global__ void __launch_bounds__(kAdamwStepThreads) adamw_count_steps_kernel(const AdamwLaunchTable table) {
  if (table.noop != nullptr && *table.noop != 0) return;
  const int64_t block = blockIdx.x;
  const AdamwMatrix mat = table.matrices[adamw_find_matrix<&AdamwMatrix::first_step_block>(table, block)];
  const int64_t c = (block - mat.first_step_block) * kAdamwStepThreads + threadIdx.x;
  if (adamw_column(mat, c) < 0) return;
  mat.steps[c] = adam_next_step_count(mat.steps[c]);
}

}  // namespace cuda
}  // namespace zf
