// zf_column_stats on the host against a float64 reference, across dtypes, shapes, SIMD
// levels and thread counts; bitwise determinism; bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "test_util.hpp"

namespace {

using zf_test::HostMatrix;

struct Stats {
  std::vector<std::vector<float>> col_sq;
  float total = std::numeric_limits<float>::quiet_NaN();
  int32_t nonfinite = -7;
};

// Outputs start poisoned (NaN / -7) so an element the op forgets to write shows up.
Stats run_column_stats(std::vector<HostMatrix>& matrices, uint32_t flags = 0, Stats* start = nullptr) {
  Stats stats = start ? *start : Stats{};
  std::vector<zf_tensor> grads, outs;
  if (!start) stats.col_sq.resize(matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    if (!start) stats.col_sq[i].assign(static_cast<size_t>(matrices[i].cols), std::numeric_limits<float>::quiet_NaN());
    grads.push_back(matrices[i].tensor());
    outs.push_back(zenflow::contiguous_tensor(stats.col_sq[i].data(), ZF_DTYPE_F32, {matrices[i].cols}));
  }
  const zf_tensor total = zenflow::contiguous_tensor(&stats.total, ZF_DTYPE_F32, {});
  const zf_tensor flag = zenflow::contiguous_tensor(&stats.nonfinite, ZF_DTYPE_I32, {});
  zenflow::column_stats(grads, outs, total, flag, flags);
  return stats;
}

void expect_matches_reference(const std::vector<HostMatrix>& matrices, const Stats& stats) {
  double total = 0.0;
  for (size_t i = 0; i < matrices.size(); ++i) {
    const HostMatrix& m = matrices[i];
    for (int64_t j = 0; j < m.cols; ++j) {
      double expected = 0.0;
      for (int64_t r = 0; r < m.rows; ++r) expected += m.values[r * m.cols + j] * m.values[r * m.cols + j];
      total += expected;
      const double got = stats.col_sq[i][static_cast<size_t>(j)];
      // fp64 accumulation then one rounding to fp32: within half an fp32 ulp, well under 1e-6.
      ASSERT_LE(std::fabs(got - expected), 1e-6 * expected + 1e-30)
          << "matrix " << i << " column " << j << " shape [" << m.rows << ", " << m.cols << "]";
    }
  }
  EXPECT_LE(std::fabs(stats.total - total), 1e-6 * total + 1e-30);
  EXPECT_EQ(stats.nonfinite, 0);
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},    {1, 4099}, {4099, 1},  {7, 13},
                                                          {31, 17},  {97, 256}, {257, 263}, {16, 1024},
                                                          {1000, 5}, {3, 0},    {0, 5},     {0, 0}};

class ColumnStatsSweep : public ::testing::TestWithParam<std::tuple<zf_dtype, zf_simd_level>> {};

TEST_P(ColumnStatsSweep, MatchesFloat64ReferenceOnEveryShape) {
  const auto [dtype, level] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(1234 + dtype * 7 + level);
  for (const auto& [rows, cols] : kShapes) {
    std::vector<HostMatrix> one{zf_test::random_matrix(dtype, rows, cols, rng)};
    expect_matches_reference(one, run_column_stats(one));
  }
  // The whole list in one call.
  std::vector<HostMatrix> all;
  for (const auto& [rows, cols] : kShapes) all.push_back(zf_test::random_matrix(dtype, rows, cols, rng, 3.0));
  expect_matches_reference(all, run_column_stats(all));
}

INSTANTIATE_TEST_SUITE_P(DtypesAndLevels, ColumnStatsSweep,
                         ::testing::Combine(::testing::Values(ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16),
                                            ::testing::Values(ZF_SIMD_SCALAR, ZF_SIMD_AVX2, ZF_SIMD_AVX512)));

TEST(ColumnStats, BitwiseIdenticalAcrossThreadCountsAndLevels) {
  std::mt19937_64 rng(99);
  std::vector<HostMatrix> matrices;
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{513, 1031}, {64, 4096}, {2000, 3}}) {
    matrices.push_back(zf_test::random_matrix(ZF_DTYPE_BF16, rows, cols, rng));
  }
  const Stats reference = run_column_stats(matrices);
  for (int threads : {1, 2, 3, 5}) {
    zenflow::ScopedNumThreads pool(threads);
    for (zf_simd_level level : zenflow::supported_simd_levels()) {
      zenflow::ScopedSimdLevel simd(level);
      const Stats again = run_column_stats(matrices);
      EXPECT_EQ(again.col_sq, reference.col_sq) << threads << " threads, " << zf_simd_level_name(level);
      EXPECT_EQ(std::memcmp(&again.total, &reference.total, sizeof(float)), 0);
    }
  }
}

