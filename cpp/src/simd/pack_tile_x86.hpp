// The 8x8 tile of the pack and scatter kernels (kernels_pack_impl.hpp) on 256-bit vectors:
// AVX2 + F16C. Included by the AVX2 and the AVX-512 kernel files (both compile with these
// flags); an 8-lane tile already moves whole cache lines, so AVX-512 gains nothing from 16x16.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "simd/kernels_pack_impl.hpp"

namespace {

struct X86PackTile {
  using V = __m256;
  template <int kDtype>
  static V load(const void* base, int64_t i) {
    if constexpr (kDtype == ZF_DTYPE_F32) {
      return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    } else {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
      if constexpr (kDtype == ZF_DTYPE_BF16) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
      } else {
        return _mm256_cvtph_ps(bits);
      }
    }
  }
  // 8 fp32 lanes rounded to nearest even into 8 bf16 or f16 words.
  template <int kDtype>
  static __m128i narrow(V x) {
    if constexpr (kDtype == ZF_DTYPE_BF16) {
      // Integer arithmetic; NaN keeps its sign and top payload bits and is made quiet, as
      // zf::f32_to_bf16 does.
      const __m256i word = _mm256_castps_si256(x);
      const __m256i high = _mm256_srli_epi32(word, 16);
      const __m256i rounding =
          _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
      const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(word, rounding), 16);
      const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
      const __m256i result = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), is_nan);
      // packus works within 128-bit halves: gather the two low quadwords afterwards.
      return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(result, result), 0x08));
    } else {
      return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    }
  }
  template <int kDtype>
  static void store(void* base, int64_t i, V x) {
    if constexpr (kDtype == ZF_DTYPE_F32) {
      _mm256_storeu_ps(static_cast<float*>(base) + i, x);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i), narrow<kDtype>(x));
    }
  }
  template <int kDtype>
  static V gather(const void* row, const int64_t* columns) {
    if constexpr (kDtype == ZF_DTYPE_F32) {
      // Built in a register from scalar loads: a store then a wider load of the same bytes
      // would stall on the forwarding, and vpgatherdd measured slower on this AMD core.
      const auto* p = static_cast<const float*>(row);
      return _mm256_setr_ps(p[columns[0]], p[columns[1]], p[columns[2]], p[columns[3]], p[columns[4]], p[columns[5]],
                            p[columns[6]], p[columns[7]]);
    } else {
      // Built in a register, as above.
      const auto* p = static_cast<const uint16_t*>(row);
      const __m128i bits = _mm_setr_epi16(static_cast<int16_t>(p[columns[0]]), static_cast<int16_t>(p[columns[1]]),
                                          static_cast<int16_t>(p[columns[2]]), static_cast<int16_t>(p[columns[3]]),
                                          static_cast<int16_t>(p[columns[4]]), static_cast<int16_t>(p[columns[5]]),
                                          static_cast<int16_t>(p[columns[6]]), static_cast<int16_t>(p[columns[7]]));
      if constexpr (kDtype == ZF_DTYPE_BF16) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
      } else {
        return _mm256_cvtph_ps(bits);
      }
    }
  }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static void transpose(V (&r)[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
  }
};

}  // namespace
