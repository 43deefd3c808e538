// In-place AdamW on the selected columns of many matrices in one launch.
//
// A block owns 32 consecutive compact columns of one matrix and all of its rows: lane l of
// every warp handles compact column c = 32 * tile + l, warp w handles rows w, w + 8, ...
// Lanes of a warp then read 32 consecutive floats of each compact state array (one 128-byte
// line) and 32 selected elements of one row of W and G (the sectors holding them; docs/design.md
// section 5). Each thread keeps 4 rows of loads in flight. Owning whole columns lets the
// block bump the column's step count itself after every warp has read it: no second
// launch, no atomics. The element math is adam_update_element (cpp/src/common/adam_math.hpp),
// the same function the host twin calls.
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
constexpr int kAdamwMaxMatricesPerLaunch = 160;  // by-value table of 16 KiB (limit: 32 KiB)

struct AdamwMatrix {
  void* param;
  const void* grad;
  const int32_t* selected;  // nullptr: every column (dense)
  float* master;            // nullptr: none, W itself is the fp32 source
  float* exp_avg;
  float* exp_avg_sq;
  int32_t* steps;
  int64_t rows;
  int64_t first_block;  // first block of this matrix within the launch
  int32_t cols;
  int32_t k;
  int32_t param_dtype;
  int32_t grad_dtype;
  int32_t lr_index;  // this matrix's entry of the call's lr_device array
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

__global__ void __launch_bounds__(kAdamwThreads) adamw_selected_kernel(const AdamwLaunchTable table) {
  if (table.noop != nullptr && *table.noop != 0) return;  // uniform: the whole grid skips

  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.matrices[mid].first_block <= static_cast<int64_t>(blockIdx.x)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const AdamwMatrix mat = table.matrices[lo];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) - mat.first_block) * kAdamwColumnsPerBlock + lane;
  bool active = c < mat.k;
  const int64_t column = active ? selected_column(mat.selected, c) : 0;
  active = active && column >= 0 && column < mat.cols;  // a -1 fill from a NaN top-k is skipped

  // The host rejects counts it cannot increment; here nothing is read back, so a negative
  // count counts as 0 and a count at INT32_MAX stays there (optim.h documents both).
  const int32_t count_before = active ? mat.steps[c] : 0;
  const int32_t step = count_before < 0 ? 1 : (count_before == INT32_MAX ? INT32_MAX : count_before + 1);
  const double lr = table.lr_device != nullptr ? static_cast<double>(table.lr_device[mat.lr_index]) : mat.lr;
  const AdamHyperParams hyper{lr, table.beta1, table.beta2, table.eps, mat.weight_decay, table.decoupled != 0};
  const AdamStepScalars scalars = adam_step_scalars(hyper, step);
  const float scale = table.grad_scale != nullptr ? *table.grad_scale : 1.0f;

  if (active) {
    constexpr int kRowStride = kAdamwRowWarps * kAdamwRowsInFlight;
    for (int64_t base = warp; base < mat.rows; base += kRowStride) {
      float g[kAdamwRowsInFlight], p[kAdamwRowsInFlight], m[kAdamwRowsInFlight], v[kAdamwRowsInFlight];
      // All loads first: W/G may not be proven distinct from the state, so the compiler would
      // not move loads above stores by itself.
#pragma unroll
      for (int j = 0; j < kAdamwRowsInFlight; ++j) {
        const int64_t r = base + j * kAdamwRowWarps;
        if (r < mat.rows) {
          const int64_t element = row_major_index(mat.cols, r, column);
          const int64_t slot = row_major_index(mat.k, r, c);
          g[j] = load_as_float(mat.grad, mat.grad_dtype, element) * scale;
          p[j] = mat.master ? mat.master[slot] : load_as_float(mat.param, mat.param_dtype, element);
          m[j] = mat.exp_avg[slot];
          v[j] = mat.exp_avg_sq[slot];
        }
      }
#pragma unroll
      for (int j = 0; j < kAdamwRowsInFlight; ++j) {
        const int64_t r = base + j * kAdamwRowWarps;
        if (r < mat.rows) {
          const int64_t element = row_major_index(mat.cols, r, column);
          const int64_t slot = row_major_index(mat.k, r, c);
          adam_update_element(p[j], m[j], v[j], g[j], scalars);
          mat.exp_avg[slot] = m[j];
          mat.exp_avg_sq[slot] = v[j];
          if (mat.master) mat.master[slot] = p[j];
          store_from_float(mat.param, mat.param_dtype, element, p[j]);
        }
      }
    }
  }
  __syncthreads();  // every warp has read steps[c]
  if (warp == 0 && active) mat.steps[c] = step;
}

}  // namespace cuda
}  // namespace zf
