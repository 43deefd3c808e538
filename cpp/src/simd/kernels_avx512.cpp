// AVX-512 (F/BW/VL/DQ) level. Compiled with AVX-512 flags on this file only.
#include <immintrin.h>

#include "simd/kernels_impl.hpp"
#include "simd/pack_tile_x86.hpp"

namespace {

struct Avx512Isa {
  static constexpr int64_t kLanes = 16;
  using F32 = __m512;
  struct F64x {
    __m512d lo, hi;
  };
  static F32 load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static F32 load_bf16(const uint16_t* p) {
    const __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
  }
  static F32 load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F64x load_f64x(const double* p) { return {_mm512_loadu_pd(p), _mm512_loadu_pd(p + 8)}; }
  static void store_f64x(double* p, F64x v) {
    _mm512_storeu_pd(p, v.lo);
    _mm512_storeu_pd(p + 8, v.hi);
  }
  static F32 mul(F32 a, F32 b) { return _mm512_mul_ps(a, b); }
  static F32 add(F32 a, F32 b) { return _mm512_add_ps(a, b); }
  // The optimizer's primitives (kernels_adam_impl.hpp).
  static F32 set1(float x) { return _mm512_set1_ps(x); }
  static F32 sub(F32 a, F32 b) { return _mm512_sub_ps(a, b); }
  static F32 div(F32 a, F32 b) { return _mm512_div_ps(a, b); }
  static F32 sqrt(F32 a) { return _mm512_sqrt_ps(a); }
  static F32 fma(F32 a, F32 b, F32 c) { return _mm512_fmadd_ps(a, b, c); }
  // Markstein's correction (kernels_adam_impl.hpp): the residual q * b - a is exact; it is
  // NaN only where a is +-inf or NaN, and there q is already a / b.
  static F32 div_root_by_invariant(F32 a, F32 b, F32 reciprocal) {
    const F32 q = _mm512_mul_ps(a, reciprocal);
    const F32 residual = _mm512_fmsub_ps(q, b, a);
    const F32 corrected = _mm512_fnmadd_ps(residual, reciprocal, q);
    return _mm512_mask_mov_ps(corrected, _mm512_cmp_ps_mask(residual, residual, _CMP_UNORD_Q), q);
  }
  static void store_f32(float* p, F32 x) { _mm512_storeu_ps(p, x); }
  // Round to nearest even in integer arithmetic (AVX512_BF16 is not part of this level);
  // NaN keeps its sign and top payload bits and is made quiet, as zf::f32_to_bf16 does.
  static __m256i to_bf16(F32 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i rounding = _mm512_add_epi32(_mm512_and_si512(high, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, rounding), 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i result = _mm512_mask_mov_epi32(rounded, is_nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(result);
  }
  static __m256i to_f16(F32 x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static void store_bf16(uint16_t* p, F32 x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(x)); }
  static void store_f16(uint16_t* p, F32 x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_f16(x)); }
  static constexpr int64_t kStream16Alignment = 32;
  static void stream_bf16(uint16_t* p, F32 x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16(x)); }
  static void stream_f16(uint16_t* p, F32 x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_f16(x)); }
  static void stream_fence() { _mm_sfence(); }
  static constexpr int64_t kStream32Alignment = 64;
  static void stream_f32(float* p, F32 x) { _mm512_stream_ps(p, x); }
  static F64x add_widened(F64x acc, F32 x) {
    return {_mm512_add_pd(acc.lo, _mm512_cvtps_pd(_mm512_castps512_ps256(x))),
            _mm512_add_pd(acc.hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)))};
  }
};

}  // namespace

namespace zf {
namespace simd {
const KernelTable* kernel_table_avx512() {
  static const KernelTable table = make_kernel_table<Avx512Isa, X86PackTile>(ZF_SIMD_AVX512);
  return &table;
}
}  // namespace simd
}  // namespace zf
