// The host optimizer kernels (Adam/AdamW step, deferral accumulate), written once over the
// Isa vector interface and compiled once per ISA level through kernels_impl.hpp. Everything
// sits in an anonymous namespace: the copies built with different flags never meet at link
// time.
//
// Beyond kernels_impl.hpp's interface, an Isa provides, on F32 vectors:
//   set1(float), add, sub, mul, div, sqrt    lane-wise, each correctly rounded
//   fma(a, b, c)                             a * b + c with one rounding
//   div_root_by_invariant(a, b, y)           a / b correctly rounded, for `a` a square root
//                                            (below) and y = 1.0f / b; lane-wise like div
//   store_f32 / store_bf16 / store_f16       kLanes elements (unaligned); the narrowing
//                                            stores round to nearest even
//   stream_bf16 / stream_f16, stream_fence   the same as non-temporal stores, to an address
//                                            aligned to kStream16Alignment bytes; the fence
//                                            orders them before the call returns
//   stream_f32                               store_f32 as a non-temporal store, to an
//                                            address aligned to kStream32Alignment bytes
//
// div_root_by_invariant serves the bias correction's sqrt(v) / sqrt(bc2), a divide by the same
// number in every lane of a call. A vector divide is the step's slowest instruction (on a Zen 4
// core the two divides and the square root bound the fp32 step at about 73 GB/s from L1, under
// twice the memory's speed, so that in the fast memory state the step's divides no longer
// hide behind its loads). The SIMD levels compute it as q = a * y, then Markstein's
// correction q + (a - q * b) * y with FMAs: with y = RN(1 / b), the residual a - q * b is
// exact and the corrected quotient is a / b correctly rounded, provided nothing underflows
// or overflows. That holds for every `a` the step divides (the square root of a float: +-0,
// [2^-75, 2^64], +inf or NaN; zeros, infinities and NaN take q itself, whose bits are the
// divide's) and every divisor in [2^-27, 1] (every bc2_sqrt: 1 - beta2^step >= 2^-53),
// checked exhaustively over the square roots' range for thousands of divisors
// (tests/cpp/test_cpu_adamw.cpp samples it at every level in CI). Outside that divisor
// range the kernels divide.
//
// The vector body computes adam_update_element (common/adam_math.hpp) operation for
// operation. A tail shorter than a vector goes through the same body on a padded copy, so
// an element's result never depends on where a thread's range or a column run starts:
// results are bitwise identical across thread counts, and across levels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/adam_math.hpp"
#include "simd/kernels.hpp"

namespace {

constexpr int kNoOutput = -1;

// How a step forms its gradient (AdamStepArgs::fuse_accumulate): from `grad` alone, or as
// the window's last accumulate would have left the accumulator, into a fresh one (+0.0f) or
// into the one the window's earlier steps filled.
constexpr int kGradAlone = 0;
constexpr int kFuseIntoFresh = 1;
constexpr int kFuseIntoAccumulator = 2;

template <class Isa, int kDtype>
typename Isa::F32 load_as_f32(const void* base, int64_t i) {
  if constexpr (kDtype == ZF_DTYPE_F32) {
    return Isa::load_f32(static_cast<const float*>(base) + i);
  } else if constexpr (kDtype == ZF_DTYPE_BF16) {
    return Isa::load_bf16(static_cast<const uint16_t*>(base) + i);
  } else {
    return Isa::load_f16(static_cast<const uint16_t*>(base) + i);
  }
}

// kStream: a non-temporal store (16-bit dtypes only; the address must be aligned to
// Isa::kStream16Alignment bytes).
template <class Isa, int kDtype, bool kStream = false>
void store_from_f32(void* base, int64_t i, typename Isa::F32 x) {
  if constexpr (kDtype == ZF_DTYPE_F32) {
    Isa::store_f32(static_cast<float*>(base) + i, x);
  } else if constexpr (kDtype == ZF_DTYPE_BF16) {
    if constexpr (kStream) {
      Isa::stream_bf16(static_cast<uint16_t*>(base) + i, x);
    } else {
      Isa::store_bf16(static_cast<uint16_t*>(base) + i, x);
    }
  } else {
    if constexpr (kStream) {
      Isa::stream_f16(static_cast<uint16_t*>(base) + i, x);
    } else {
      Isa::store_f16(static_cast<uint16_t*>(base) + i, x);
    }
  }
}

constexpr size_t element_bytes(int dtype) { return dtype == ZF_DTYPE_F32 ? 4 : 2; }

// The elements of `bytes_each` from `p` up to the next `alignment`-byte boundary, at most
// count: the head a streamed store runs through the padded copy.
inline int64_t alignment_head(const void* p, size_t alignment, size_t bytes_each, int64_t count) {
  const auto misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % alignment / bytes_each);
  return misaligned == 0 ? 0 : std::min(count, static_cast<int64_t>(alignment / bytes_each) - misaligned);
}

