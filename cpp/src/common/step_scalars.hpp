// The scalars of one engine step, kept in device memory so that the device ops read them
// without a round trip to the host (docs/design.md section 7): the statistics pass writes
// total_sq and nonfinite, compute_step_scalars turns them into the gradient scale and the
// skip flag, the selected AdamW and every staging slot's header read those. The formula is
// one function for the host and the device, so both backends agree bit for bit.
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
