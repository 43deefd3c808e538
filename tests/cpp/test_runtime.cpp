// Thread pool, SIMD dispatch, conversions and runtime queries.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/float_convert.hpp"
#include "common/thread_pool.hpp"
#include "simd/kernels.hpp"
#include "test_util.hpp"

namespace {

TEST(ThreadPool, RunsEveryIndexOnce) {
  for (int threads : {1, 2, 4, 7}) {
    zf::ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(static_cast<size_t>(threads));
    for (int round = 0; round < 50; ++round) {
      pool.run([&](int index, int count) {
        ASSERT_EQ(count, threads);
        hits[static_cast<size_t>(index)]++;
      });
    }
    for (auto& h : hits) EXPECT_EQ(h.load(), 50);
  }
}

TEST(ThreadPool, WorkerExceptionReachesCallerAndPoolStaysUsable) {
  zf::ThreadPool pool(3);
  EXPECT_THROW(pool.run([](int index, int) {
    if (index == 2) throw std::runtime_error("worker 2 failed");
  }),
               std::runtime_error);
  try {
    pool.run([](int index, int) {
      if (index >= 1) throw std::invalid_argument("worker " + std::to_string(index));
    });
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "worker 1");  // the lowest failing index wins, deterministically
  }
  std::atomic<int> ran{0};
  pool.run([&](int, int) { ran++; });
  EXPECT_EQ(ran.load(), 3);
}

TEST(ThreadPool, PinnedPoolRuns) {
  zf::ThreadPool pool(2, {0});
  std::atomic<int> ran{0};
  pool.run([&](int, int) { ran++; });
  EXPECT_EQ(ran.load(), 2);
}

TEST(ThreadPool, SplitRangeCoversEverythingOnce) {
  for (int parts : {1, 2, 3, 8}) {
    for (int64_t total : {0, 1, 7, 100, 1001}) {
      int64_t expected_begin = 0;
      for (int p = 0; p < parts; ++p) {
        int64_t b, e;
        zf::split_range(0, total, p, parts, &b, &e);
        EXPECT_EQ(b, expected_begin);
        EXPECT_LE(e - b, total / parts + 1);
        expected_begin = e;
      }
      EXPECT_EQ(expected_begin, total);
    }
  }
}

// Resizing the pool while another thread runs kernels on it neither crashes nor hangs:
// the running kernel keeps its pool alive until it is done.
TEST(ThreadPool, ResizeWhileKernelsRun) {
  const int before = zf_get_num_threads();
  const int runs = zf_test::regions_run_during([] {
    for (int i = 0; i < 200; ++i) ASSERT_EQ(zf_set_num_threads(1 + i % 3, nullptr, 0), ZF_SUCCESS);
  });
  EXPECT_GT(runs, 0);
  zf_set_num_threads(before, nullptr, 0);
}

TEST(Runtime, ThreadCountControl) {
  const int before = zf_get_num_threads();
  EXPECT_GE(before, 1);
  {
    zenflow::ScopedNumThreads pool(3);
    EXPECT_EQ(zf_get_num_threads(), 3);
  }
  EXPECT_EQ(zf_get_num_threads(), before);
  EXPECT_EQ(zf_set_num_threads(0, nullptr, 0), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("num_threads"), std::string::npos);
  const int bad_core = -1;
  EXPECT_EQ(zf_set_num_threads(2, &bad_core, 1), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_get_num_threads(), before);
}

TEST(Runtime, SimdLevelControl) {
  EXPECT_LE(zf_simd_level_active(), zf_simd_level_supported());
  for (zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel scoped(level);
    EXPECT_EQ(zf_simd_level_active(), level);
  }
  if (zf_simd_level_supported() < ZF_SIMD_AVX512) {
    EXPECT_EQ(zf_set_simd_level(ZF_SIMD_AVX512), ZF_ERROR_INVALID_VALUE);
  }
  EXPECT_EQ(zf_set_simd_level(static_cast<zf_simd_level>(9)), ZF_ERROR_INVALID_VALUE);
}

// More threads than max(64, 4 x cores) can only oversubscribe: rejected with a message that
// names the argument, and the pool is unchanged.
TEST(Runtime, NumThreadsHasAnUpperBound) {
  const int before = zf_get_num_threads();
  const int bound = std::max(64, 4 * zf_host_cpu_count());
  for (int too_many : {bound + 1, std::max(1000, bound + 1)}) {
    EXPECT_EQ(zf_set_num_threads(too_many, nullptr, 0), ZF_ERROR_INVALID_VALUE);
    const std::string message = zf_last_error();
    EXPECT_NE(message.find("num_threads: must be in [1, " + std::to_string(bound) + "]"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(too_many)), std::string::npos) << message;
    EXPECT_EQ(zf_get_num_threads(), before);
  }
  {
    zenflow::ScopedNumThreads largest(bound);
    EXPECT_EQ(zf_get_num_threads(), bound);
  }
  EXPECT_EQ(zf_get_num_threads(), before);
}

// Calls as a C caller, for whom any int is a zf_simd_level. The value is built from its bytes
// (a cast to the enum would itself be undefined in C++), and Clang's enum check is off here:
// passing it by value loads it as the enum, in this C++ caller only.
#if defined(__clang__)
__attribute__((no_sanitize("enum")))
#endif
std::pair<zf_status, std::string>
set_and_name_level_as_c_caller(int raw) {
  zf_simd_level bogus;
  static_assert(sizeof(bogus) == sizeof(raw), "zf_simd_level is an int");
  std::memcpy(&bogus, &raw, sizeof(raw));
  const zf_status status = zf_set_simd_level(bogus);
  return {status, zf_simd_level_name(bogus)};
}

