// The one definition of the per-element Adam/AdamW update, shared by the host SIMD
// kernels' tail loops, the host twins of the device ops and the CUDA kernels
// (ZF_HOST_DEVICE). It follows torch.optim.AdamW / Adam (single-tensor path):
//
//   AdamW: p <- p * (1 - lr * wd)          Adam (L2): g <- g + wd * p
//   m <- m + (1 - beta1) * (g - m)         (torch's lerp)
//   v <- beta2 * v + (1 - beta2) * g * g
//   p <- p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_i = 1 - beta_i^step
//
// Step-dependent scalars are computed once per (step, hyper-parameters) in double and
// rounded to float, as torch does on the host.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/float_convert.hpp"

namespace zf {

struct AdamHyperParams {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  bool decoupled;  // true: AdamW (decoupled weight decay); false: Adam with L2 penalty
};

// Everything the element update needs for one bias-correction step.
struct AdamStepScalars {
  float step_size;     // lr / (1 - beta1^step)
  float inv_bc2_sqrt;  // 1 / sqrt(1 - beta2^step)
  float decay_factor;  // 1 - lr * wd for AdamW, 1 for Adam
  float l2;            // wd for Adam (L2), 0 for AdamW
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
};

ZF_HOST_DEVICE static inline AdamStepScalars adam_step_scalars(const AdamHyperParams& h, int64_t step) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(step));
  AdamStepScalars s;
  s.step_size = static_cast<float>(static_cast<double>(h.lr) / bc1);
  s.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  s.decay_factor = h.decoupled ? static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay) : 1.0f;
  s.l2 = h.decoupled ? 0.0f : h.weight_decay;
  s.one_minus_beta1 = 1.0f - h.beta1;
  s.beta2 = h.beta2;
  s.one_minus_beta2 = 1.0f - h.beta2;
  s.eps = h.eps;
  return s;
}

// One element: param, exp_avg (m) and exp_avg_sq (v) in fp32, gradient already scaled.
ZF_HOST_DEVICE static inline void adam_update_element(float& param, float& exp_avg, float& exp_avg_sq, float grad,
                                                      const AdamStepScalars& s) {
  grad = grad + s.l2 * param;
  param = param * s.decay_factor;
  exp_avg = exp_avg + s.one_minus_beta1 * (grad - exp_avg);
  exp_avg_sq = s.beta2 * exp_avg_sq + s.one_minus_beta2 * grad * grad;
  const float denom = std::sqrt(exp_avg_sq) * s.inv_bc2_sqrt + s.eps;
  param = param - s.step_size * (exp_avg / denom);
}

}  // namespace zf
