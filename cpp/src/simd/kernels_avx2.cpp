// AVX2 + FMA + F16C level. Compiled with -mavx2 -mfma -mf16c on this file only.
#include <immintrin.h>

#include "simd/kernels_impl.hpp"
#include "simd/pack_tile_x86.hpp"

namespace {

struct Avx2Isa {
  static constexpr int64_t kLanes = 8;
  using F32 = __m256;
  struct F64x {
    __m256d lo, hi;
  };
  static F32 load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static F32 load_bf16(const uint16_t* p) {
    const __m256i widened = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
  }
  static F32 load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F64x load_f64x(const double* p) { return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)}; }
  static void store_f64x(double* p, F64x v) {
    _mm256_storeu_pd(p, v.lo);
    _mm256_storeu_pd(p + 4, v.hi);
  }
  static F32 mul(F32 a, F32 b) { return _mm256_mul_ps(a, b); }
  static F32 add(F32 a, F32 b) { return _mm256_add_ps(a, b); }
  // The optimizer's primitives (kernels_adam_impl.hpp).
  static F32 set1(float x) { return _mm256_set1_ps(x); }
  static F32 sub(F32 a, F32 b) { return _mm256_sub_ps(a, b); }
  static F32 div(F32 a, F32 b) { return _mm256_div_ps(a, b); }
  static F32 sqrt(F32 a) { return _mm256_sqrt_ps(a); }
  static F32 fma(F32 a, F32 b, F32 c) { return _mm256_fmadd_ps(a, b, c); }
  // Markstein's correction (kernels_adam_impl.hpp): the residual q * b - a is exact; it is
  // NaN only where a is +-inf or NaN, and there q is already a / b.
  static F32 div_root_by_invariant(F32 a, F32 b, F32 reciprocal) {
    const F32 q = _mm256_mul_ps(a, reciprocal);
    const F32 residual = _mm256_fmsub_ps(q, b, a);
    const F32 corrected = _mm256_fnmadd_ps(residual, reciprocal, q);
    return _mm256_blendv_ps(corrected, q, _mm256_cmp_ps(residual, residual, _CMP_UNORD_Q));
  }
  static void store_f32(float* p, F32 x) { _mm256_storeu_ps(p, x); }
  // Round to nearest even in integer arithmetic; NaN keeps its sign and top payload bits
  // and is made quiet, as zf::f32_to_bf16 does.
  static __m128i to_bf16(F32 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i rounding = _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, rounding), 16);
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i result = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), is_nan);
    // packus works within 128-bit halves: gather the two low quadwords afterwards.
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08));
  }
  static __m128i to_f16(F32 x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT); }
  static void store_bf16(uint16_t* p, F32 x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(x)); }
  static void store_f16(uint16_t* p, F32 x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_f16(x)); }
  static constexpr int64_t kStream16Alignment = 16;
  static void stream_bf16(uint16_t* p, F32 x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16(x)); }
  static void stream_f16(uint16_t* p, F32 x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_f16(x)); }
  static void stream_fence() { _mm_sfence(); }
  static constexpr int64_t kStream32Alignment = 32;
  static void stream_f32(float* p, F32 x) { _mm256_stream_ps(p, x); }
  static F64x add_widened(F64x acc, F32 x) {
    return {_mm256_add_pd(acc.lo, _mm256_cvtps_pd(_mm256_castps256_ps128(x))),
            _mm256_add_pd(acc.hi, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)))};
  }
};

}  // namespace

namespace zf {
namespace simd {
const KernelTable* kernel_table_avx2() {
  static const KernelTable table = make_kernel_table<Avx2Isa, X86PackTile>(ZF_SIMD_AVX2);
  return &table;
}
}  // namespace simd
}  // namespace zf
