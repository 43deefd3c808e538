// The one definition of the per-element Adam/AdamW update, shared by the host SIMD
// kernels (their vector body computes exactly this, operation for operation), the host
// twins of the device ops and the CUDA kernels (ZF_HOST_DEVICE). It follows the arithmetic
// of torch.optim.AdamW / Adam on the CPU (the single-tensor and fused paths agree):
//
//   g <- grad * grad_scale                   (the caller scales: 1/S, clip coefficient)
//   Adam (L2): g <- fma(p, wd, g)            (torch: grad.add(param, alpha=wd))
//   AdamW:     p <- p * (1 - lr * wd)        (torch: param.mul_(1 - lr * wd))
//   m <- fma(c, g - m, base)                 (torch's lerp_(g, 1 - beta1): c = w, base = m
//                                             when |w| < 0.5, else c = w - 1, base = g)
//   v <- fma((1 - beta2) * g, g, v * beta2)  (torch: mul_(beta2).addcmul_(g, g, 1 - beta2);
//                                             its CPU kernel fuses the last multiply-add)
//   p <- p + (-step_size * m) / (sqrt(v) / sqrt(bc2) + eps)
//                                            (torch: addcdiv_(m, denom, value=-step_size))
//   step_size = lr / bc1, bc_i = 1 - beta_i^step
//
// Step-dependent scalars are computed once per (step, hyper-parameters) in double, from
// double hyper-parameters, and rounded to float, as torch does with Python floats; the
// element update is pure fp32 with FMA exactly where written above, so every SIMD level
// and the scalar path agree bit for bit (the host builds with -ffp-contract=off).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/float_convert.hpp"

namespace zf {

struct AdamHyperParams {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  bool decoupled;  // true: AdamW (decoupled weight decay); false: Adam with L2 penalty
};

// Everything the element update needs for one bias-correction step.
struct AdamStepScalars {
  float neg_step_size;  // -(lr / (1 - beta1^step))
  float bc2_sqrt;       // (1 - beta2^step)^0.5
  float decay_factor;   // 1 - lr * wd for AdamW, 1 for Adam
  float l2;             // wd for Adam (L2), 0 for AdamW
  bool apply_l2;        // Adam with wd != 0
  float lerp_coeff;     // see the header comment
  bool lerp_from_grad;  // |1 - beta1| >= 0.5: torch's lerp then starts from the gradient
  float beta2;
  float one_minus_beta2;
  float eps;
};

ZF_HOST_DEVICE static inline float adam_fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

ZF_HOST_DEVICE static inline AdamStepScalars adam_step_scalars(const AdamHyperParams& h, int64_t step) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
  AdamStepScalars s;
  s.neg_step_size = static_cast<float>(-(h.lr / bc1));
  s.bc2_sqrt = static_cast<float>(std::pow(bc2, 0.5));  // torch: bias_correction2 ** 0.5
  s.decay_factor = h.decoupled ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  s.l2 = h.decoupled ? 0.0f : static_cast<float>(h.weight_decay);
  s.apply_l2 = !h.decoupled && h.weight_decay != 0.0;
  const float lerp_weight = static_cast<float>(1.0 - h.beta1);
  s.lerp_from_grad = !(std::fabs(lerp_weight) < 0.5f);
  s.lerp_coeff = s.lerp_from_grad ? lerp_weight - 1.0f : lerp_weight;
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.eps = static_cast<float>(h.eps);
  return s;
}

// One element: param, exp_avg (m) and exp_avg_sq (v) in fp32, gradient already scaled.
ZF_HOST_DEVICE static inline void adam_update_element(float& param, float& exp_avg, float& exp_avg_sq, float grad,
                                                      const AdamStepScalars& s) {
  if (s.apply_l2) grad = adam_fma(param, s.l2, grad);
  param = param * s.decay_factor;
  exp_avg = adam_fma(s.lerp_coeff, grad - exp_avg, s.lerp_from_grad ? grad : exp_avg);
  exp_avg_sq = adam_fma(s.one_minus_beta2 * grad, grad, exp_avg_sq * s.beta2);
  const float denom = std::sqrt(exp_avg_sq) / s.bc2_sqrt + s.eps;
  param = param + (s.neg_step_size * exp_avg) / denom;
}

// The deferral accumulator: acc + scale * value with one rounding (torch: acc.add_(g, alpha=scale)).
ZF_HOST_DEVICE static inline float accumulate_element(float acc, float value, float scale) {
  return adam_fma(value, scale, acc);
}

}  // namespace zf