TEST(ColumnStats, FlagsNonFiniteAndPropagates) {
  std::mt19937_64 rng(5);
  for (zf_dtype dtype : {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16}) {
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<HostMatrix> matrices{zf_test::random_matrix(dtype, 33, 40, rng),
                                       zf_test::random_matrix(dtype, 9, 17, rng)};
      matrices[1].set(5 * 17 + 16, bad);  // in the scalar tail
      const Stats stats = run_column_stats(matrices);
      EXPECT_EQ(stats.nonfinite, 1);
      EXPECT_FALSE(std::isfinite(stats.col_sq[1][16]));
      EXPECT_TRUE(std::isfinite(stats.col_sq[1][15]));
      EXPECT_FALSE(std::isfinite(stats.total));
    }
  }
}

// Finite values near 1e18 and above: their squares overflow fp32 sums (within the host's
// 8-row blocks, and the fp32 outputs), never fp64 ones. The flag follows the elements, so
// it stays clear, as on the device (which sums in fp64 throughout); a single Inf or NaN
// among them still sets it. Sums compare with float64 rounded once to fp32 (+Inf when
// beyond the fp32 range).
TEST(ColumnStats, LargeFiniteValuesLeaveTheFlagClear) {
  std::mt19937_64 rng(17);
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    for (zf_dtype dtype : {ZF_DTYPE_F32, ZF_DTYPE_BF16}) {  // f16 cannot hold 1e18
      for (float large : {1e18f, 1.2e18f, 3e19f, 3e38f}) {
        // 2053 rows: whole 8-row blocks plus a tail; 19 columns: SIMD lanes plus a scalar tail.
        std::vector<HostMatrix> matrices{zf_test::random_matrix(dtype, 2053, 19, rng),
                                         zf_test::random_matrix(dtype, 5, 3, rng)};
        HostMatrix& m = matrices[0];
        for (int64_t r = 0; r < m.rows; ++r) {
          for (int64_t j = 0; j < 12; ++j) m.set(r * m.cols + j, (r + j) % 3 == 0 ? -large : large);
        }
        m.set(7 * m.cols + 17, large);  // one large value in the scalar tail
        const Stats stats = run_column_stats(matrices);
        EXPECT_EQ(stats.nonfinite, 0) << zf_simd_level_name(level) << " dtype " << dtype << " value " << large;
        double total = 0.0;
        for (size_t i = 0; i < matrices.size(); ++i) {
          const HostMatrix& mi = matrices[i];
          for (int64_t j = 0; j < mi.cols; ++j) {
            double expected = 0.0;
            for (int64_t r = 0; r < mi.rows; ++r) expected += mi.values[r * mi.cols + j] * mi.values[r * mi.cols + j];
            total += expected;
            const float rounded = static_cast<float>(expected);
            const float got = stats.col_sq[i][static_cast<size_t>(j)];
            if (std::isinf(rounded)) {
              EXPECT_EQ(got, rounded) << "matrix " << i << " column " << j << " value " << large;
            } else {
              EXPECT_LE(std::fabs(got - expected), 1e-6 * expected) << "matrix " << i << " column " << j;
            }
          }
        }
        EXPECT_EQ(stats.total, static_cast<float>(total));  // beyond fp32: +Inf on both sides
        ASSERT_TRUE(std::isinf(stats.total));

        for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
          std::vector<HostMatrix> with_bad = matrices;
          with_bad[1].set(4 * 3 + 2, bad);  // last element of the last matrix
          EXPECT_EQ(run_column_stats(with_bad).nonfinite, 1) << "value " << large << " with " << bad;
        }
      }
    }
  }
}

TEST(ColumnStats, AccumulateAddsIntoExistingScores) {
  std::mt19937_64 rng(8);
  std::vector<HostMatrix> matrices{zf_test::random_matrix(ZF_DTYPE_F32, 20, 37, rng)};
  Stats first = run_column_stats(matrices);
  const Stats once = first;
  Stats twice = run_column_stats(matrices, ZF_COLUMN_STATS_ACCUMULATE, &first);
  for (size_t j = 0; j < 37; ++j) EXPECT_NEAR(twice.col_sq[0][j], 2.0f * once.col_sq[0][j], 1e-6f * once.col_sq[0][j]);
  EXPECT_FLOAT_EQ(twice.total, once.total);  // the total is this call's gradients only
}

TEST(ColumnStats, EmptyListGivesZeroTotal) {
  std::vector<HostMatrix> none;
  const Stats stats = run_column_stats(none);
  EXPECT_EQ(stats.total, 0.0f);
  EXPECT_EQ(stats.nonfinite, 0);
}

