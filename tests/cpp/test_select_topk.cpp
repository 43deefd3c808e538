// zf_select_topk_columns on the host: against a brute-force reference, with ties,
// infinities, k = 0 and k = n, every thread count; NaN and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "test_util.hpp"

namespace {

// Reference: a full stable sort by score descending keeps the lower index first on ties.
std::vector<int32_t> reference_topk(const std::vector<float>& scores, int64_t k) {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<std::vector<int32_t>> run_topk(std::vector<std::vector<float>>& scores, const std::vector<int64_t>& ks) {
  std::vector<std::vector<int32_t>> out(scores.size());
  std::vector<zf_tensor> in_t, out_t;
  for (size_t i = 0; i < scores.size(); ++i) {
    out[i].assign(static_cast<size_t>(ks[i]), -99);  // poison
    in_t.push_back(
        zenflow::contiguous_tensor(scores[i].data(), ZF_DTYPE_F32, {static_cast<int64_t>(scores[i].size())}));
    out_t.push_back(zenflow::contiguous_tensor(out[i].data(), ZF_DTYPE_I32, {ks[i]}));
  }
  zenflow::select_topk_columns(in_t, out_t);
  return out;
}

TEST(SelectTopk, MatchesReferenceOnRandomTiedAndInfiniteScores) {
  std::mt19937_64 rng(42);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 2, 7, 13, 257, 1000, 4099}) {
    for (int pattern = 0; pattern < 4; ++pattern) {
      std::vector<float> scores(static_cast<size_t>(n));
      std::uniform_int_distribution<int> few(0, 3);
      std::exponential_distribution<float> exponential(1.0f);
      for (auto& s : scores) {
        if (pattern == 0) s = exponential(rng);              // distinct
        if (pattern == 1) s = static_cast<float>(few(rng));  // heavy ties
        if (pattern == 2) s = 2.5f;                          // all equal
        if (pattern == 3) s = few(rng) == 0 ? inf : exponential(rng);
      }
      for (int64_t k : std::vector<int64_t>{0, 1, n / 10, n / 2, n - 1, n}) {
        if (k < 0) continue;
        std::vector<std::vector<float>> in{scores};
        const auto got = run_topk(in, {k});
        EXPECT_EQ(got[0], reference_topk(scores, k)) << "n=" << n << " k=" << k << " pattern=" << pattern;
      }
    }
  }
}

TEST(SelectTopk, ManyMatricesIdenticalOnEveryThreadCount) {
  std::mt19937_64 rng(7);
  std::vector<std::vector<float>> scores;
  std::vector<int64_t> ks;
  std::uniform_int_distribution<int> level(0, 5);
  for (int i = 0; i < 37; ++i) {
    std::vector<float> s(static_cast<size_t>(50 + 31 * i));
    for (auto& v : s) v = static_cast<float>(level(rng));
    ks.push_back(static_cast<int64_t>(s.size()) / 10);
    scores.push_back(std::move(s));
  }
  const auto reference = run_topk(scores, ks);
  for (size_t i = 0; i < scores.size(); ++i) EXPECT_EQ(reference[i], reference_topk(scores[i], ks[i]));
  for (int threads : {1, 2, 3, 8}) {
    zenflow::ScopedNumThreads pool(threads);
    EXPECT_EQ(run_topk(scores, ks), reference) << threads << " threads";
  }
}

TEST(SelectTopk, EmptyVectorAndEmptyList) {
  std::vector<std::vector<float>> scores{{}};
  EXPECT_TRUE(run_topk(scores, {0})[0].empty());
  std::vector<std::vector<float>> none;
  EXPECT_TRUE(run_topk(none, {}).empty());
}

TEST(SelectTopk, NanFailsAndWritesNothing) {
  std::vector<float> good{3, 1, 2}, bad{1, std::numeric_limits<float>::quiet_NaN(), 0};
  std::vector<int32_t> out_good(2, -99), out_bad(2, -99);
  const zf_tensor in[2] = {zenflow::contiguous_tensor(good.data(), ZF_DTYPE_F32, {3}),
                           zenflow::contiguous_tensor(bad.data(), ZF_DTYPE_F32, {3})};
  const zf_tensor out[2] = {zenflow::contiguous_tensor(out_good.data(), ZF_DTYPE_I32, {2}),
                            zenflow::contiguous_tensor(out_bad.data(), ZF_DTYPE_I32, {2})};
  EXPECT_EQ(zf_select_topk_columns(in, out, 2, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("col_sq[1]"), std::string::npos) << zf_last_error();
  EXPECT_EQ(out_good, std::vector<int32_t>(2, -99));
  EXPECT_EQ(out_bad, std::vector<int32_t>(2, -99));
}

TEST(SelectTopk, BadInputIsRejected) {
  std::vector<float> scores{3, 1, 2};
  std::vector<int32_t> out(4, -99);
  zf_tensor in = zenflow::contiguous_tensor(scores.data(), ZF_DTYPE_F32, {3});
  zf_tensor picked = zenflow::contiguous_tensor(out.data(), ZF_DTYPE_I32, {4});
  EXPECT_EQ(zf_select_topk_columns(&in, &picked, 1, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("k=4"), std::string::npos);
  picked.shape[0] = 2;
  picked.dtype = ZF_DTYPE_I64;
  EXPECT_EQ(zf_select_topk_columns(&in, &picked, 1, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_TYPE);
  picked.dtype = ZF_DTYPE_I32;
  in.dtype = ZF_DTYPE_BF16;
  EXPECT_EQ(zf_select_topk_columns(&in, &picked, 1, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_TYPE);
  in.dtype = ZF_DTYPE_F32;
  in.strides[0] = 2;
  in.shape[0] = 1;  // a size-1 dimension may have any stride
  EXPECT_EQ(zf_select_topk_columns(&in, &picked, 1, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);  // k=2 > n=1
  in.shape[0] = 3;
  EXPECT_EQ(zf_select_topk_columns(&in, &picked, 1, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("contiguous"), std::string::npos);
  EXPECT_EQ(out, std::vector<int32_t>(4, -99));
}

}  // namespace
