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
// double hyper-parameters, and rounded to float, as torch does with Python floats; beta^step
// comes from adam_beta_power (no libm pow), so host and device get the same bits. The element
// update is pure fp32 with FMA exactly where written above and every other operation one IEEE
// rounding (the _rn intrinsics on the device), so every SIMD level, the scalar path and the
// CUDA kernel agree bit for bit (the host builds with -ffp-contract=off).
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
  // The training steps this update stands for, >= 1: the engine's window update under
  // window_scaling passes the window's steps. The moments then decay as over `span` steps
  // (beta^span), and the caller advances the step count by span
  // (adam_next_step_count(count, span)), so that the bias corrections, 1 - beta^step, count
  // steps wherever a column is updated. 1: one step, the plain Adam update.
  int64_t span = 1;
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

// One IEEE operation, rounded to nearest even, never fused with a neighbour. On the device the
// _rn intrinsics say so whatever the flags (-fmad, -use_fast_math); on the host the plain
// operators do, because every translation unit that includes this header builds with
// -ffp-contract=off (CMakeLists.txt). Host and device therefore round alike by construction.
#if defined(__CUDA_ARCH__)
#define ZF_ADAM_OP(name, type, expr_device, expr_host) \
  ZF_HOST_DEVICE static inline type name(type a, type b) { return expr_device; }
#else
#define ZF_ADAM_OP(name, type, expr_device, expr_host) \
  ZF_HOST_DEVICE static inline type name(type a, type b) { return expr_host; }
#endif
ZF_ADAM_OP(adam_add, float, __fadd_rn(a, b), a + b)
ZF_ADAM_OP(adam_sub, float, __fsub_rn(a, b), a - b)
ZF_ADAM_OP(adam_mul, float, __fmul_rn(a, b), a* b)
ZF_ADAM_OP(adam_div, float, __fdiv_rn(a, b), a / b)
ZF_ADAM_OP(adam_add_f64, double, __dadd_rn(a, b), a + b)
ZF_ADAM_OP(adam_sub_f64, double, __dsub_rn(a, b), a - b)
ZF_ADAM_OP(adam_mul_f64, double, __dmul_rn(a, b), a* b)
ZF_ADAM_OP(adam_div_f64, double, __ddiv_rn(a, b), a / b)
#undef ZF_ADAM_OP

ZF_HOST_DEVICE static inline float adam_sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

