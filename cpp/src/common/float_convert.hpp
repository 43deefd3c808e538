// Scalar bf16/fp16 <-> fp32 conversions shared by the host kernels (every ISA level's tail
// loop) and, through ZF_HOST_DEVICE, by CUDA code: one definition of the rounding.
// Functions are `static inline` on purpose: this header is compiled into the AVX2 and
// AVX-512 translation units too, and internal linkage keeps the linker from picking an
// AVX-512 copy for a caller on a CPU without it.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ZF_HOST_DEVICE __host__ __device__
#else
#define ZF_HOST_DEVICE
#endif

namespace zf {

ZF_HOST_DEVICE static inline uint32_t f32_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

ZF_HOST_DEVICE static inline float f32_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

ZF_HOST_DEVICE static inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// Round to nearest, ties to even; NaN stays a (quiet) NaN.
ZF_HOST_DEVICE static inline uint16_t f32_to_bf16(float value) {
  const uint32_t bits = f32_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

ZF_HOST_DEVICE static inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mantissa << 13));  // Inf, NaN
  if (exponent != 0) return f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return f32_from_bits(sign);
  // Subnormal half: value = mantissa * 2^-24, exact in fp32.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

// Round to nearest, ties to even, with overflow to Inf and gradual underflow.
ZF_HOST_DEVICE static inline uint16_t f32_to_f16(float value) {
  const uint32_t bits = f32_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (magnitude >= 0x38800000u) {                                              // normal half
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (magnitude < 0x33000000u) return sign;  // below half the smallest subnormal: +-0
  // Subnormal half: shift the full mantissa into place, rounding to nearest even.
  const uint32_t exponent = magnitude >> 23;
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  const uint32_t half_ulp = 1u << (shift - 1);
  uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  if (remainder > half_ulp || (remainder == half_ulp && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

}  // namespace zf
