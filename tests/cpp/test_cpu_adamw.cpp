// The host optimizer (zenflow/cpu_adam.h): every SIMD level against the scalar definition
// (common/adam_math.hpp) bit for bit, a float64 reference over 20 steps, bitwise
// determinism across thread counts, selected-column skipping, the accumulator, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include "common/adam_math.hpp"
#include "test_util.hpp"

namespace {

using zenflow::contiguous_tensor;

const zf_simd_level kLevels[] = {ZF_SIMD_SCALAR, ZF_SIMD_AVX2, ZF_SIMD_AVX512};
const zf_dtype kFloatTypes[] = {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16};

float narrow(float value, zf_dtype dtype) {
  if (dtype == ZF_DTYPE_BF16) return zf::bf16_to_f32(zf::f32_to_bf16(value));
  if (dtype == ZF_DTYPE_F16) return zf::f16_to_f32(zf::f32_to_f16(value));
  return value;
}

// A buffer of f32, bf16 or f16 elements.
struct Buffer {
  zf_dtype dtype = ZF_DTYPE_F32;
  std::vector<float> f32;
  std::vector<uint16_t> half;

  Buffer() = default;
  Buffer(zf_dtype d, size_t n) : dtype(d) {
    if (d == ZF_DTYPE_F32) {
      f32.assign(n, 0.0f);
    } else {
      half.assign(n, 0);
    }
  }
  size_t size() const { return dtype == ZF_DTYPE_F32 ? f32.size() : half.size(); }
  void* data() { return dtype == ZF_DTYPE_F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(half.data()); }
  float get(size_t i) const {
    if (dtype == ZF_DTYPE_F32) return f32[i];
    return dtype == ZF_DTYPE_BF16 ? zf::bf16_to_f32(half[i]) : zf::f16_to_f32(half[i]);
  }
  void set(size_t i, float v) {
    if (dtype == ZF_DTYPE_F32) {
      f32[i] = v;
    } else {
      half[i] = dtype == ZF_DTYPE_BF16 ? zf::f32_to_bf16(v) : zf::f32_to_f16(v);
    }
  }
  bool bitwise_equal(const Buffer& other) const { return f32 == other.f32 && half == other.half; }
  zf_tensor tensor(std::vector<int64_t> shape) { return contiguous_tensor(data(), dtype, shape); }
  zf_tensor tensor() { return tensor({static_cast<int64_t>(size())}); }
};

struct AdamState {
  std::vector<float> param, exp_avg, exp_avg_sq;
  Buffer grad;
  bool operator==(const AdamState& o) const {
    return std::memcmp(param.data(), o.param.data(), param.size() * 4) == 0 &&
           std::memcmp(exp_avg.data(), o.exp_avg.data(), exp_avg.size() * 4) == 0 &&
           std::memcmp(exp_avg_sq.data(), o.exp_avg_sq.data(), exp_avg_sq.size() * 4) == 0 &&
           grad.bitwise_equal(o.grad);
  }
};

AdamState random_state(size_t n, zf_dtype grad_dtype, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AdamState s;
  s.param.resize(n);
  s.exp_avg.resize(n);
  s.exp_avg_sq.resize(n);
  s.grad = Buffer(grad_dtype, n);
  for (size_t i = 0; i < n; ++i) {
    s.param[i] = normal(rng);
    s.exp_avg[i] = 0.1f * normal(rng);
    s.exp_avg_sq[i] = 0.01f * std::fabs(normal(rng));
    s.grad.set(i, normal(rng));
  }
  return s;
}

void refill_grad(AdamState& s, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < s.grad.size(); ++i) s.grad.set(i, normal(rng));
}

zf_adam_hparams hparams_for(zf_adam_mode mode) { return zenflow::adam_hparams(1e-2, 0.9, 0.999, 1e-8, 0.05, mode); }

// One call of zf_cpu_adamw_step on one tensor.
void step(AdamState& s, Buffer* out, int64_t step_count, const zf_adam_hparams& h, float grad_scale, uint32_t flags) {
  const int64_t n = static_cast<int64_t>(s.param.size());
  std::vector<zf_tensor> outs;
  if (out) outs.push_back(out->tensor());
  zenflow::cpu_adamw_step({contiguous_tensor(s.param.data(), ZF_DTYPE_F32, {n})},
                          {contiguous_tensor(s.exp_avg.data(), ZF_DTYPE_F32, {n})},
                          {contiguous_tensor(s.exp_avg_sq.data(), ZF_DTYPE_F32, {n})}, {s.grad.tensor()}, outs,
                          {step_count}, h, grad_scale, flags);
}