ZF_HOST_DEVICE static inline double adam_sqrt_f64(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

ZF_HOST_DEVICE static inline double adam_fma_f64(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// A double-double number hi + lo with |lo| <= ulp(hi) / 2: about 106 significant bits.
struct AdamDoubleDouble {
  double hi;
  double lo;
};

// a * b in double-double: the FMA gives the rounding error of hi * hi exactly, the cross
// terms come next; a.lo * b.lo (below 2^-106 relative) is dropped.
ZF_HOST_DEVICE static inline AdamDoubleDouble adam_dd_mul(AdamDoubleDouble a, AdamDoubleDouble b) {
  const double product = adam_mul_f64(a.hi, b.hi);
  double error = adam_fma_f64(a.hi, b.hi, -product);
  error = adam_fma_f64(a.hi, b.lo, error);
  error = adam_fma_f64(a.lo, b.hi, error);
  const double hi = adam_add_f64(product, error);  // |error| <= ulp(product): Fast2Sum applies
  return {hi, adam_sub_f64(error, adam_sub_f64(hi, product))};
}

// beta^step for step >= 0 (1 for step <= 0), rounded to double. Square-and-multiply in
// double-double: at most 62 products of relative error below 2^-104 each, then one rounding,
// so the result is beta^step correctly rounded unless the exact value lies within about
// 2^-98 (relative) of a rounding boundary. Built from IEEE operations only, it gives the same
// bits on the host and the device by construction; libm's pow does not (CUDA allows 2 ulp,
// glibc about 0.5), and it equals glibc's nearly correctly rounded pow, which torch's Python
// `beta ** step` uses, in all but such boundary cases.
ZF_HOST_DEVICE static inline double adam_beta_power(double beta, int64_t step) {
  AdamDoubleDouble result{1.0, 0.0}, power{beta, 0.0};
  for (uint64_t remaining = step > 0 ? static_cast<uint64_t>(step) : 0; remaining != 0; remaining >>= 1) {
    if (remaining & 1) result = adam_dd_mul(result, power);
    if (remaining > 1) power = adam_dd_mul(power, power);
  }
  return result.hi;
}

// The Adam step that follows a stored int32 count, and the count stored after it. The host
// checks refuse, before anything is written, any count a call cannot increment (a plain op's
// validation, and the engine's check at every step and load); this is the last line behind
// them, where the CUDA kernels read counts the host never sees: a negative count counts as 0
// and a count at INT32_MAX stays there, so no path ever computes INT32_MAX + 1 (signed
// overflow). Host twins and kernels share it, so they agree even there.
// `span` (>= 1) is the steps the update stands for (AdamHyperParams::span).
ZF_HOST_DEVICE static inline int32_t adam_next_step_count(int32_t count_before, int32_t span = 1) {
  if (count_before < 0) count_before = 0;
  return count_before > INT32_MAX - span ? INT32_MAX : count_before + span;
}

// Everything but the step is per (lr, weight decay): computed once per call or per block.
// Every double operation is written out, so that no compiler can fuse 1 - lr * wd.
ZF_HOST_DEVICE static inline AdamStepScalars adam_step_scalars(const AdamHyperParams& h, int64_t step) {
  const double bc1 = adam_sub_f64(1.0, adam_beta_power(h.beta1, step));
  const double bc2 = adam_sub_f64(1.0, adam_beta_power(h.beta2, step));
  // The moments' decay over the update's span (the betas themselves for one step).
  const double beta1 = h.span > 1 ? adam_beta_power(h.beta1, h.span) : h.beta1;
  const double beta2 = h.span > 1 ? adam_beta_power(h.beta2, h.span) : h.beta2;
  AdamStepScalars s;
  s.neg_step_size = static_cast<float>(-adam_div_f64(h.lr, bc1));
  // torch: bias_correction2 ** 0.5; sqrt is correctly rounded everywhere, pow(x, 0.5) is not.
  s.bc2_sqrt = static_cast<float>(adam_sqrt_f64(bc2));
  s.decay_factor = h.decoupled ? static_cast<float>(adam_sub_f64(1.0, adam_mul_f64(h.lr, h.weight_decay))) : 1.0f;
  s.l2 = h.decoupled ? 0.0f : static_cast<float>(h.weight_decay);
  s.apply_l2 = !h.decoupled && h.weight_decay != 0.0;
  const float lerp_weight = static_cast<float>(adam_sub_f64(1.0, beta1));
  s.lerp_from_grad = !(std::fabs(lerp_weight) < 0.5f);
  s.lerp_coeff = s.lerp_from_grad ? adam_sub(lerp_weight, 1.0f) : lerp_weight;
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(adam_sub_f64(1.0, beta2));
  s.eps = static_cast<float>(h.eps);
  return s;
}

// One element: param, exp_avg (m) and exp_avg_sq (v) in fp32, gradient already scaled.
ZF_HOST_DEVICE static inline void adam_update_element(float& param, float& exp_avg, float& exp_avg_sq, float grad,
                                                      const AdamStepScalars& s) {
  if (s.apply_l2) grad = adam_fma(param, s.l2, grad);
  param = adam_mul(param, s.decay_factor);
  exp_avg = adam_fma(s.lerp_coeff, adam_sub(grad, exp_avg), s.lerp_from_grad ? grad : exp_avg);
  exp_avg_sq = adam_fma(adam_mul(s.one_minus_beta2, grad), grad, adam_mul(exp_avg_sq, s.beta2));
  const float denom = adam_add(adam_div(adam_sqrt(exp_avg_sq), s.bc2_sqrt), s.eps);
  param = adam_add(param, adam_div(adam_mul(s.neg_step_size, exp_avg), denom));
}

// The deferral accumulator: acc + scale * value with one rounding (torch: acc.add_(g, alpha=scale)).
ZF_HOST_DEVICE static inline float accumulate_element(float acc, float value, float scale) {
  return adam_fma(value, scale, acc);
}

}  // namespace zf
