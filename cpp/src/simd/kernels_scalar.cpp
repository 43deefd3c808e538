// Portable level: plain C++ that any x86-64 or aarch64 compiler vectorises at its baseline.
#include "simd/kernels_impl.hpp"

namespace {

struct ScalarIsa {
  static constexpr int64_t kLanes = 1;
  using F32 = float;
  using F64x = double;
  static F32 load_f32(const float* p) { return *p; }
  static F32 load_bf16(const uint16_t* p) { return zf::bf16_to_f32(*p); }
  static F32 load_f16(const uint16_t* p) { return zf::f16_to_f32(*p); }
  static F64x load_f64x(const double* p) { return *p; }
  static void store_f64x(double* p, F64x v) { *p = v; }
  static F32 mul(F32 a, F32 b) { return a * b; }
  static F32 add(F32 a, F32 b) { return a + b; }
  // The optimizer's primitives (kernels_adam_impl.hpp).
  static F32 set1(float x) { return x; }
  static F32 sub(F32 a, F32 b) { return a - b; }
  static F32 div(F32 a, F32 b) { return a / b; }
  static F32 sqrt(F32 a) { return std::sqrt(a); }
  static F32 fma(F32 a, F32 b, F32 c) { return zf::adam_fma(a, b, c); }
  // One lane: the divide itself is as fast as the correction.
  static F32 div_root_by_invariant(F32 a, F32 b, F32 /*reciprocal*/) { return a / b; }
  static void store_f32(float* p, F32 x) { *p = x; }
  static void store_bf16(uint16_t* p, F32 x) { *p = zf::f32_to_bf16(x); }
  static void store_f16(uint16_t* p, F32 x) { *p = zf::f32_to_f16(x); }
  static constexpr int64_t kStream16Alignment = 2;  // no streaming stores at this level
  static void stream_bf16(uint16_t* p, F32 x) { store_bf16(p, x); }
  static void stream_f16(uint16_t* p, F32 x) { store_f16(p, x); }
  static void stream_fence() {}
  static constexpr int64_t kStream32Alignment = 4;
  static void stream_f32(float* p, F32 x) { store_f32(p, x); }
  static F64x add_widened(F64x acc, F32 x) { return acc + static_cast<double>(x); }
};

}  // namespace

namespace zf {
namespace simd {
const KernelTable* kernel_table_scalar() {
  static const KernelTable table = make_kernel_table<ScalarIsa, PortablePackTile>(ZF_SIMD_SCALAR);
  return &table;
}
}  // namespace simd
}  // namespace zf