// The definition, element by element.
void step_reference(AdamState& s, int64_t step_count, const zf_adam_hparams& h, float grad_scale) {
  const zf::AdamStepScalars scalars = zf::adam_step_scalars(
      zf::AdamHyperParams{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.mode == ZF_ADAM_MODE_ADAMW}, step_count);
  for (size_t i = 0; i < s.param.size(); ++i) {
    zf::adam_update_element(s.param[i], s.exp_avg[i], s.exp_avg_sq[i], s.grad.get(i) * grad_scale, scalars);
  }
}

class CpuAdamLevels : public ::testing::TestWithParam<std::tuple<zf_simd_level, zf_dtype>> {};

TEST_P(CpuAdamLevels, MatchesScalarDefinitionBitForBit) {
  const auto [level, grad_dtype] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(17 + level * 3 + grad_dtype);
  for (const size_t n : {size_t{1}, size_t{7}, size_t{16}, size_t{17}, size_t{1000}, size_t{40099}}) {
    for (const zf_adam_mode mode : {ZF_ADAM_MODE_ADAMW, ZF_ADAM_MODE_ADAM}) {
      for (const int out_kind : {-1, int{ZF_DTYPE_F32}, int{ZF_DTYPE_BF16}, int{ZF_DTYPE_F16}}) {
        for (const bool zero_grad : {false, true}) {
          const zf_adam_hparams h = hparams_for(mode);
          AdamState state = random_state(n, grad_dtype, rng);
          AdamState expected = state;
          Buffer out(out_kind < 0 ? ZF_DTYPE_F32 : static_cast<zf_dtype>(out_kind), n);
          const float scale = 0.25f;
          step(state, out_kind < 0 ? nullptr : &out, 3, h, scale, zero_grad ? ZF_CPU_ADAM_ZERO_GRAD : 0u);
          step_reference(expected, 3, h, scale);
          if (zero_grad) expected.grad = Buffer(grad_dtype, n);
          ASSERT_TRUE(state == expected) << "n=" << n << " mode=" << mode << " out=" << out_kind
                                         << " zero_grad=" << zero_grad;
          if (out_kind >= 0) {
            for (size_t i = 0; i < n; ++i) {
              Buffer one(out.dtype, 1);
              one.set(0, state.param[i]);
              ASSERT_EQ(out.get(i), one.get(0)) << "upload copy, element " << i;
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuAdamLevels, TwentyStepsWithinFloat32RoundingOfFloat64) {
  const auto [level, grad_dtype] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(99 + level + grad_dtype);
  const size_t n = 1003;
  for (const zf_adam_mode mode : {ZF_ADAM_MODE_ADAMW, ZF_ADAM_MODE_ADAM}) {
    const zf_adam_hparams h = hparams_for(mode);
    AdamState state = random_state(n, grad_dtype, rng);
    std::fill(state.exp_avg.begin(), state.exp_avg.end(), 0.0f);
    std::fill(state.exp_avg_sq.begin(), state.exp_avg_sq.end(), 0.0f);
    std::vector<double> p(state.param.begin(), state.param.end()), m(n, 0.0), v(n, 0.0);
    for (int64_t t = 1; t <= 20; ++t) {
      refill_grad(state, rng);
      for (size_t i = 0; i < n; ++i) {
        double g = state.grad.get(i) * 0.5;
        if (mode == ZF_ADAM_MODE_ADAM) g += h.weight_decay * p[i];
        if (mode == ZF_ADAM_MODE_ADAMW) p[i] *= 1.0 - h.lr * h.weight_decay;
        m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
        v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
        const double denom = std::sqrt(v[i]) / std::sqrt(1.0 - std::pow(h.beta2, t)) + h.eps;
        p[i] -= h.lr / (1.0 - std::pow(h.beta1, t)) * m[i] / denom;
      }
      step(state, nullptr, t, h, 0.5f, 0);
    }
    for (size_t i = 0; i < n; ++i) {
      // A few ulps of |p| per step, plus float32 rounding of the ~lr-sized updates.
      const double tolerance = 20 * (4e-7 * std::fabs(p[i]) + 1e-6 * h.lr);
      ASSERT_NEAR(state.param[i], p[i], tolerance) << "element " << i << " mode " << mode;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LevelsAndGradTypes, CpuAdamLevels,
                         ::testing::Combine(::testing::ValuesIn(kLevels), ::testing::ValuesIn(kFloatTypes)));

TEST(CpuAdam, LevelsAgreeBitForBit) {
  std::mt19937_64 rng(5);
  const AdamState start = random_state(4099, ZF_DTYPE_BF16, rng);
  AdamState first;
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    AdamState state = start;
    Buffer out(ZF_DTYPE_BF16, state.param.size());
    step(state, &out, 7, hparams_for(ZF_ADAM_MODE_ADAMW), 1.0f, 0);
    if (level == ZF_SIMD_SCALAR) {
      first = state;
    } else {
      EXPECT_TRUE(state == first) << zf_simd_level_name(level);
    }
  }
}

TEST(CpuAdam, BitwiseIdenticalAcrossThreadCounts) {
  std::mt19937_64 rng(6);
  // Several tensors, enough elements to go parallel, lengths that are not multiples of 16.
  const std::vector<size_t> sizes = {1, 70001, 33, 150007};
  std::vector<AdamState> start;
  for (size_t n : sizes) start.push_back(random_state(n, ZF_DTYPE_F16, rng));
  std::vector<std::vector<AdamState>> results;
  for (const int threads : {1, 2, 3, 5}) {
    zenflow::ScopedNumThreads pool(threads);
    std::vector<AdamState> states = start;
    std::vector<zf_tensor> p, m, v, g;
    for (auto& s : states) {
      const int64_t n = static_cast<int64_t>(s.param.size());
      p.push_back(contiguous_tensor(s.param.data(), ZF_DTYPE_F32, {n}));
      m.push_back(contiguous_tensor(s.exp_avg.data(), ZF_DTYPE_F32, {n}));
      v.push_back(contiguous_tensor(s.exp_avg_sq.data(), ZF_DTYPE_F32, {n}));
      g.push_back(s.grad.tensor());
    }
    zenflow::cpu_adamw_step(p, m, v, g, {}, {1, 2, 3, 4}, hparams_for(ZF_ADAM_MODE_ADAM), 0.75f);
    results.push_back(states);
  }
  for (size_t r = 1; r < results.size(); ++r) {
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(results[r][i] == results[0][i]) << "run " << r << " " << i;
  }
}

// With lr = 0 and zero moments the parameter passes through unchanged, so the upload copy
// shows the narrowing stores on hard values: ties, overflow, subnormals, NaN.
TEST(CpuAdam, NarrowingStoresRoundToNearestEvenAtEveryLevel) {
  const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0xbf80ffffu, 0x7f7fffffu, 0xff7fffffu,
                           0x7f800000u, 0xff800000u, 0x00000001u, 0x80000000u, 0x477ff000u, 0x477fefffu,
                           0x33000000u, 0x33000001u, 0x387fc000u, 0x38800000u, 0x7fc12345u, 0xffa00001u};
  const size_t n = sizeof(bits) / sizeof(bits[0]);
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    for (const zf_dtype out_dtype : {ZF_DTYPE_BF16, ZF_DTYPE_F16}) {
      AdamState state;
      for (size_t i = 0; i < n; ++i) state.param.push_back(zf::f32_from_bits(bits[i]));
      state.exp_avg.assign(n, 0.0f);
      state.exp_avg_sq.assign(n, 0.0f);
      state.grad = Buffer(ZF_DTYPE_F32, n);
      Buffer out(out_dtype, n);
      step(state, &out, 1, zenflow::adam_hparams(0.0, 0.9, 0.999, 1e-8, 0.0), 1.0f, 0);
      for (size_t i = 0; i < n; ++i) {
        const float value = zf::f32_from_bits(bits[i]);
        const uint16_t expected = out_dtype == ZF_DTYPE_BF16 ? zf::f32_to_bf16(value) : zf::f32_to_f16(value);
        if (std::isnan(value) && out_dtype == ZF_DTYPE_F16) {
          EXPECT_TRUE(std::isnan(out.get(i))) << zf_simd_level_name(level);  // hardware keeps more payload bits
        } else {
          EXPECT_EQ(out.half[i], expected)
              << zf_simd_level_name(level) << " " << zf_dtype_name(out_dtype) << " bits 0x" << std::hex << bits[i];
        }
      }
    }
  }
}

// Large calls write a bf16/f16 output with non-temporal stores after an alignment head;
// the values must be those of the ordinary path, whatever the output's alignment.
TEST(CpuAdam, StreamedOutputCopyMatchesDefinition) {
  std::mt19937_64 rng(12);
  const size_t n = (size_t{1} << 22) + 37;
  const AdamState start = random_state(n, ZF_DTYPE_F32, rng);
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    for (const zf_dtype out_dtype : {ZF_DTYPE_BF16, ZF_DTYPE_F16}) {
      for (const size_t shift : {size_t{0}, size_t{3}}) {
        AdamState state = start;
        Buffer storage(out_dtype, n + shift);
        zf_tensor out = contiguous_tensor(storage.half.data() + shift, out_dtype, {static_cast<int64_t>(n)});
        const int64_t count = static_cast<int64_t>(n);
        zenflow::cpu_adamw_step({contiguous_tensor(state.param.data(), ZF_DTYPE_F32, {count})},
                                {contiguous_tensor(state.exp_avg.data(), ZF_DTYPE_F32, {count})},
                                {contiguous_tensor(state.exp_avg_sq.data(), ZF_DTYPE_F32, {count})},
                                {state.grad.tensor()}, {out}, {2}, hparams_for(ZF_ADAM_MODE_ADAMW));
        AdamState expected = start;
        step_reference(expected, 2, hparams_for(ZF_ADAM_MODE_ADAMW), 1.0f);
        ASSERT_TRUE(state == expected) << zf_simd_level_name(level);
        for (size_t i = 0; i < n; ++i) {
          const uint16_t want =
              out_dtype == ZF_DTYPE_BF16 ? zf::f32_to_bf16(expected.param[i]) : zf::f32_to_f16(expected.param[i]);
          ASSERT_EQ(storage.half[i + shift], want) << zf_simd_level_name(level) << " element " << i;
        }
      }
    }
  }
}

// ---- selected-column skipping ----

struct ColumnMatrix {
  int64_t n, m;  // n columns of m contiguous rows
  AdamState state;
  std::vector<int64_t> counts;
};

class SkipColumns : public ::testing::TestWithParam<std::tuple<zf_simd_level, bool, bool>> {};

TEST_P(SkipColumns, SelectedUntouchedUnselectedMatchDefinition) {
  const auto [level, packed, per_column_steps] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(11 + level);
  const int64_t n = 103, m = 37;
  const std::vector<int32_t> selected = {0, 1, 5, 6, 7, 40, 41, 99, 102};
  const int64_t k = static_cast<int64_t>(selected.size());
  std::vector<bool> is_selected(static_cast<size_t>(n), false);
  for (int32_t s : selected) is_selected[static_cast<size_t>(s)] = true;

  for (const int threads : {1, 2}) {
    zenflow::ScopedNumThreads pool(threads);
    AdamState full = random_state(static_cast<size_t>(n * m), ZF_DTYPE_F32, rng);
    std::vector<int64_t> counts(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) counts[static_cast<size_t>(j)] = j % 3 == 0 ? 4 : 9;  // runs with mixed counts
    const int64_t grad_rows = packed ? n - k : n;
    Buffer grad(ZF_DTYPE_BF16, static_cast<size_t>(grad_rows * m));
    std::normal_distribution<float> normal;
    for (size_t i = 0; i < grad.size(); ++i) grad.set(i, normal(rng));
    Buffer out(ZF_DTYPE_BF16, static_cast<size_t>(grad_rows * m));
    for (size_t i = 0; i < out.size(); ++i) out.half[i] = 0x7777;  // a sentinel for untouched

    const AdamState before = full;
    const Buffer grad_before = grad;
    const std::vector<int64_t> counts_before = counts;
    const zf_adam_hparams h = hparams_for(ZF_ADAM_MODE_ADAMW);
    const uint32_t flags = ZF_CPU_ADAM_ZERO_GRAD | (per_column_steps ? ZF_CPU_ADAM_INCREMENT_STEPS : 0u);
    std::vector<int32_t> selected_copy = selected;
    zenflow::cpu_adamw_step_skip_columns(
        {contiguous_tensor(full.param.data(), ZF_DTYPE_F32, {n, m})},
        {contiguous_tensor(full.exp_avg.data(), ZF_DTYPE_F32, {n, m})},
        {contiguous_tensor(full.exp_avg_sq.data(), ZF_DTYPE_F32, {n, m})}, {grad.tensor({grad_rows, m})},
        {out.tensor({grad_rows, m})}, {contiguous_tensor(selected_copy.data(), ZF_DTYPE_I32, {k})},
        per_column_steps ? std::vector<zf_tensor>{contiguous_tensor(counts.data(), ZF_DTYPE_I64, {n})}
                         : std::vector<zf_tensor>{},
        {5}, h, 0.5f, flags);

    int64_t packed_column = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t g_col = packed ? packed_column : j;
      for (int64_t r = 0; r < m; ++r) {
        const size_t e = static_cast<size_t>(j * m + r);
        const size_t ge = static_cast<size_t>(g_col * m + r);
        if (is_selected[static_cast<size_t>(j)]) {
          ASSERT_EQ(zf::f32_bits(full.param[e]), zf::f32_bits(before.param[e]));
          ASSERT_EQ(zf::f32_bits(full.exp_avg[e]), zf::f32_bits(before.exp_avg[e]));
          ASSERT_EQ(zf::f32_bits(full.exp_avg_sq[e]), zf::f32_bits(before.exp_avg_sq[e]));
          if (!packed) {
            ASSERT_EQ(grad.half[ge], grad_before.half[ge]) << "selected gradient column " << j << " was zeroed";
            ASSERT_EQ(out.half[ge], 0x7777) << "selected output column " << j << " was written";
          }
          continue;
        }
        float p = before.param[e], mm = before.exp_avg[e], vv = before.exp_avg_sq[e];
        const int64_t step_count = per_column_steps ? counts_before[static_cast<size_t>(j)] + 1 : 5;
        const zf::AdamStepScalars s =
            zf::adam_step_scalars(zf::AdamHyperParams{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, true}, step_count);
        zf::adam_update_element(p, mm, vv, grad_before.get(ge) * 0.5f, s);
        ASSERT_EQ(zf::f32_bits(full.param[e]), zf::f32_bits(p)) << "column " << j << " row " << r;
        ASSERT_EQ(zf::f32_bits(full.exp_avg[e]), zf::f32_bits(mm));
        ASSERT_EQ(zf::f32_bits(full.exp_avg_sq[e]), zf::f32_bits(vv));
        ASSERT_EQ(grad.half[ge], 0) << "consumed gradient not zeroed";
        ASSERT_EQ(out.half[ge], zf::f32_to_bf16(p));
      }
      if (!is_selected[static_cast<size_t>(j)]) ++packed_column;
      if (per_column_steps) {
        const int64_t expected = counts_before[static_cast<size_t>(j)] + (is_selected[static_cast<size_t>(j)] ? 0 : 1);
        ASSERT_EQ(counts[static_cast<size_t>(j)], expected) << "column " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LevelsLayoutsCounts, SkipColumns,
                         ::testing::Combine(::testing::ValuesIn(kLevels), ::testing::Bool(), ::testing::Bool()));

TEST(CpuAdam, ZeroGradOnlyWhenAsked) {
  std::mt19937_64 rng(8);
  AdamState state = random_state(100, ZF_DTYPE_F32, rng);
  const Buffer grad = state.grad;
  step(state, nullptr, 1, hparams_for(ZF_ADAM_MODE_ADAMW), 1.0f, 0);
  EXPECT_TRUE(state.grad.bitwise_equal(grad));
  step(state, nullptr, 2, hparams_for(ZF_ADAM_MODE_ADAMW), 1.0f, ZF_CPU_ADAM_ZERO_GRAD);
  for (float g : state.grad.f32) EXPECT_EQ(zf::f32_bits(g), 0u);  // +0.0 exactly
}

// ---- accumulate ----

class Accumulate : public ::testing::TestWithParam<std::tuple<zf_simd_level, zf_dtype>> {};

TEST_P(Accumulate, MatchesDefinitionWithAndWithoutSelection) {
  const auto [level, dtype] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(3 + level);
  std::normal_distribution<float> normal;
  const int64_t n = 29, m = 41;
  std::vector<float> acc(static_cast<size_t>(n * m));
  for (float& a : acc) a = normal(rng);
  const std::vector<float> acc_before = acc;

  // Whole tensor.
  Buffer block(dtype, acc.size());
  for (size_t i = 0; i < block.size(); ++i) block.set(i, normal(rng));
  zenflow::cpu_accumulate({contiguous_tensor(acc.data(), ZF_DTYPE_F32, {n * m})}, {block.tensor()}, {}, 0.3f);
  for (size_t i = 0; i < acc.size(); ++i) {
    ASSERT_EQ(zf::f32_bits(acc[i]), zf::f32_bits(zf::accumulate_element(acc_before[i], block.get(i), 0.3f)));
  }

  // Packed unselected columns.
  std::vector<int64_t> selected = {2, 3, 4, 17, 28};
  const int64_t k = static_cast<int64_t>(selected.size());
  Buffer packed(dtype, static_cast<size_t>((n - k) * m));
  for (size_t i = 0; i < packed.size(); ++i) packed.set(i, normal(rng));
  const std::vector<float> acc_mid = acc;
  zenflow::cpu_accumulate({contiguous_tensor(acc.data(), ZF_DTYPE_F32, {n, m})}, {packed.tensor({n - k, m})},
                          {contiguous_tensor(selected.data(), ZF_DTYPE_I64, {k})}, 2.0f);
  int64_t column = 0;
  for (int64_t j = 0; j < n; ++j) {
    const bool skip = std::find(selected.begin(), selected.end(), j) != selected.end();
    for (int64_t r = 0; r < m; ++r) {
      const size_t e = static_cast<size_t>(j * m + r);
      const float expected =
          skip ? acc_mid[e] : zf::accumulate_element(acc_mid[e], packed.get(static_cast<size_t>(column * m + r)), 2.0f);
      ASSERT_EQ(zf::f32_bits(acc[e]), zf::f32_bits(expected)) << "column " << j;
    }
    if (!skip) ++column;
  }
}

INSTANTIATE_TEST_SUITE_P(LevelsAndTypes, Accumulate,
                         ::testing::Combine(::testing::ValuesIn(kLevels), ::testing::ValuesIn(kFloatTypes)));

// ---- bad input: a clear error naming the argument, nothing written ----

struct BadInputCase {
  std::vector<float> p, m, v, g;
  BadInputCase() : p(64, 1.0f), m(64, 0.5f), v(64, 0.25f), g(64, 2.0f) {}
  bool untouched() const {
    for (size_t i = 0; i < 64; ++i) {
      if (p[i] != 1.0f || m[i] != 0.5f || v[i] != 0.25f || g[i] != 2.0f) return false;
    }
    return true;
  }
};

zf_status call_step(BadInputCase& c, zf_tensor p, zf_tensor m, zf_tensor v, zf_tensor g, zf_adam_hparams h,
                    int64_t step_count = 1, float grad_scale = 1.0f) {
  (void)c;
  return zf_cpu_adamw_step(&p, &m, &v, &g, nullptr, &step_count, 1, &h, grad_scale, ZF_CPU_ADAM_ZERO_GRAD);
}

void expect_error(zf_status status, zf_status expected, const char* fragment, const BadInputCase& c) {
  EXPECT_EQ(status, expected) << zf_last_error();
  EXPECT_NE(std::string(zf_last_error()).find(fragment), std::string::npos) << zf_last_error();
  EXPECT_TRUE(c.untouched()) << "a failed call wrote to its buffers (" << fragment << ")";
}

TEST(CpuAdamBadInput, ClearErrorsAndNothingWritten) {
  BadInputCase c;
  auto t = [](std::vector<float>& x, int64_t n = 64) { return contiguous_tensor(x.data(), ZF_DTYPE_F32, {n}); };
  const zf_adam_hparams good = hparams_for(ZF_ADAM_MODE_ADAMW);
  const double nan = std::numeric_limits<double>::quiet_NaN();

  zf_adam_hparams h = good;
  h.lr = nan;
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.lr", c);
  h = good;
  h.beta1 = 1.0;
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.beta1", c);
  h = good;
  h.beta2 = nan;
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.beta2", c);
  h = good;
  h.eps = -1.0;
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.eps", c);
  h = good;
  h.weight_decay = std::numeric_limits<double>::infinity();
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.weight_decay", c);
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), t(c.g), good, 1, std::nanf("")), ZF_ERROR_INVALID_VALUE,
               "grad_scale", c);
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), t(c.g), good, 0), ZF_ERROR_INVALID_VALUE, "steps[0]", c);
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v, 63), t(c.g), good), ZF_ERROR_INVALID_VALUE, "exp_avg_sqs[0]", c);
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), t(c.g, 32), good), ZF_ERROR_INVALID_VALUE, "grads[0]", c);

  zf_tensor misaligned = t(c.m, 32);
  misaligned.data = reinterpret_cast<char*>(c.m.data()) + 2;
  expect_error(call_step(c, t(c.p, 32), misaligned, t(c.v, 32), t(c.g, 32), good), ZF_ERROR_INVALID_VALUE,
               "exp_avgs[0]", c);
  zf_tensor strided = contiguous_tensor(c.g.data(), ZF_DTYPE_F32, {32});
  strided.strides[0] = 2;
  expect_error(call_step(c, t(c.p, 32), t(c.m, 32), t(c.v, 32), strided, good), ZF_ERROR_INVALID_VALUE, "grads[0]", c);
  expect_error(call_step(c, t(c.p), t(c.p), t(c.v), t(c.g), good), ZF_ERROR_INVALID_VALUE, "overlaps", c);
  zf_tensor as_int = t(c.g);
  as_int.dtype = ZF_DTYPE_I32;
  expect_error(call_step(c, t(c.p), t(c.m), t(c.v), as_int, good), ZF_ERROR_INVALID_TYPE, "grads[0]", c);
  zf_tensor on_gpu = t(c.p);
  on_gpu.device = zenflow::cuda_device(0);
  expect_error(call_step(c, on_gpu, t(c.m), t(c.v), t(c.g), good), ZF_ERROR_INVALID_TYPE, "params[0]", c);

  // Selected indices: unsorted, duplicated, out of range.
  auto skip_call = [&](std::vector<int32_t> sel) {
    zf_tensor p = contiguous_tensor(c.p.data(), ZF_DTYPE_F32, {8, 8});
    zf_tensor m = contiguous_tensor(c.m.data(), ZF_DTYPE_F32, {8, 8});
    zf_tensor v = contiguous_tensor(c.v.data(), ZF_DTYPE_F32, {8, 8});
    zf_tensor g = contiguous_tensor(c.g.data(), ZF_DTYPE_F32, {8, 8});
    zf_tensor s = contiguous_tensor(sel.data(), ZF_DTYPE_I32, {static_cast<int64_t>(sel.size())});
    const int64_t step_count = 1;
    return zf_cpu_adamw_step_skip_columns(&p, &m, &v, &g, nullptr, &s, nullptr, &step_count, 1, &good, 1.0f,
                                          ZF_CPU_ADAM_ZERO_GRAD);
  };
  expect_error(skip_call({3, 1}), ZF_ERROR_INVALID_VALUE, "strictly increasing", c);
  expect_error(skip_call({1, 1}), ZF_ERROR_INVALID_VALUE, "strictly increasing", c);
  expect_error(skip_call({2, 8}), ZF_ERROR_INVALID_VALUE, "selected[0][1]", c);
  expect_error(skip_call({-1}), ZF_ERROR_INVALID_VALUE, "out of range", c);
  EXPECT_EQ(skip_call({1, 2}), ZF_SUCCESS) << zf_last_error();
  EXPECT_FALSE(c.untouched());

  // Accumulate: mismatched block, NaN scale.
  BadInputCase d;
  zf_tensor acc = contiguous_tensor(d.p.data(), ZF_DTYPE_F32, {64});
  zf_tensor block = contiguous_tensor(d.g.data(), ZF_DTYPE_F32, {63});
  expect_error(zf_cpu_accumulate(&acc, &block, nullptr, 1, 1.0f), ZF_ERROR_INVALID_VALUE, "blocks[0]", d);
  block.shape[0] = 64;
  expect_error(zf_cpu_accumulate(&acc, &block, nullptr, 1, std::nanf("")), ZF_ERROR_INVALID_VALUE, "scale", d);
}

}  // namespace