// The step scalars broadcast once per call.
template <class Isa>
struct AdamVectorScalars {
  using F32 = typename Isa::F32;
  F32 grad_scale, accumulate_scale, l2, decay_factor, lerp_coeff, beta2, one_minus_beta2, bc2_sqrt, bc2_sqrt_reciprocal,
      eps, neg_step_size;
  bool apply_l2, lerp_from_grad;
  // sqrt(1 - beta2^step) rounded to 1 (from about step 16600 at beta2 0.999): x / 1 is x
  // exactly, so the divide is skipped with the same bits.
  bool bc2_is_one;
  // The divisor is in div_root_by_invariant's range (the header comment): always, for the
  // scalars adam_step_scalars makes.
  bool bc2_by_reciprocal;
  explicit AdamVectorScalars(const zf::simd::AdamStepArgs& a)
      : grad_scale(Isa::set1(a.grad_scale)),
        accumulate_scale(Isa::set1(a.accumulate_scale)),
        l2(Isa::set1(a.scalars.l2)),
        decay_factor(Isa::set1(a.scalars.decay_factor)),
        lerp_coeff(Isa::set1(a.scalars.lerp_coeff)),
        beta2(Isa::set1(a.scalars.beta2)),
        one_minus_beta2(Isa::set1(a.scalars.one_minus_beta2)),
        bc2_sqrt(Isa::set1(a.scalars.bc2_sqrt)),
        bc2_sqrt_reciprocal(Isa::set1(1.0f / a.scalars.bc2_sqrt)),
        eps(Isa::set1(a.scalars.eps)),
        neg_step_size(Isa::set1(a.scalars.neg_step_size)),
        apply_l2(a.scalars.apply_l2),
        lerp_from_grad(a.scalars.lerp_from_grad),
        bc2_is_one(a.scalars.bc2_sqrt == 1.0f),
        bc2_by_reciprocal(a.scalars.bc2_sqrt >= 0x1p-27f && a.scalars.bc2_sqrt <= 1.0f) {}
};

// kLanes elements starting at element i of every buffer of `a`. Always inlined: at -O2 (the
// RelWithDebInfo build) GCC kept it a call per vector, with the broadcast scalars reloaded
// from memory each time, and the step ran 25% slower in L2 than at -O3 (61 against 80 GB/s
// on a Zen 4 core).
// How a vector forms the bias correction's sqrt(v) / sqrt(bc2) (AdamVectorScalars): the vector
// loop takes it as a template argument, chosen once per call, so that the loop body carries
// no compare and branch for it; the padded tail decides per vector.
enum class Bc2Division { kNone, kByReciprocal, kDivide, kPerVector };

template <class Isa>
Bc2Division bc2_division(const AdamVectorScalars<Isa>& s) {
  return s.bc2_is_one ? Bc2Division::kNone : s.bc2_by_reciprocal ? Bc2Division::kByReciprocal : Bc2Division::kDivide;
}

template <class Isa, int kGrad, int kOut, bool kZeroGrad, bool kStreamOut = false, int kFuse = kGradAlone,
          Bc2Division kBc2 = Bc2Division::kPerVector>
