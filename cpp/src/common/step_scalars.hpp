// The scalars of one engine step, kept in device memory so that the device ops read them
// without a round trip to the host (docs/design.md section 7). The statistics passes write
// every parameter's column sums of squares and a non-finite flag per pass; the step-scalars
// pass sums the column sums into total_sq in a fixed order (so the total does not depend on
// how the step's gradients were grouped into passes: a split step submitted in parts gives
// the bits of a whole one), ORs the flags, and forms the gradient scale and the skip flag,
// which the selected AdamW and every staging slot's header read. The formulas are one set
// of functions for the host and the device, so both backends agree bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/float_convert.hpp"  // ZF_HOST_DEVICE

namespace zf {

struct StepScalars {
  float total_sq;      // sum of squares of every raw gradient of the step
  int32_t nonfinite;   // 1: some gradient element is Inf or NaN
  float grad_scale;    // clip coefficient / loss scale: multiplies every gradient
  int32_t skip;        // 1: the step changes nothing (overflow)
  int32_t zero_index;  // always 0: the one selected column of a dense parameter seen as [numel, 1]
  int32_t padding[3];
};
static_assert(sizeof(StepScalars) == 32, "StepScalars is copied as 32 bytes");

// The header of a staging slot: the gradient scale and the skip flag, copied from the
// StepScalars in one 8-byte copy.
struct SlotHeader {
  float grad_scale;
  int32_t skip;
};

// The total's order: column sums in chunks of kTotalChunk, each chunk summed in fp64 in
// column order, the chunk sums added in chunk order, one rounding to fp32 at the end.
constexpr int64_t kTotalChunk = 1024;

ZF_HOST_DEVICE inline double column_chunk_sum(const float* col_sq, int64_t columns, int64_t chunk) {
  const int64_t begin = chunk * kTotalChunk;
  const int64_t end = begin + kTotalChunk < columns ? begin + kTotalChunk : columns;
  double sum = 0.0;
  for (int64_t j = begin; j < end; ++j) sum += static_cast<double>(col_sq[j]);
  return sum;
}

inline int64_t column_chunks(int64_t columns) { return (columns + kTotalChunk - 1) / kTotalChunk; }

// An engine over parameters on several devices (engine_group.hpp) runs one engine per
// device: each forms the partial of its own parameters (the fp64 sum of its chunk sums, the
// OR of its flags), the partials are exchanged, and every device combines all of them in
// device order, so every device holds the same scalars, bit for bit.
struct ScalarPartial {
  double total_sq;
  int32_t nonfinite;
  int32_t padding;
};
static_assert(sizeof(ScalarPartial) == 16, "ScalarPartial is copied as 16 bytes");

ZF_HOST_DEVICE inline void combine_scalar_partials(StepScalars* s, const ScalarPartial* partials, int64_t count) {
  double total = 0.0;
  int32_t nonfinite = 0;
  for (int64_t i = 0; i < count; ++i) {
    total += partials[i].total_sq;
    nonfinite |= partials[i].nonfinite != 0 ? 1 : 0;
  }
  s->total_sq = static_cast<float>(total);
  s->nonfinite = nonfinite;
}

// grad_scale = min(1, max_grad_norm / (norm + 1e-6)) / loss_scale (no clipping when
// max_grad_norm <= 0), norm = sqrt(total_sq) / loss_scale, in double (IEEE sqrt and
// division on both sides), rounded once to float.
ZF_HOST_DEVICE inline void compute_step_scalars(StepScalars* s, double loss_scale, double max_grad_norm) {
  const double norm = sqrt(static_cast<double>(s->total_sq)) / loss_scale;
  double clip = 1.0;
  if (max_grad_norm > 0.0) {
    const double ratio = max_grad_norm / (norm + 1e-6);
    clip = ratio < 1.0 ? ratio : 1.0;
  }
  s->grad_scale = static_cast<float>(clip / loss_scale);
  s->skip = s->nonfinite != 0 ? 1 : 0;
  s->zero_index = 0;
}

}  // namespace zf
