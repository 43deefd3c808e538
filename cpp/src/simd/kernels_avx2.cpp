// AVX2 + FMA + F16C level. Compiled with -mavx2 -mfma -mf16c on this file only.
#include <immintrin.h>

#include "simd/kernels_impl.hpp"

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
  static F64x add_widened(F64x acc, F32 x) {
    return {_mm256_add_pd(acc.lo, _mm256_cvtps_pd(_mm256_castps256_ps128(x))),
            _mm256_add_pd(acc.hi, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)))};
  }
};

}  // namespace

namespace zf {
namespace simd {
const KernelTable* kernel_table_avx2() {
  static const KernelTable table = make_kernel_table<Avx2Isa>(ZF_SIMD_AVX2);
  return &table;
}
}  // namespace simd
}  // namespace zf