[[gnu::always_inline]] inline void adam_vector_at(const zf::simd::AdamStepArgs& a, const AdamVectorScalars<Isa>& s,
                                                  int64_t i) {
  using F32 = typename Isa::F32;
  F32 grad;
  if constexpr (kFuse == kGradAlone) {
    grad = Isa::mul(load_as_f32<Isa, kGrad>(a.grad, i), s.grad_scale);
  } else {
    // accumulate_typed's arithmetic, then the window's scale: the same bits as the accumulate
    // storing this fp32 value and the update reading it back.
    const F32 base = kFuse == kFuseIntoAccumulator ? Isa::load_f32(a.accumulator + i) : Isa::set1(0.0f);
    grad = Isa::mul(Isa::fma(load_as_f32<Isa, kGrad>(a.grad, i), s.accumulate_scale, base), s.grad_scale);
  }
  if constexpr (kZeroGrad) store_from_f32<Isa, kGrad>(a.grad, i, Isa::set1(0.0f));
  F32 param = Isa::load_f32(a.param + i);
  F32 exp_avg = Isa::load_f32(a.exp_avg + i);
  F32 exp_avg_sq = Isa::load_f32(a.exp_avg_sq + i);
  if (s.apply_l2) grad = Isa::fma(param, s.l2, grad);
  param = Isa::mul(param, s.decay_factor);
  exp_avg = Isa::fma(s.lerp_coeff, Isa::sub(grad, exp_avg), s.lerp_from_grad ? grad : exp_avg);
  exp_avg_sq = Isa::fma(Isa::mul(s.one_minus_beta2, grad), grad, Isa::mul(exp_avg_sq, s.beta2));
  const F32 root = Isa::sqrt(exp_avg_sq);
  const Bc2Division division = kBc2 == Bc2Division::kPerVector ? bc2_division(s) : kBc2;
  const F32 corrected = division == Bc2Division::kNone ? root
                        : division == Bc2Division::kByReciprocal
                            ? Isa::div_root_by_invariant(root, s.bc2_sqrt, s.bc2_sqrt_reciprocal)
                            : Isa::div(root, s.bc2_sqrt);
  const F32 denom = Isa::add(corrected, s.eps);
  param = Isa::add(param, Isa::div(Isa::mul(s.neg_step_size, exp_avg), denom));
  Isa::store_f32(a.exp_avg + i, exp_avg);
  Isa::store_f32(a.exp_avg_sq + i, exp_avg_sq);
  Isa::store_f32(a.param + i, param);
  if constexpr (kOut != kNoOutput) store_from_f32<Isa, kOut, kStreamOut>(a.out, i, param);
}

// `rest` < kLanes elements starting at element i, through the vector body on zero-padded
// copies: the same arithmetic as a full vector.
template <class Isa, int kGrad, int kOut, bool kZeroGrad, int kFuse = kGradAlone>
void adam_padded(const zf::simd::AdamStepArgs& a, const AdamVectorScalars<Isa>& s, int64_t i, size_t rest) {
  alignas(64) float param[Isa::kLanes] = {};
  alignas(64) float exp_avg[Isa::kLanes] = {};
  alignas(64) float exp_avg_sq[Isa::kLanes] = {};
  alignas(64) float accumulator[Isa::kLanes] = {};
  alignas(64) unsigned char grad[Isa::kLanes * 4] = {};
  alignas(64) unsigned char out[Isa::kLanes * 4] = {};
  constexpr size_t grad_bytes = element_bytes(kGrad);
  std::memcpy(param, a.param + i, rest * sizeof(float));
  std::memcpy(exp_avg, a.exp_avg + i, rest * sizeof(float));
  std::memcpy(exp_avg_sq, a.exp_avg_sq + i, rest * sizeof(float));
  std::memcpy(grad, static_cast<const unsigned char*>(a.grad) + i * grad_bytes, rest * grad_bytes);
  zf::simd::AdamStepArgs padded = a;
  padded.param = param;
  padded.exp_avg = exp_avg;
  padded.exp_avg_sq = exp_avg_sq;
  padded.grad = grad;
  padded.out = out;
  if constexpr (kFuse == kFuseIntoAccumulator) {
    std::memcpy(accumulator, a.accumulator + i, rest * sizeof(float));
    padded.accumulator = accumulator;
  }
  adam_vector_at<Isa, kGrad, kOut, kZeroGrad, false, kFuse>(padded, s, 0);
  std::memcpy(a.param + i, param, rest * sizeof(float));
  std::memcpy(a.exp_avg + i, exp_avg, rest * sizeof(float));
  std::memcpy(a.exp_avg_sq + i, exp_avg_sq, rest * sizeof(float));
  if constexpr (kZeroGrad) std::memcpy(static_cast<unsigned char*>(a.grad) + i * grad_bytes, grad, rest * grad_bytes);
  if constexpr (kOut != kNoOutput) {
    constexpr size_t out_bytes = element_bytes(kOut);
    std::memcpy(static_cast<unsigned char*>(a.out) + i * out_bytes, out, rest * out_bytes);
  }
}

