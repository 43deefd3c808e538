// Picks the SIMD level once, at load time, from cpuid (and ZENFLOW_SIMD).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/error.hpp"
#include "simd/kernels.hpp"

namespace zf {
namespace simd {

namespace {

zf_simd_level detect_supported_level() {
#if defined(ZENFLOW_HAVE_X86_SIMD)
  // __builtin_cpu_supports also checks XCR0, i.e. that the OS saves the wider registers.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    return ZF_SIMD_AVX512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    return ZF_SIMD_AVX2;
  }
#endif
  return ZF_SIMD_SCALAR;
}

zf_simd_level level_from_environment(zf_simd_level supported) {
  const char* requested = std::getenv("ZENFLOW_SIMD");
  if (requested == nullptr || requested[0] == '\0') return supported;
  zf_simd_level level = supported;
  if (std::strcmp(requested, "scalar") == 0) level = ZF_SIMD_SCALAR;
  if (std::strcmp(requested, "avx2") == 0) level = ZF_SIMD_AVX2;
  if (std::strcmp(requested, "avx512") == 0) level = ZF_SIMD_AVX512;
  // The variable can only lower the level: asking for more than the CPU has would crash.
  return level < supported ? level : supported;
}

struct State {
  zf_simd_level supported;
  std::atomic<int> active;
  State() : supported(detect_supported_level()), active(level_from_environment(supported)) {}
};

State& state() {
  static State instance;
  return instance;
}

}  // namespace

const KernelTable* kernel_table(zf_simd_level level) {
  switch (level) {
    case ZF_SIMD_SCALAR:
      return kernel_table_scalar();
#if defined(ZENFLOW_HAVE_X86_SIMD)
    case ZF_SIMD_AVX2:
      return kernel_table_avx2();
    case ZF_SIMD_AVX512:
      return kernel_table_avx512();
#endif
    default:
      return nullptr;
  }
}

const KernelTable& active_kernels() {
  return *kernel_table(static_cast<zf_simd_level>(state().active.load(std::memory_order_relaxed)));
}

}  // namespace simd
}  // namespace zf

using zf::simd::state;

extern "C" {

ZF_API zf_simd_level zf_simd_level_supported(void) { return state().supported; }

ZF_API zf_simd_level zf_simd_level_active(void) {
  return static_cast<zf_simd_level>(state().active.load(std::memory_order_relaxed));
}

ZF_API zf_status zf_set_simd_level(zf_simd_level level) {
  return zf::api_call([&] {
    zf::require(level >= ZF_SIMD_SCALAR && level <= ZF_SIMD_AVX512, ZF_ERROR_INVALID_VALUE,
                "level: unknown SIMD level ", static_cast<int>(level));
    zf::require(level <= state().supported, ZF_ERROR_INVALID_VALUE, "level: ", zf_simd_level_name(level),
                " is not supported by this CPU (highest: ", zf_simd_level_name(state().supported), ")");
    state().active.store(level, std::memory_order_relaxed);
  });
}

ZF_API const char* zf_simd_level_name(zf_simd_level level) {
  switch (level) {
    case ZF_SIMD_SCALAR:
      return "scalar";
    case ZF_SIMD_AVX2:
      return "avx2";
    case ZF_SIMD_AVX512:
      return "avx512";
  }
  return "unknown";
}

}  // extern "C"