// A level outside the enumerators (as a C caller may pass) is rejected by value, naming
// `level`, and has no name.
TEST(Runtime, UnknownSimdLevelIsRejected) {
  for (int raw : {9, -1, 3}) {
    const zf_simd_level active = zf_simd_level_active();
    const auto [status, name] = set_and_name_level_as_c_caller(raw);
    EXPECT_EQ(status, ZF_ERROR_INVALID_VALUE);
    EXPECT_NE(std::string(zf_last_error()).find("level: unknown SIMD level " + std::to_string(raw)), std::string::npos)
        << zf_last_error();
    EXPECT_EQ(zf_simd_level_active(), active);
    EXPECT_EQ(name, "unknown");
  }
  EXPECT_STREQ(zf_simd_level_name(ZF_SIMD_AVX2), "avx2");
}

// ZENFLOW_SIMD: honoured when it names a level the CPU has; otherwise the supported level,
// with a warning that says what was asked and what is used.
TEST(Runtime, SimdEnvironmentValue) {
  using zf::simd::level_from_environment_value;
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const auto chosen = level_from_environment_value(unset, ZF_SIMD_AVX2);
    EXPECT_EQ(chosen.level, ZF_SIMD_AVX2);
    EXPECT_EQ(chosen.warning, "");
  }
  EXPECT_EQ(level_from_environment_value("scalar", ZF_SIMD_AVX512).level, ZF_SIMD_SCALAR);
  EXPECT_EQ(level_from_environment_value("avx2", ZF_SIMD_AVX512).level, ZF_SIMD_AVX2);
  EXPECT_EQ(level_from_environment_value("avx512", ZF_SIMD_AVX512).level, ZF_SIMD_AVX512);
  EXPECT_EQ(level_from_environment_value("avx2", ZF_SIMD_AVX512).warning, "");

  const auto bogus = level_from_environment_value("bogus", ZF_SIMD_AVX512);
  EXPECT_EQ(bogus.level, ZF_SIMD_AVX512);
  EXPECT_EQ(bogus.warning, "ZENFLOW_SIMD='bogus' is not one of avx512, avx2, scalar; using avx512");
  EXPECT_EQ(level_from_environment_value("AVX2", ZF_SIMD_AVX2).warning,
            "ZENFLOW_SIMD='AVX2' is not one of avx512, avx2, scalar; using avx2");

  const auto above = level_from_environment_value("avx512", ZF_SIMD_AVX2);
  EXPECT_EQ(above.level, ZF_SIMD_AVX2);
  EXPECT_EQ(above.warning, "ZENFLOW_SIMD='avx512' is above what this CPU supports; using avx2");

  const char* requested = std::getenv("ZENFLOW_SIMD");
  EXPECT_EQ(std::string(zf_simd_environment_warning()),
            level_from_environment_value(requested, zf_simd_level_supported()).warning);
}

TEST(Runtime, CudaQueriesNeverFail) {
  EXPECT_GE(zf_cuda_device_count(), 0);
  char name[64];
  if (zf_cuda_device_count() == 0) EXPECT_EQ(zf_cuda_device_name(0, name, sizeof(name)), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_cuda_compiled() != 0, std::strlen(zf_cuda_architectures()) > 0);
}

TEST(Runtime, ErrorTextIsPerThreadAndCleared) {
  EXPECT_EQ(zf_set_num_threads(-5, nullptr, 0), ZF_ERROR_INVALID_VALUE);
  std::string other_thread_text = "unset";
  std::thread([&] { other_thread_text = zf_last_error(); }).join();
  EXPECT_EQ(other_thread_text, "");
  EXPECT_NE(std::string(zf_last_error()), "");
  EXPECT_EQ(zf_set_simd_level(ZF_SIMD_SCALAR), ZF_SUCCESS);
  EXPECT_EQ(std::string(zf_last_error()), "");
  zf_set_simd_level(zf_simd_level_supported());
}

TEST(FloatConvert, Bf16RoundsToNearestEven) {
  EXPECT_EQ(zf::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(zf::f32_to_bf16(zf::f32_from_bits(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(zf::f32_to_bf16(zf::f32_from_bits(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(zf::f32_to_bf16(zf::f32_from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(zf::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(zf::bf16_to_f32(zf::f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(zf::f32_to_bf16(zf::f32_from_bits(0x7f7fffffu)), 0x7f80);  // max float rounds to Inf
}

TEST(FloatConvert, F16RoundTripAndRounding) {
  // Every finite half converts to float and back exactly.
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;  // NaN payloads
    EXPECT_EQ(zf::f32_to_f16(zf::f16_to_f32(h)), h) << std::hex << bits;
  }
  EXPECT_EQ(zf::f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(zf::f32_to_f16(65520.0f), 0x7c00);               // halfway to the next binade: rounds to Inf
  EXPECT_EQ(zf::f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);  // tie -> even
  EXPECT_EQ(zf::f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(zf::f32_to_f16(2.9802322e-8f), 0x0000);          // exactly half the smallest subnormal -> even (0)
  EXPECT_EQ(zf::f32_to_f16(4.4703484e-8f), 0x0001);          // 0.75 of the smallest subnormal -> 1
  EXPECT_EQ(zf::f16_to_f32(0x0001), 5.9604644775390625e-8f);
}

}  // namespace