// kStreamOut: the 16-bit output copy goes out with non-temporal stores. It is written once
// and read next by the upload (a DMA), so fetching its lines first (the read-for-ownership
// of a normal store) would be wasted traffic. A head of elements aligns the output.
template <class Isa, int kGrad, int kOut, bool kZeroGrad, bool kStreamOut, int kFuse>
void adam_step_typed(const zf::simd::AdamStepArgs& a, int64_t count) {
  const AdamVectorScalars<Isa> s(a);
  int64_t i = 0;
  if constexpr (kStreamOut) {
    const int64_t head = alignment_head(a.out, Isa::kStream16Alignment, 2, count);
    if (head > 0) adam_padded<Isa, kGrad, kOut, kZeroGrad, kFuse>(a, s, 0, static_cast<size_t>(head));
    i = head;
  }
  // No software prefetch: the hardware prefetchers keep up. Measured on a 2-core AMD EPYC
  // (Zen 4), interleaved on the same buffers, prefetching master, m, v, A and the gradient
  // 256 (or 1024 to 4096, into L2) elements ahead made the step 2-8% slower from memory
  // (benchmarks/results/2026-12-06-host-lane-roof-per-window.md), and 10% slower in cache.
  // The loop reads the call's pointers from a local copy: the vector stores may alias
  // anything (__m256 and __m512 are may_alias types), so through the caller's reference GCC
  // reloaded every pointer after each store. With that and the bc2 branch gone, the AVX2 step
  // ran 35-60% faster in L1 and 10-16% faster from memory on two Zen cores (the fused update
  // at the streaming roof there; benchmarks/results/2026-12-07-host-step-loop.md).
  const zf::simd::AdamStepArgs local = a;
  switch (bc2_division(s)) {
    case Bc2Division::kNone:
      for (; i + Isa::kLanes <= count; i += Isa::kLanes)
        adam_vector_at<Isa, kGrad, kOut, kZeroGrad, kStreamOut, kFuse, Bc2Division::kNone>(local, s, i);
      break;
    case Bc2Division::kByReciprocal:
      for (; i + Isa::kLanes <= count; i += Isa::kLanes)
        adam_vector_at<Isa, kGrad, kOut, kZeroGrad, kStreamOut, kFuse, Bc2Division::kByReciprocal>(local, s, i);
      break;
    default:
      for (; i + Isa::kLanes <= count; i += Isa::kLanes)
        adam_vector_at<Isa, kGrad, kOut, kZeroGrad, kStreamOut, kFuse, Bc2Division::kDivide>(local, s, i);
  }
  if (i < count) adam_padded<Isa, kGrad, kOut, kZeroGrad, kFuse>(a, s, i, static_cast<size_t>(count - i));
  if constexpr (kStreamOut) Isa::stream_fence();
}

// A fused step never zeroes its gradient (the engine's window close reads a staging copy).
template <class Isa, int kGrad, int kOut, bool kStreamOut, int kFuse>
void adam_step_zero_grad_dispatch(const zf::simd::AdamStepArgs& a, int64_t count) {
  if constexpr (kFuse == kGradAlone) {
    if (a.zero_grad) return adam_step_typed<Isa, kGrad, kOut, true, kStreamOut, kFuse>(a, count);
  }
  adam_step_typed<Isa, kGrad, kOut, false, kStreamOut, kFuse>(a, count);
}

template <class Isa, int kGrad, int kOut, int kFuse>
void adam_step_stream_dispatch(const zf::simd::AdamStepArgs& a, int64_t count) {
  if (a.stream_out) {
    adam_step_zero_grad_dispatch<Isa, kGrad, kOut, true, kFuse>(a, count);
  } else {
    adam_step_zero_grad_dispatch<Isa, kGrad, kOut, false, kFuse>(a, count);
  }
}

template <class Isa, int kGrad, int kFuse>
void adam_step_output_dispatch(const zf::simd::AdamStepArgs& a, int64_t count) {
  if (a.out == nullptr) return adam_step_zero_grad_dispatch<Isa, kGrad, kNoOutput, false, kFuse>(a, count);
  switch (a.out_dtype) {
    case ZF_DTYPE_F32:
      return adam_step_zero_grad_dispatch<Isa, kGrad, ZF_DTYPE_F32, false, kFuse>(a, count);
    case ZF_DTYPE_BF16:
      return adam_step_stream_dispatch<Isa, kGrad, ZF_DTYPE_BF16, kFuse>(a, count);
    default:
      return adam_step_stream_dispatch<Isa, kGrad, ZF_DTYPE_F16, kFuse>(a, count);
  }
}

template <class Isa, int kGrad>
void adam_step_fuse_dispatch(const zf::simd::AdamStepArgs& a, int64_t count) {
  if (!a.fuse_accumulate) return adam_step_output_dispatch<Isa, kGrad, kGradAlone>(a, count);
  if (a.accumulator == nullptr) return adam_step_output_dispatch<Isa, kGrad, kFuseIntoFresh>(a, count);
  adam_step_output_dispatch<Isa, kGrad, kFuseIntoAccumulator>(a, count);
}

