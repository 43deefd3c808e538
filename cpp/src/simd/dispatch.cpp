// Picks the SIMD level once, at first use, from cpuid (and ZENFLOW_SIMD).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "common/error.hpp"
#include "simd/kernels.hpp"

#if defined(ZENFLOW_HAVE_X86_SIMD)
#include <cpuid.h>
#endif

namespace zf {
namespace simd {

namespace {

#if defined(ZENFLOW_HAVE_X86_SIMD)
// F16C from cpuid leaf 1 (ECX bit 29): Clang before 15 has no "f16c" for
// __builtin_cpu_supports. It uses the AVX state, which the avx2 / avx512 checks cover.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}
#endif

zf_simd_level detect_supported_level() {
#if defined(ZENFLOW_HAVE_X86_SIMD)
  // __builtin_cpu_supports also checks XCR0, i.e. that the OS saves the wider registers.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") && cpu_has_f16c()) {
    return ZF_SIMD_AVX512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) {
    return ZF_SIMD_AVX2;
  }
#endif
  return ZF_SIMD_SCALAR;
}

const char* level_name(zf_simd_level level) {
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

struct State {
  zf_simd_level supported;
  std::string environment_warning;
  std::atomic<int> active;
  State() : supported(detect_supported_level()), active(ZF_SIMD_SCALAR) {
    EnvironmentLevel chosen = level_from_environment_value(std::getenv("ZENFLOW_SIMD"), supported);
    environment_warning = std::move(chosen.warning);
    active.store(chosen.level, std::memory_order_relaxed);
    // A misspelt variable must not go unnoticed: the run would silently use another level.
    if (!environment_warning.empty()) std::fprintf(stderr, "zenflow: %s\n", environment_warning.c_str());
  }
};

State& state() {
  static State instance;
  return instance;
}

}  // namespace

EnvironmentLevel level_from_environment_value(const char* requested, zf_simd_level supported) {
  if (requested == nullptr || requested[0] == '\0') return {supported, ""};
  zf_simd_level level;
  if (std::strcmp(requested, "scalar") == 0) {
    level = ZF_SIMD_SCALAR;
  } else if (std::strcmp(requested, "avx2") == 0) {
    level = ZF_SIMD_AVX2;
  } else if (std::strcmp(requested, "avx512") == 0) {
    level = ZF_SIMD_AVX512;
  } else {
    return {supported, std::string("ZENFLOW_SIMD='") + requested + "' is not one of avx512, avx2, scalar; using " +
                           level_name(supported)};
  }
  // The variable can only lower the level: asking for more than the CPU has would crash.
  if (level > supported) {
    return {supported, std::string("ZENFLOW_SIMD='") + requested + "' is above what this CPU supports; using " +
                           level_name(supported)};
  }
  return {level, ""};
}

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

ZF_API const char* zf_simd_environment_warning(void) { return state().environment_warning.c_str(); }

namespace {
// The value a caller passed, read as the integer it is: a C caller may pass any int, and
// converting one outside the enumerators to zf_simd_level in C++ is undefined, so the range
// is checked on the raw bits before the value is used as the enum. By reference: a copy of
// the parameter would itself load it as the enum (Clang's -fsanitize=enum reports that load).
int raw_level_value(const zf_simd_level& level) {
  static_assert(sizeof(zf_simd_level) == sizeof(int), "zf_simd_level is passed as an int by the C ABI");
  int raw;
  std::memcpy(&raw, &level, sizeof(raw));
  return raw;
}
bool is_known_level(int raw) { return raw >= ZF_SIMD_SCALAR && raw <= ZF_SIMD_AVX512; }
}  // namespace

ZF_API zf_status zf_set_simd_level(zf_simd_level level) {
  const int raw = raw_level_value(level);
  return zf::api_call([&] {
    zf::require(is_known_level(raw), ZF_ERROR_INVALID_VALUE, "level: unknown SIMD level ", raw,
                " (expected 0 scalar, 1 avx2 or 2 avx512)");
    const zf_simd_level known = static_cast<zf_simd_level>(raw);
    zf::require(known <= state().supported, ZF_ERROR_INVALID_VALUE, "level: ", zf::simd::level_name(known),
                " is not supported by this CPU (highest: ", zf::simd::level_name(state().supported), ")");
    state().active.store(known, std::memory_order_relaxed);
  });
}

ZF_API const char* zf_simd_level_name(zf_simd_level level) {
  const int raw = raw_level_value(level);
  return is_known_level(raw) ? zf::simd::level_name(static_cast<zf_simd_level>(raw)) : "unknown";
}

}  // extern "C"
