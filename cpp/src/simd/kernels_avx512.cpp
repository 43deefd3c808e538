// AVX-512 (F/BW/VL/DQ) level. Compiled with AVX-512 flags on this file only.
#include <immintrin.h>

#include "simd/kernels_impl.hpp"

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
  static F64x add_widened(F64x acc, F32 x) {
    return {_mm512_add_pd(acc.lo, _mm512_cvtps_pd(_mm512_castps512_ps256(x))),
            _mm512_add_pd(acc.hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)))};
  }
};

}  // namespace

namespace zf {
namespace simd {
const KernelTable* kernel_table_avx512() {
  static const KernelTable table = make_kernel_table<Avx512Isa>(ZF_SIMD_AVX512);
  return &table;
}
}  // namespace simd
}  // namespace zf