// Every bad call returns the right status, names the argument, and writes nothing.
TEST(ColumnStats, BadInputIsRejectedAndWritesNothing) {
  std::mt19937_64 rng(3);
  HostMatrix good = zf_test::random_matrix(ZF_DTYPE_F32, 4, 6, rng);
  HostMatrix other = zf_test::random_matrix(ZF_DTYPE_F32, 4, 6, rng);
  std::vector<float> out(6, -1.0f), out2(6, -1.0f);
  float total = -1.0f;
  int32_t flag = -1;
  const zf_tensor total_t = zenflow::contiguous_tensor(&total, ZF_DTYPE_F32, {1});
  const zf_tensor flag_t = zenflow::contiguous_tensor(&flag, ZF_DTYPE_I32, {1});

  struct Case {
    const char* what;
    zf_status status;
    const char* names;
    std::function<void(zf_tensor&, zf_tensor&, zf_tensor&, zf_tensor&)> corrupt;
  };
  const std::vector<Case> cases = {
      {"int dtype", ZF_ERROR_INVALID_TYPE, "grads[1]",
       [](zf_tensor&, zf_tensor& g, zf_tensor&, zf_tensor&) { g.dtype = ZF_DTYPE_I32; }},
      {"1-D grad", ZF_ERROR_INVALID_VALUE, "grads[1]",
       [](zf_tensor&, zf_tensor& g, zf_tensor&, zf_tensor&) {
         g.ndim = 1;
         g.shape[0] = 24;
         g.strides[0] = 1;
       }},
      {"transposed", ZF_ERROR_INVALID_VALUE, "grads[1]",
       [](zf_tensor&, zf_tensor& g, zf_tensor&, zf_tensor&) {
         std::swap(g.shape[0], g.shape[1]);
         g.strides[0] = 1;
         g.strides[1] = 6;
       }},
      {"misaligned", ZF_ERROR_INVALID_VALUE, "grads[1]",
       [](zf_tensor&, zf_tensor& g, zf_tensor&, zf_tensor&) { g.data = static_cast<char*>(g.data) + 1; }},
      {"wrong out length", ZF_ERROR_INVALID_VALUE, "out_col_sq[1]",
       [](zf_tensor&, zf_tensor&, zf_tensor&, zf_tensor& o) { o.shape[0] = 5; }},
      {"f16 out", ZF_ERROR_INVALID_TYPE, "out_col_sq[1]",
       [](zf_tensor&, zf_tensor&, zf_tensor&, zf_tensor& o) { o.dtype = ZF_DTYPE_F16; }},
      {"cuda out", ZF_ERROR_INVALID_TYPE, "out_col_sq[1]",
       [](zf_tensor&, zf_tensor&, zf_tensor&, zf_tensor& o) { o.device = zenflow::cuda_device(0); }},
      {"null data", ZF_ERROR_INVALID_VALUE, "grads[1]",
       [](zf_tensor&, zf_tensor& g, zf_tensor&, zf_tensor&) { g.data = nullptr; }},
      {"negative size", ZF_ERROR_INVALID_VALUE, "grads[1]",
       [](zf_tensor&, zf_tensor& g, zf_tensor&, zf_tensor&) { g.shape[0] = -4; }},
  };
  for (const Case& c : cases) {
    zf_tensor grads[2] = {good.tensor(), other.tensor()};
    zf_tensor outs[2] = {zenflow::contiguous_tensor(out.data(), ZF_DTYPE_F32, {6}),
                         zenflow::contiguous_tensor(out2.data(), ZF_DTYPE_F32, {6})};
    c.corrupt(grads[0], grads[1], outs[0], outs[1]);
    const zf_status status = zf_column_stats(grads, outs, 2, &total_t, &flag_t, 0, nullptr, nullptr, nullptr);
    EXPECT_EQ(status, c.status) << c.what;
    EXPECT_NE(std::string(zf_last_error()).find(c.names), std::string::npos) << c.what << ": " << zf_last_error();
    EXPECT_EQ(out, std::vector<float>(6, -1.0f)) << c.what;
    EXPECT_EQ(out2, std::vector<float>(6, -1.0f)) << c.what;
    EXPECT_EQ(total, -1.0f) << c.what;
    EXPECT_EQ(flag, -1) << c.what;
  }
  zf_tensor grads[1] = {good.tensor()};
  zf_tensor outs[1] = {zenflow::contiguous_tensor(out.data(), ZF_DTYPE_F32, {6})};
  EXPECT_EQ(zf_column_stats(grads, outs, 1, &total_t, &flag_t, 8u, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  zf_tensor bad_total = total_t;
  bad_total.shape[0] = 2;
  EXPECT_EQ(zf_column_stats(grads, outs, 1, &bad_total, &flag_t, 0, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("total_sq"), std::string::npos);
  EXPECT_EQ(out, std::vector<float>(6, -1.0f));
}

}  // namespace