// The op layer has validated the dtypes: f32, bf16 or f16 only.
template <class Isa>
void adam_step(const zf::simd::AdamStepArgs& a, int64_t count) {
  switch (a.grad_dtype) {
    case ZF_DTYPE_F32:
      return adam_step_fuse_dispatch<Isa, ZF_DTYPE_F32>(a, count);
    case ZF_DTYPE_BF16:
      return adam_step_fuse_dispatch<Isa, ZF_DTYPE_BF16>(a, count);
    default:
      return adam_step_fuse_dispatch<Isa, ZF_DTYPE_F16>(a, count);
  }
}

// acc[0, count) from x[0, count) through the padded copy: a tail shorter than a vector, or
// the alignment head of a streamed overwrite, computed by the same vector operation.
template <class Isa, int kDtype, bool kOverwrite>
void accumulate_padded(float* acc, const void* x, size_t count, typename Isa::F32 factor) {
  constexpr size_t x_bytes = element_bytes(kDtype);
  alignas(64) float padded_acc[Isa::kLanes] = {};
  alignas(64) unsigned char padded_x[Isa::kLanes * 4] = {};
  if (!kOverwrite) std::memcpy(padded_acc, acc, count * sizeof(float));
  std::memcpy(padded_x, x, count * x_bytes);
  Isa::store_f32(padded_acc, Isa::fma(load_as_f32<Isa, kDtype>(padded_x, 0), factor, Isa::load_f32(padded_acc)));
  std::memcpy(acc, padded_acc, count * sizeof(float));
}

// kStream (overwrite only): acc goes out with non-temporal stores after a head that aligns it.
template <class Isa, int kDtype, bool kOverwrite, bool kStream = false>
void accumulate_typed(float* acc, const void* x, int64_t count, float scale) {
  static_assert(kOverwrite || !kStream, "only a write-only accumulate streams");
  const typename Isa::F32 factor = Isa::set1(scale);
  // Overwrite adds into +0.0f (not the product alone): -0.0 becomes +0.0 as it does in a
  // zeroed accumulator, so both forms give the same bits.
  const typename Isa::F32 zero = Isa::set1(0.0f);
  constexpr size_t x_bytes = element_bytes(kDtype);
  int64_t i = 0;
  if constexpr (kStream) {
    const int64_t head = alignment_head(acc, Isa::kStream32Alignment, 4, count);
    if (head > 0) accumulate_padded<Isa, kDtype, kOverwrite>(acc, x, static_cast<size_t>(head), factor);
    i = head;
  }
  for (; i + Isa::kLanes <= count; i += Isa::kLanes) {
    const typename Isa::F32 base = kOverwrite ? zero : Isa::load_f32(acc + i);
    const typename Isa::F32 sum = Isa::fma(load_as_f32<Isa, kDtype>(x, i), factor, base);
    if constexpr (kStream) {
      Isa::stream_f32(acc + i, sum);
    } else {
      Isa::store_f32(acc + i, sum);
    }
  }
  if (i < count) {
    accumulate_padded<Isa, kDtype, kOverwrite>(acc + i, static_cast<const unsigned char*>(x) + i * x_bytes,
                                               static_cast<size_t>(count - i), factor);
  }
  if constexpr (kStream) Isa::stream_fence();
}

template <class Isa, int kDtype>
void accumulate_dtype(float* acc, const void* x, int64_t count, float scale, bool overwrite, bool stream) {
  if (overwrite && stream) return accumulate_typed<Isa, kDtype, true, true>(acc, x, count, scale);
  if (overwrite) return accumulate_typed<Isa, kDtype, true>(acc, x, count, scale);
  accumulate_typed<Isa, kDtype, false>(acc, x, count, scale);
}

template <class Isa>
void accumulate(float* acc, const void* x, zf_dtype x_dtype, int64_t count, float scale, bool overwrite, bool stream) {
  switch (x_dtype) {
    case ZF_DTYPE_F32:
      return accumulate_dtype<Isa, ZF_DTYPE_F32>(acc, x, count, scale, overwrite, stream);
    case ZF_DTYPE_BF16:
      return accumulate_dtype<Isa, ZF_DTYPE_BF16>(acc, x, count, scale, overwrite, stream);
    default:
      return accumulate_dtype<Isa, ZF_DTYPE_F16>(acc, x, count, scale, overwrite, stream);
  }
}

}  // namespace
