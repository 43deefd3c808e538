// The host optimizer (zenflow/cpu_adamw.h): every SIMD level against the scalar definition
// (common/adam_math.hpp) bit for bit, a float64 reference over 20 steps, bitwise
// determinism across thread counts, per-matrix lr and weight decay, selected-column
// skipping on the packed layout, the accumulator (fed the buffer zf_pack_columns writes),
// the gather/scatter of column state, the plans run many times, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/adam_math.hpp"
#include "common/float_convert.hpp"
#include "common/thread_pool.hpp"
#include "ops/cpu_adamw_plan.hpp"
#include "simd/kernels.hpp"
#include "test_util.hpp"

namespace {

using zenflow::contiguous_tensor;

const zf_simd_level kLevels[] = {ZF_SIMD_SCALAR, ZF_SIMD_AVX2, ZF_SIMD_AVX512};
const zf_dtype kFloatTypes[] = {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16};
constexpr double kLr = 1e-2;
constexpr double kWeightDecay = 0.05;

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
  // Every element set to one bit pattern (a sentinel for "never written").
  void poison() {
    std::fill(f32.begin(), f32.end(), zf::f32_from_bits(0x7fc0beefu));
    std::fill(half.begin(), half.end(), uint16_t{0x7777});
  }
  bool bitwise_equal(const Buffer& other) const { return f32 == other.f32 && half == other.half; }
  zf_tensor tensor(std::vector<int64_t> shape) { return contiguous_tensor(data(), dtype, shape); }
  zf_tensor tensor() { return tensor({static_cast<int64_t>(size())}); }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

zf_tensor f32_tensor(std::vector<float>& x, std::vector<int64_t> shape) {
  return contiguous_tensor(x.data(), ZF_DTYPE_F32, shape);
}
zf_tensor f32_tensor(std::vector<float>& x) { return f32_tensor(x, {static_cast<int64_t>(x.size())}); }
zf_tensor i32_tensor(std::vector<int32_t>& x) {
  return contiguous_tensor(x.data(), ZF_DTYPE_I32, {static_cast<int64_t>(x.size())});
}

zf::AdamStepScalars scalars_for(const zf_adam_hparams& h, double lr, double weight_decay, int64_t step) {
  return zf::adam_step_scalars(
      zf::AdamHyperParams{lr, h.beta1, h.beta2, h.eps, weight_decay, h.mode == ZF_ADAM_MODE_ADAMW}, step);
}

// ---- zf_cpu_adamw_step: whole tensors ----

struct AdamState {
  std::vector<float> param, exp_avg, exp_avg_sq;
  Buffer grad;
  bool operator==(const AdamState& o) const {
    return same_bits(param, o.param) && same_bits(exp_avg, o.exp_avg) && same_bits(exp_avg_sq, o.exp_avg_sq) &&
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

// One call of zf_cpu_adamw_step on one tensor.
void step(AdamState& s, Buffer* out, int64_t step_count, const zf_adam_hparams& h, float grad_scale, uint32_t flags,
          double lr = kLr, double weight_decay = kWeightDecay) {
  std::vector<zf_tensor> outs;
  if (out) outs.push_back(out->tensor());
  zenflow::cpu_adamw_step({f32_tensor(s.param)}, {f32_tensor(s.exp_avg)}, {f32_tensor(s.exp_avg_sq)}, {s.grad.tensor()},
                          outs, {step_count}, {lr}, {weight_decay}, h, grad_scale, flags);
}

// The definition, element by element.
void step_reference(AdamState& s, int64_t step_count, const zf_adam_hparams& h, float grad_scale, double lr = kLr,
                    double weight_decay = kWeightDecay) {
  const zf::AdamStepScalars scalars = scalars_for(h, lr, weight_decay, step_count);
  for (size_t i = 0; i < s.param.size(); ++i) {
    zf::adam_update_element(s.param[i], s.exp_avg[i], s.exp_avg_sq[i], s.grad.get(i) * grad_scale, scalars);
  }
}

class CpuAdamwLevels : public ::testing::TestWithParam<std::tuple<zf_simd_level, zf_dtype>> {};

TEST_P(CpuAdamwLevels, MatchesScalarDefinitionBitForBit) {
  const auto [level, grad_dtype] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(17 + level * 3 + grad_dtype);
  for (const size_t n : {size_t{1}, size_t{7}, size_t{16}, size_t{17}, size_t{255}, size_t{256}, size_t{257},
                         size_t{264}, size_t{273}, size_t{1000}, size_t{40099}}) {
    for (const zf_adam_mode mode : {ZF_ADAM_MODE_ADAMW, ZF_ADAM_MODE_ADAM}) {
      for (const int out_kind : {-1, int{ZF_DTYPE_F32}, int{ZF_DTYPE_BF16}, int{ZF_DTYPE_F16}}) {
        // Step 30000: sqrt(1 - beta2^step) rounds to 1, where the kernels skip its divide.
        for (const bool zero_grad : {false, true})
          for (const int64_t step_count : {int64_t{3}, int64_t{30000}}) {
            const zf_adam_hparams h = zenflow::adam_hparams(0.9, 0.999, 1e-8, mode);
            ASSERT_EQ(scalars_for(h, kLr, kWeightDecay, step_count).bc2_sqrt == 1.0f, step_count == 30000);
            AdamState state = random_state(n, grad_dtype, rng);
            AdamState expected = state;
            Buffer out(out_kind < 0 ? ZF_DTYPE_F32 : static_cast<zf_dtype>(out_kind), n);
            const float scale = 0.25f;
            step(state, out_kind < 0 ? nullptr : &out, step_count, h, scale, zero_grad ? ZF_CPU_ADAMW_ZERO_GRAD : 0u);
            step_reference(expected, step_count, h, scale);
            if (zero_grad) expected.grad = Buffer(grad_dtype, n);
            ASSERT_TRUE(state == expected) << "n=" << n << " mode=" << mode << " out=" << out_kind
                                           << " zero_grad=" << zero_grad << " step=" << step_count;
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

TEST_P(CpuAdamwLevels, TwentyStepsWithinFloat32RoundingOfFloat64) {
  const auto [level, grad_dtype] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(99 + level + grad_dtype);
  const size_t n = 1003;
  for (const zf_adam_mode mode : {ZF_ADAM_MODE_ADAMW, ZF_ADAM_MODE_ADAM}) {
    const zf_adam_hparams h = zenflow::adam_hparams(0.9, 0.999, 1e-8, mode);
    AdamState state = random_state(n, grad_dtype, rng);
    std::fill(state.exp_avg.begin(), state.exp_avg.end(), 0.0f);
    std::fill(state.exp_avg_sq.begin(), state.exp_avg_sq.end(), 0.0f);
    std::vector<double> p(state.param.begin(), state.param.end()), m(n, 0.0), v(n, 0.0);
    for (int64_t t = 1; t <= 20; ++t) {
      refill_grad(state, rng);
      for (size_t i = 0; i < n; ++i) {
        double g = state.grad.get(i) * 0.5;
        if (mode == ZF_ADAM_MODE_ADAM) g += kWeightDecay * p[i];
        if (mode == ZF_ADAM_MODE_ADAMW) p[i] *= 1.0 - kLr * kWeightDecay;
        m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
        v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
        const double denom = std::sqrt(v[i]) / std::sqrt(1.0 - std::pow(h.beta2, t)) + h.eps;
        p[i] -= kLr / (1.0 - std::pow(h.beta1, t)) * m[i] / denom;
      }
      step(state, nullptr, t, h, 0.5f, 0);
    }
    for (size_t i = 0; i < n; ++i) {
      // A few ulps of |p| per step, plus float32 rounding of the ~lr-sized updates.
      const double tolerance = 20 * (4e-7 * std::fabs(p[i]) + 1e-6 * kLr);
      ASSERT_NEAR(state.param[i], p[i], tolerance) << "element " << i << " mode " << mode;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LevelsAndGradTypes, CpuAdamwLevels,
                         ::testing::Combine(::testing::ValuesIn(kLevels), ::testing::ValuesIn(kFloatTypes)));

// The bias correction's divide, sqrt(v) / sqrt(bc2), is computed by the SIMD levels from a
// reciprocal and Markstein's correction (kernels_adam_impl.hpp), which is the correctly rounded
// quotient for every square root of a float and every divisor in [2^-27, 1]. With beta1 = 0,
// eps = 0, lr = 1, no weight decay and zero state, the step leaves param = -g / (sqrt(v) / b)
// with v = (1 - beta2) g^2: a quotient one ulp off changes the result's bits. The gradients
// take every exponent, so the square roots cover [2^-75, 2^64], zeros, infinities and NaN.
TEST(CpuAdamw, BiasCorrectionDivideIsCorrectlyRoundedOverTheSquareRoots) {
  std::mt19937_64 rng(2026);
  std::uniform_int_distribution<uint32_t> exponent(0, 254), mantissa(0, (1u << 23) - 1), sign(0, 1);
  const size_t n = 1 << 17;
  std::vector<float> grads(n);
  for (size_t i = 0; i < n; ++i) grads[i] = zf::f32_from_bits(sign(rng) << 31 | exponent(rng) << 23 | mantissa(rng));
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 0x1p-149f, 0x1p64f, 0x1.fffffep127f};
  std::copy(std::begin(specials), std::end(specials), grads.begin());
  const double largest_beta2 = std::nextafter(1.0, 0.0);  // bc2_sqrt = 2^-26.5 at step 1
  for (const auto& [beta2, step_count] : std::vector<std::pair<double, int64_t>>{
           {0.999, 1}, {0.999, 7}, {0.999, 1000}, {0.95, 3}, {0.9999, 12345}, {0.5, 1}, {largest_beta2, 1}}) {
    const zf_adam_hparams h = zenflow::adam_hparams(0.0, beta2, 0.0, ZF_ADAM_MODE_ADAMW);
    const float bc2_sqrt = scalars_for(h, 1.0, 0.0, step_count).bc2_sqrt;
    ASSERT_TRUE(bc2_sqrt >= 0x1p-27f && bc2_sqrt < 1.0f) << bc2_sqrt;
    AdamState expected;
    expected.param.assign(n, 0.0f);
    expected.exp_avg.assign(n, 0.0f);
    expected.exp_avg_sq.assign(n, 0.0f);
    expected.grad = Buffer(ZF_DTYPE_F32, n);
    expected.grad.f32 = grads;
    const AdamState initial = expected;
    step_reference(expected, step_count, h, 1.0f, 1.0, 0.0);
    for (const zf_simd_level level : zenflow::supported_simd_levels()) {
      zenflow::ScopedSimdLevel simd(level);
      AdamState state = initial;
      step(state, nullptr, step_count, h, 1.0f, 0, 1.0, 0.0);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(zf::f32_bits(state.param[i]), zf::f32_bits(expected.param[i]))
            << zf_simd_level_name(level) << " beta2 " << beta2 << " step " << step_count << " grad " << grads[i]
            << " v " << expected.exp_avg_sq[i];
      }
      // (Bit patterns throughout: the gradients include NaN, which == would never match.)
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(zf::f32_bits(state.exp_avg[i]), zf::f32_bits(expected.exp_avg[i])) << "element " << i;
        ASSERT_EQ(zf::f32_bits(state.exp_avg_sq[i]), zf::f32_bits(expected.exp_avg_sq[i])) << "element " << i;
      }
    }
  }
}

TEST(CpuAdamw, LevelsAgreeBitForBit) {
  std::mt19937_64 rng(5);
  const AdamState start = random_state(4099, ZF_DTYPE_BF16, rng);
  AdamState first;
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    AdamState state = start;
    Buffer out(ZF_DTYPE_BF16, state.param.size());
    step(state, &out, 7, zenflow::adam_hparams(), 1.0f, 0);
    if (level == ZF_SIMD_SCALAR) {
      first = state;
    } else {
      EXPECT_TRUE(state == first) << zf_simd_level_name(level);
    }
  }
}

TEST(CpuAdamw, BitwiseIdenticalAcrossThreadCounts) {
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
      p.push_back(f32_tensor(s.param));
      m.push_back(f32_tensor(s.exp_avg));
      v.push_back(f32_tensor(s.exp_avg_sq));
      g.push_back(s.grad.tensor());
    }
    zenflow::cpu_adamw_step(p, m, v, g, {}, {1, 2, 3, 4}, {1e-3, 2e-3, 1e-3, 5e-4}, {0.1, 0.0, 0.1, 0.2},
                            zenflow::adam_hparams(0.9, 0.999, 1e-8, ZF_ADAM_MODE_ADAM), 0.75f);
    results.push_back(states);
  }
  for (size_t r = 1; r < results.size(); ++r) {
    for (size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(results[r][i] == results[0][i]) << "run " << r << " " << i;
  }
}

// zf_cpu_adamw_step_flat: the state of several tensors in one buffer per field, with gaps
// between the runs, against zf_cpu_adamw_step on per-tensor copies: bit for bit at every
// level and thread count, in both forms (fp32 weights in place; flat masters with a bf16
// output copy), and the gaps untouched.
TEST(CpuAdamwFlat, BitwiseThePerTensorStepAndGapsUntouched) {
  std::mt19937_64 rng(61);
  const std::vector<int64_t> sizes = {1, 70001, 0, 33, 150007};
  const int64_t gap = 5;
  std::vector<int64_t> offsets;
  int64_t total = gap;
  for (const int64_t n : sizes) {
    offsets.push_back(total);
    total += n + gap;
  }
  std::vector<AdamState> start;
  for (const int64_t n : sizes) start.push_back(random_state(static_cast<size_t>(n), ZF_DTYPE_BF16, rng));
  const std::vector<int64_t> steps = {1, 2, 3, 4, 5};
  const std::vector<double> lr = {1e-3, 2e-3, 1e-3, 5e-4, 1e-2};
  const std::vector<double> weight_decay = {0.1, 0.0, 0.1, 0.2, 0.05};
  const zf_adam_hparams h = zenflow::adam_hparams(0.9, 0.99, 1e-8, ZF_ADAM_MODE_ADAMW);
  const float sentinel = -7.0f;

  for (const bool flat_master : {false, true}) {
    // The per-tensor reference.
    std::vector<AdamState> expected = start;
    std::vector<Buffer> expected_out;
    for (const int64_t n : sizes) expected_out.emplace_back(ZF_DTYPE_BF16, static_cast<size_t>(n));
    {
      std::vector<zf_tensor> p, m, v, g, out;
      for (size_t i = 0; i < sizes.size(); ++i) {
        p.push_back(f32_tensor(expected[i].param));
        m.push_back(f32_tensor(expected[i].exp_avg));
        v.push_back(f32_tensor(expected[i].exp_avg_sq));
        g.push_back(expected[i].grad.tensor());
        out.push_back(expected_out[i].tensor());
      }
      zenflow::cpu_adamw_step(p, m, v, g, flat_master ? out : std::vector<zf_tensor>{}, steps, lr, weight_decay, h);
    }
    for (const zf_simd_level level : zenflow::supported_simd_levels()) {
      for (const int threads : {1, 2, 3}) {
        zenflow::ScopedSimdLevel simd(level);
        zenflow::ScopedNumThreads pool(threads);
        std::vector<AdamState> states = start;
        std::vector<float> master(static_cast<size_t>(total), sentinel), m(master), v(master);
        std::vector<Buffer> outs;
        std::vector<zf_tensor> params, grads, out_tensors;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const size_t at = static_cast<size_t>(offsets[i]);
          std::copy(states[i].param.begin(), states[i].param.end(), master.begin() + at);
          std::copy(states[i].exp_avg.begin(), states[i].exp_avg.end(), m.begin() + at);
          std::copy(states[i].exp_avg_sq.begin(), states[i].exp_avg_sq.end(), v.begin() + at);
          outs.emplace_back(ZF_DTYPE_BF16, static_cast<size_t>(sizes[i]));
          outs.back().poison();
          params.push_back(f32_tensor(states[i].param));
          grads.push_back(states[i].grad.tensor());
        }
        for (Buffer& out : outs) out_tensors.push_back(out.tensor());
        zf_tensor master_tensor = f32_tensor(master);
        zenflow::cpu_adamw_step_flat(flat_master ? std::vector<zf_tensor>{} : params,
                                     flat_master ? &master_tensor : nullptr, f32_tensor(m), f32_tensor(v), offsets,
                                     sizes, grads, flat_master ? out_tensors : std::vector<zf_tensor>{}, steps, lr,
                                     weight_decay, h);
        const std::string where = std::string(zf_simd_level_name(level)) + ", " + std::to_string(threads) +
                                  " threads, " + (flat_master ? "flat master" : "fp32 params");
        for (size_t i = 0; i < sizes.size(); ++i) {
          const size_t at = static_cast<size_t>(offsets[i]), n = static_cast<size_t>(sizes[i]);
          const std::vector<float> got_param =
              flat_master ? std::vector<float>(master.begin() + at, master.begin() + at + n) : states[i].param;
          EXPECT_TRUE(same_bits(got_param, expected[i].param)) << where << ", tensor " << i;
          EXPECT_TRUE(same_bits(std::vector<float>(m.begin() + at, m.begin() + at + n), expected[i].exp_avg))
              << where << ", tensor " << i;
          EXPECT_TRUE(same_bits(std::vector<float>(v.begin() + at, v.begin() + at + n), expected[i].exp_avg_sq))
              << where << ", tensor " << i;
          if (flat_master) EXPECT_TRUE(outs[i].bitwise_equal(expected_out[i])) << where << ", tensor " << i;
        }
        for (size_t i = 0; i <= sizes.size(); ++i) {
          const size_t end = i < sizes.size() ? static_cast<size_t>(offsets[i]) : static_cast<size_t>(total);
          for (size_t k = end - static_cast<size_t>(gap); k < end; ++k) {
            EXPECT_EQ(m[k], sentinel) << where;
            EXPECT_EQ(v[k], sentinel) << where;
            EXPECT_EQ(master[k], sentinel) << where;
          }
        }
      }
    }
  }
}

// Each tensor is stepped with its own lr and weight decay (param groups in one call), some
// sharing a pair and some a step, so the call's table of step scalars has shared entries.
TEST(CpuAdamw, PerTensorLearningRateAndWeightDecay) {
  std::mt19937_64 rng(21);
  const std::vector<double> lr = {1e-2, 3e-4, 1e-2, 0.0, 1e-2};
  const std::vector<double> weight_decay = {0.1, 0.0, 0.1, 0.5, 0.01};
  const std::vector<int64_t> steps = {4, 4, 9, 1, 4};
  for (const zf_adam_mode mode : {ZF_ADAM_MODE_ADAMW, ZF_ADAM_MODE_ADAM}) {
    const zf_adam_hparams h = zenflow::adam_hparams(0.8, 0.99, 1e-6, mode);
    std::vector<AdamState> states, expected;
    std::vector<zf_tensor> p, m, v, g;
    for (size_t i = 0; i < lr.size(); ++i) states.push_back(random_state(257 + 31 * i, ZF_DTYPE_F32, rng));
    expected = states;
    for (auto& s : states) {
      p.push_back(f32_tensor(s.param));
      m.push_back(f32_tensor(s.exp_avg));
      v.push_back(f32_tensor(s.exp_avg_sq));
      g.push_back(s.grad.tensor());
    }
    zenflow::cpu_adamw_step(p, m, v, g, {}, steps, lr, weight_decay, h, 2.0f);
    for (size_t i = 0; i < lr.size(); ++i) {
      step_reference(expected[i], steps[i], h, 2.0f, lr[i], weight_decay[i]);
      EXPECT_TRUE(states[i] == expected[i]) << "tensor " << i << " mode " << mode;
    }
  }
}

// With lr = 0 and zero moments the parameter passes through unchanged, so the upload copy
// shows the narrowing stores on hard values: ties, overflow, subnormals, NaN.
TEST(CpuAdamw, NarrowingStoresRoundToNearestEvenAtEveryLevel) {
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
      step(state, &out, 1, zenflow::adam_hparams(), 1.0f, 0, 0.0, 0.0);
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
TEST(CpuAdamw, StreamedOutputCopyMatchesDefinition) {
  std::mt19937_64 rng(12);
  const size_t n = (size_t{1} << 22) + 37;
  const AdamState start = random_state(n, ZF_DTYPE_F32, rng);
  AdamState expected = start;
  step_reference(expected, 2, zenflow::adam_hparams(), 1.0f);
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    for (const zf_dtype out_dtype : {ZF_DTYPE_BF16, ZF_DTYPE_F16}) {
      for (const size_t shift : {size_t{0}, size_t{3}}) {
        AdamState state = start;
        Buffer storage(out_dtype, n + shift);
        zf_tensor out = contiguous_tensor(storage.half.data() + shift, out_dtype, {static_cast<int64_t>(n)});
        zenflow::cpu_adamw_step({f32_tensor(state.param)}, {f32_tensor(state.exp_avg)}, {f32_tensor(state.exp_avg_sq)},
                                {state.grad.tensor()}, {out}, {2}, {kLr}, {kWeightDecay});
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

TEST(CpuAdamw, ZeroGradOnlyWhenAsked) {
  std::mt19937_64 rng(8);
  AdamState state = random_state(100, ZF_DTYPE_F32, rng);
  const Buffer grad = state.grad;
  step(state, nullptr, 1, zenflow::adam_hparams(), 1.0f, 0);
  EXPECT_TRUE(state.grad.bitwise_equal(grad));
  step(state, nullptr, 2, zenflow::adam_hparams(), 1.0f, ZF_CPU_ADAMW_ZERO_GRAD);
  for (float g : state.grad.f32) EXPECT_EQ(zf::f32_bits(g), 0u);  // +0.0 exactly
}

// ---- host-layout matrices: the column step, accumulate, gather/scatter ----

// One matrix in the host layout: n columns of m contiguous rows, with its selection.
struct ColumnMatrix {
  int64_t n = 0, m = 0;
  std::vector<int32_t> selected;
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<int32_t> steps;

  size_t index(int64_t column, int64_t row) const { return static_cast<size_t>(column * m + row); }
  bool is_selected(int64_t column) const {
    return std::binary_search(selected.begin(), selected.end(), static_cast<int32_t>(column));
  }
  std::vector<int64_t> unselected() const {
    std::vector<int64_t> columns;
    for (int64_t j = 0; j < n; ++j) {
      if (!is_selected(j)) columns.push_back(j);
    }
    return columns;
  }
  zf_column_state state() {
    return zf_column_state{master.empty() ? f32_tensor(master, {0}) : f32_tensor(master, {n, m}),
                           f32_tensor(exp_avg, {n, m}), f32_tensor(exp_avg_sq, {n, m}), i32_tensor(steps)};
  }
  zf_tensor selected_tensor() { return i32_tensor(selected); }
  bool operator==(const ColumnMatrix& o) const {
    return same_bits(master, o.master) && same_bits(exp_avg, o.exp_avg) && same_bits(exp_avg_sq, o.exp_avg_sq) &&
           steps == o.steps;
  }
};

// Random state; step counts vary along the columns so that runs of unselected columns are
// cut where the count changes.
ColumnMatrix random_column_matrix(int64_t n, int64_t m, std::vector<int32_t> selected, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  ColumnMatrix c;
  c.n = n;
  c.m = m;
  c.selected = std::move(selected);
  const size_t elements = static_cast<size_t>(n * m);
  c.master.resize(elements);
  c.exp_avg.resize(elements);
  c.exp_avg_sq.resize(elements);
  for (size_t e = 0; e < elements; ++e) {
    c.master[e] = normal(rng);
    c.exp_avg[e] = 0.1f * normal(rng);
    c.exp_avg_sq[e] = 0.01f * std::fabs(normal(rng));
  }
  c.steps.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) c.steps[static_cast<size_t>(j)] = j % 3 == 0 ? 4 : (j % 7 == 0 ? 1 : 9);
  return c;
}

// Offsets of the packed layout (zf_packed_layout): offsets[i] and the total at offsets[count].
std::vector<int64_t> packed_offsets(const std::vector<ColumnMatrix>& matrices) {
  std::vector<int64_t> rows, cols, k;
  for (const ColumnMatrix& c : matrices) {
    rows.push_back(c.m);
    cols.push_back(c.n);
    k.push_back(static_cast<int64_t>(c.selected.size()));
  }
  std::vector<int64_t> offsets(matrices.size() + 1);
  zenflow::check(zf_packed_layout(rows.data(), cols.data(), k.data(), matrices.size(), offsets.data()));
  return offsets;
}

// The column step's definition on `before`: the unselected columns of every matrix
// updated element by element (gradient of column j, row r: grad(i, j, packed position, r)).
template <class Grad>
std::vector<ColumnMatrix> column_step_reference(std::vector<ColumnMatrix> matrices, const Grad& grad,
                                                const std::vector<double>& lr, const std::vector<double>& weight_decay,
                                                const zf_adam_hparams& h, float grad_scale, bool increment) {
  for (size_t i = 0; i < matrices.size(); ++i) {
    ColumnMatrix& c = matrices[i];
    const std::vector<int64_t> columns = c.unselected();
    for (size_t u = 0; u < columns.size(); ++u) {
      const int64_t j = columns[u];
      int32_t& count = c.steps[static_cast<size_t>(j)];
      if (increment) ++count;
      const zf::AdamStepScalars s = scalars_for(h, lr[i], weight_decay[i], count);
      for (int64_t r = 0; r < c.m; ++r) {
        const size_t e = c.index(j, r);
        zf::adam_update_element(c.master[e], c.exp_avg[e], c.exp_avg_sq[e],
                                grad(i, j, static_cast<int64_t>(u), r) * grad_scale, s);
      }
    }
  }
  return matrices;
}

// Several matrices: a large one with a random selection (enough work to go parallel), one
// whose selection holds its first and last columns, one with nothing selected, one whose
// every column is selected, and a 1-row one.
std::vector<ColumnMatrix> step_matrices(std::mt19937_64& rng) {
  std::vector<ColumnMatrix> matrices;
  matrices.push_back(random_column_matrix(1031, 67, zf_test::random_selection(1031, 100, rng), rng));
  matrices.push_back(random_column_matrix(50, 129, {0, 1, 5, 6, 7, 40, 41, 49}, rng));
  matrices.push_back(random_column_matrix(13, 7, {}, rng));
  matrices.push_back(random_column_matrix(3, 5, {0, 1, 2}, rng));
  matrices.push_back(random_column_matrix(97, 1, {50}, rng));
  return matrices;
}

enum class GradForm { kHostLayout, kPacked };

class SkipColumns : public ::testing::TestWithParam<std::tuple<zf_simd_level, GradForm, bool>> {};

TEST_P(SkipColumns, SelectedUntouchedUnselectedMatchDefinition) {
  const auto [level, form, increment] = GetParam();
  if (level > zf_simd_level_supported()) GTEST_SKIP() << "CPU lacks " << zf_simd_level_name(level);
  zenflow::ScopedSimdLevel simd(level);
  std::mt19937_64 rng(11 + level);
  std::normal_distribution<float> normal;
  const std::vector<ColumnMatrix> start = step_matrices(rng);
  const size_t count = start.size();
  const std::vector<int64_t> offsets = packed_offsets(start);
  const std::vector<double> lr = {1e-2, 3e-3, 1e-2, 1e-2, 5e-2};
  const std::vector<double> weight_decay = {0.05, 0.0, 0.05, 0.1, 0.05};
  const zf_adam_hparams h = zenflow::adam_hparams();

  // The gradient in both forms: host layout [n, m] per matrix (bf16), and packed (bf16).
  std::vector<Buffer> host_grads;
  Buffer packed_grad(ZF_DTYPE_BF16, static_cast<size_t>(offsets[count]));
  for (size_t i = 0; i < count; ++i) {
    host_grads.emplace_back(ZF_DTYPE_BF16, static_cast<size_t>(start[i].n * start[i].m));
    for (size_t e = 0; e < host_grads[i].size(); ++e) host_grads[i].set(e, normal(rng));
    const std::vector<int64_t> columns = start[i].unselected();
    for (size_t u = 0; u < columns.size(); ++u) {
      for (int64_t r = 0; r < start[i].m; ++r) {
        const size_t packed = static_cast<size_t>(offsets[i] + static_cast<int64_t>(u) * start[i].m + r);
        packed_grad.half[packed] = host_grads[i].half[start[i].index(columns[u], r)];
      }
    }
  }
  const auto grad_of = [&](size_t i, int64_t j, int64_t, int64_t r) { return host_grads[i].get(start[i].index(j, r)); };
  const std::vector<ColumnMatrix> expected =
      column_step_reference(start, grad_of, lr, weight_decay, h, 0.5f, increment);

  std::vector<std::vector<ColumnMatrix>> results;
  for (const int threads : {1, 2, 3}) {
    zenflow::ScopedNumThreads pool(threads);
    std::vector<ColumnMatrix> matrices = start;
    std::vector<Buffer> grads = host_grads;
    Buffer packed = packed_grad;
    Buffer out(ZF_DTYPE_BF16, packed_grad.size());
    out.poison();
    std::vector<zf_column_state> state;
    std::vector<zf_tensor> selected, grad_tensors;
    for (size_t i = 0; i < count; ++i) {
      state.push_back(matrices[i].state());
      selected.push_back(matrices[i].selected_tensor());
      grad_tensors.push_back(grads[i].tensor({matrices[i].n, matrices[i].m}));
    }
    const zf_tensor packed_tensor = packed.tensor(), out_tensor = out.tensor();
    const uint32_t flags = ZF_CPU_ADAMW_ZERO_GRAD | (increment ? ZF_CPU_ADAMW_INCREMENT_STEPS : 0u);
    const bool host_form = form == GradForm::kHostLayout;
    zenflow::cpu_adamw_step_skip_columns(state, selected, host_form ? grad_tensors : std::vector<zf_tensor>{},
                                         host_form ? nullptr : &packed_tensor, &out_tensor, lr, weight_decay, h, 0.5f,
                                         flags);

    for (size_t i = 0; i < count; ++i) {
      ASSERT_TRUE(matrices[i] == expected[i]) << "matrix " << i << " threads " << threads;
      const std::vector<int64_t> columns = start[i].unselected();
      for (size_t u = 0; u < columns.size(); ++u) {
        for (int64_t r = 0; r < start[i].m; ++r) {
          const float p = expected[i].master[start[i].index(columns[u], r)];
          ASSERT_EQ(out.half[static_cast<size_t>(offsets[i] + static_cast<int64_t>(u) * start[i].m + r)],
                    zf::f32_to_bf16(p))
              << "upload copy of matrix " << i << " column " << columns[u];
        }
      }
      if (host_form) {
        // Consumed columns zeroed, selected ones untouched.
        for (int64_t j = 0; j < start[i].n; ++j) {
          for (int64_t r = 0; r < start[i].m; ++r) {
            const size_t e = start[i].index(j, r);
            const uint16_t want = start[i].is_selected(j) ? host_grads[i].half[e] : uint16_t{0};
            ASSERT_EQ(grads[i].half[e], want) << "gradient of matrix " << i << " column " << j;
          }
        }
      }
    }
    if (!host_form) {
      for (uint16_t g : packed.half) ASSERT_EQ(g, 0) << "the packed gradient is consumed whole";
    }
    results.push_back(matrices);
  }
  for (size_t run = 1; run < results.size(); ++run) {
    for (size_t i = 0; i < count; ++i) EXPECT_TRUE(results[run][i] == results[0][i]) << "run " << run;
  }
}

INSTANTIATE_TEST_SUITE_P(LevelsFormsIncrement, SkipColumns,
                         ::testing::Combine(::testing::ValuesIn(kLevels),
                                            ::testing::Values(GradForm::kHostLayout, GradForm::kPacked),
                                            ::testing::Bool()));

TEST(SkipColumnsFlags, ZeroGradOnlyWhenAskedAndCountsUsedAsGiven) {
  std::mt19937_64 rng(9);
  std::vector<ColumnMatrix> matrices = {random_column_matrix(20, 9, {3, 4, 11}, rng)};
  Buffer grad(ZF_DTYPE_F32, 180);
  std::normal_distribution<float> normal;
  for (size_t e = 0; e < grad.size(); ++e) grad.set(e, normal(rng));
  const Buffer grad_before = grad;
  const std::vector<ColumnMatrix> before = matrices;
  const auto grad_of = [&](size_t, int64_t j, int64_t, int64_t r) { return grad_before.get(before[0].index(j, r)); };
  zenflow::cpu_adamw_step_skip_columns({matrices[0].state()}, {matrices[0].selected_tensor()}, {grad.tensor({20, 9})},
                                       nullptr, nullptr, {kLr}, {kWeightDecay});
  EXPECT_TRUE(grad.bitwise_equal(grad_before)) << "the gradient was zeroed without ZF_CPU_ADAMW_ZERO_GRAD";
  const std::vector<ColumnMatrix> expected =
      column_step_reference(before, grad_of, {kLr}, {kWeightDecay}, zenflow::adam_hparams(), 1.0f, false);
  EXPECT_TRUE(matrices[0] == expected[0]) << "counts are used as they are without ZF_CPU_ADAMW_INCREMENT_STEPS";
  EXPECT_EQ(matrices[0].steps, before[0].steps);
}

// The column step's plan runs without the entry point's count checks (the engine runs it at
// every window close, its counts bounded by the engine): with ZF_CPU_ADAMW_INCREMENT_STEPS a
// count at INT32_MAX takes step INT32_MAX and stays, as a count of INT32_MAX - 1 would, never
// INT32_MAX + 1 (a signed overflow the sanitizer builds would report).
TEST(SkipColumnsFlags, PlanSaturatesACountAtInt32Max) {
  std::mt19937_64 rng(10);
  const std::vector<ColumnMatrix> start = {random_column_matrix(12, 5, {2, 7}, rng)};
  std::vector<ColumnMatrix> at_max = start, below_max = start;
  for (size_t j = 0; j < 12; ++j) {
    at_max[0].steps[j] = j % 2 == 0 ? INT32_MAX : 3;  // runs of the two counts
    below_max[0].steps[j] = j % 2 == 0 ? INT32_MAX - 1 : 3;
  }
  std::vector<float> grad(60);
  std::normal_distribution<float> normal;
  for (float& g : grad) g = normal(rng);
  const zf_tensor selected = i32_tensor(at_max[0].selected);
  const zf_tensor grad_tensor = f32_tensor(grad, {12, 5});
  const uint32_t flags = ZF_CPU_ADAMW_INCREMENT_STEPS;
  for (std::vector<ColumnMatrix>* matrices : {&at_max, &below_max}) {
    const zf_column_state state = (*matrices)[0].state();
    zf::ColumnStepPlan plan;
    plan.build(&state, &selected, 1, &grad_tensor, nullptr, nullptr);
    const double lr = kLr, weight_decay = kWeightDecay;
    plan.run(*zf::global_thread_pool(), zf::ColumnStepPointers{&state, &grad_tensor, nullptr, nullptr},
             zf::AdamRunValues{&lr, &weight_decay, zenflow::adam_hparams(), 1.0f, flags});
  }
  EXPECT_EQ(at_max[0].master, below_max[0].master);
  EXPECT_EQ(at_max[0].exp_avg, below_max[0].exp_avg);
  // Unselected columns: even ones at INT32_MAX either way, odd ones 3 + 1; selected ones as given.
  std::vector<int32_t> expected_at_max(12), expected_below_max(12);
  for (size_t j = 0; j < 12; ++j) {
    expected_at_max[j] = j % 2 == 0 ? INT32_MAX : 4;
    expected_below_max[j] = expected_at_max[j];
  }
  expected_below_max[2] = INT32_MAX - 1;
  expected_at_max[7] = expected_below_max[7] = 3;
  EXPECT_EQ(at_max[0].steps, expected_at_max);
  EXPECT_EQ(below_max[0].steps, expected_below_max);
}

// ---- a column step standing for several steps (AdamRunValues::step_span) ----

// With step_span S the unselected columns get one update standing for S steps of the same
// gradient: moments decayed by beta^S, counts advanced by S (saturating at INT32_MAX), bias
// corrections from the advanced count. Checked against float64 at every level this CPU has,
// for spans 1 to 16 and counts from 0 to near INT32_MAX; span 1 is bitwise the plain step.
TEST(ColumnStepSpan, StandsForSpanStepsOfOneGradientWithinFloat32OfFloat64) {
  std::mt19937_64 rng(29);
  std::normal_distribution<float> normal;
  const int64_t n = 37, m = 13;  // primes: vector bodies and tails
  const ColumnMatrix start = [&] {
    ColumnMatrix c = random_column_matrix(n, m, {3, 4, 30}, rng);
    for (int64_t j = 0; j < n; ++j) c.steps[static_cast<size_t>(j)] = j < 5 ? 0 : (j > 33 ? INT32_MAX - 2 : 17);
    return c;
  }();
  std::vector<float> grad(static_cast<size_t>(n * m));
  for (float& g : grad) g = normal(rng);
  const double lr = kLr, weight_decay = kWeightDecay;
  const zf_adam_hparams hparams = zenflow::adam_hparams();
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    for (const int32_t span : {1, 2, 3, 4, 7, 16}) {
      ColumnMatrix got = start;
      const zf_column_state state = got.state();
      const zf_tensor selected = got.selected_tensor();
      const zf_tensor grad_tensor = f32_tensor(grad, {n, m});
      zf::ColumnStepPlan plan;
      plan.build(&state, &selected, 1, &grad_tensor, nullptr, nullptr);
      zf::AdamRunValues values{&lr, &weight_decay, hparams, 0.5f, ZF_CPU_ADAMW_INCREMENT_STEPS};
      values.step_span = span;
      plan.run(*zf::global_thread_pool(), zf::ColumnStepPointers{&state, &grad_tensor, nullptr, nullptr}, values);
      const std::string where = std::string(zf_simd_level_name(level)) + " span " + std::to_string(span);
      if (span == 1) {  // the default values: the plain step, bit for bit
        ColumnMatrix plain = start;
        const zf_column_state plain_state = plain.state();
        zf::ColumnStepPlan plain_plan;
        plain_plan.build(&plain_state, &selected, 1, &grad_tensor, nullptr, nullptr);
        plain_plan.run(*zf::global_thread_pool(), zf::ColumnStepPointers{&plain_state, &grad_tensor, nullptr, nullptr},
                       zf::AdamRunValues{&lr, &weight_decay, hparams, 0.5f, ZF_CPU_ADAMW_INCREMENT_STEPS});
        EXPECT_TRUE(got == plain) << where;
      }
      const double d1 = std::pow(hparams.beta1, span), d2 = std::pow(hparams.beta2, span);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t before = start.steps[static_cast<size_t>(j)];
        if (start.is_selected(j)) {
          EXPECT_EQ(got.steps[static_cast<size_t>(j)], before) << where;
          continue;
        }
        const int64_t count = std::min<int64_t>(before + span, INT32_MAX);
        ASSERT_EQ(got.steps[static_cast<size_t>(j)], count) << where << " column " << j;
        const double bc1 = 1.0 - std::pow(hparams.beta1, static_cast<double>(count));
        const double bc2 = 1.0 - std::pow(hparams.beta2, static_cast<double>(count));
        for (int64_t r = 0; r < m; ++r) {
          const size_t e = start.index(j, r);
          const double g = 0.5 * grad[static_cast<size_t>(j * m + r)];
          const double mom = d1 * start.exp_avg[e] + (1.0 - d1) * g;
          const double var = d2 * start.exp_avg_sq[e] + (1.0 - d2) * g * g;
          const double p = start.master[e] * (1.0 - lr * weight_decay) -
                           lr / bc1 * mom / (std::sqrt(var) / std::sqrt(bc2) + hparams.eps);
          EXPECT_NEAR(got.exp_avg[e], mom, 1e-6 * (1.0 + std::fabs(mom))) << where;
          EXPECT_NEAR(got.exp_avg_sq[e], var, 1e-6 * (1.0 + std::fabs(var))) << where;
          EXPECT_NEAR(got.master[e], p, 2e-6 * (1.0 + std::fabs(p))) << where << " column " << j << " row " << r;
        }
      }
    }
  }
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
  std::vector<float> acc(static_cast<size_t>(n * m)), other(77);
  for (float& a : acc) a = normal(rng);
  for (float& a : other) a = normal(rng);
  const std::vector<float> acc_before = acc, other_before = other;

  // Nothing selected: each accumulator's region is its elements in order, whatever its shape.
  Buffer block(dtype, acc.size() + other.size());
  for (size_t i = 0; i < block.size(); ++i) block.set(i, normal(rng));
  zenflow::cpu_accumulate({f32_tensor(acc, {n * m}), f32_tensor(other, {7, 11})}, {}, block.tensor(), 0.3f);
  for (size_t i = 0; i < acc.size(); ++i) {
    ASSERT_EQ(zf::f32_bits(acc[i]), zf::f32_bits(zf::accumulate_element(acc_before[i], block.get(i), 0.3f)));
  }
  for (size_t i = 0; i < other.size(); ++i) {
    ASSERT_EQ(zf::f32_bits(other[i]),
              zf::f32_bits(zf::accumulate_element(other_before[i], block.get(acc.size() + i), 0.3f)));
  }

  // Packed unselected columns.
  std::vector<int32_t> selected = {2, 3, 4, 17, 28};
  const int64_t k = static_cast<int64_t>(selected.size());
  Buffer packed(dtype, static_cast<size_t>((n - k) * m));
  for (size_t i = 0; i < packed.size(); ++i) packed.set(i, normal(rng));
  const std::vector<float> acc_mid = acc;
  zenflow::cpu_accumulate({f32_tensor(acc, {n, m})}, {i32_tensor(selected)}, packed.tensor(), 2.0f);
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

// The buffer exactly as zf_pack_columns writes it (pack.h: packed[offset_i + j * m_i + r] =
// G_i[r, j-th unselected column], offsets from zf_packed_layout) is added into the host
// layout accumulators, which hold G_i transposed: the host consumes the device's buffer as
// it is, with no reshuffle. Then the step consumes the same buffer as packed_grads and
// must agree bit for bit with the step fed the transposed gradients in host layout.
TEST(AccumulatePackedBuffer, ConsumesTheBufferPackColumnsWrites) {
  std::mt19937_64 rng(31);
  std::vector<ColumnMatrix> matrices;
  matrices.push_back(random_column_matrix(37, 11, zf_test::random_selection(37, 9, rng), rng));
  matrices.push_back(random_column_matrix(1, 5, {}, rng));
  matrices.push_back(random_column_matrix(64, 3, {0, 63}, rng));
  matrices.push_back(random_column_matrix(8, 2, {0, 1, 2, 3, 4, 5, 6, 7}, rng));
  const size_t count = matrices.size();
  const std::vector<int64_t> offsets = packed_offsets(matrices);
  // Row-major device gradients G_i [m_i, n_i] (bf16), and their pack.
  std::vector<zf_test::HostMatrix> device_grads;
  Buffer packed(ZF_DTYPE_BF16, static_cast<size_t>(offsets[count]));
  for (size_t i = 0; i < count; ++i) {
    const ColumnMatrix& c = matrices[i];
    device_grads.push_back(zf_test::random_matrix(ZF_DTYPE_BF16, c.m, c.n, rng));
    const std::vector<int64_t> columns = c.unselected();
    for (size_t u = 0; u < columns.size(); ++u) {
      for (int64_t r = 0; r < c.m; ++r) {
        packed.half[static_cast<size_t>(offsets[i] + static_cast<int64_t>(u) * c.m + r)] =
            device_grads[i].half[static_cast<size_t>(r * c.n + columns[u])];
      }
    }
  }

  std::vector<std::vector<float>> accumulators;
  std::vector<zf_tensor> acc_tensors, selected;
  for (size_t i = 0; i < count; ++i) {
    accumulators.push_back(matrices[i].exp_avg);  // any starting values
    acc_tensors.push_back(f32_tensor(accumulators[i], {matrices[i].n, matrices[i].m}));
    selected.push_back(matrices[i].selected_tensor());
  }
  const std::vector<std::vector<float>> before = accumulators;
  zenflow::cpu_accumulate(acc_tensors, selected, packed.tensor(), 0.5f);
  for (size_t i = 0; i < count; ++i) {
    const ColumnMatrix& c = matrices[i];
    for (int64_t j = 0; j < c.n; ++j) {
      for (int64_t r = 0; r < c.m; ++r) {
        const size_t e = c.index(j, r);
        const float g = static_cast<float>(device_grads[i].values[static_cast<size_t>(r * c.n + j)]);
        const float want = c.is_selected(j) ? before[i][e] : zf::accumulate_element(before[i][e], g, 0.5f);
        ASSERT_EQ(zf::f32_bits(accumulators[i][e]), zf::f32_bits(want)) << "matrix " << i << " column " << j;
      }
    }
  }

  // The step on the same buffer, against the step on the transposed gradients.
  std::vector<ColumnMatrix> from_packed = matrices, from_host = matrices;
  std::vector<Buffer> transposed;
  std::vector<zf_column_state> packed_state, host_state;
  std::vector<zf_tensor> host_grads;
  for (size_t i = 0; i < count; ++i) {
    const ColumnMatrix& c = matrices[i];
    transposed.emplace_back(ZF_DTYPE_BF16, static_cast<size_t>(c.n * c.m));
    for (int64_t j = 0; j < c.n; ++j) {
      for (int64_t r = 0; r < c.m; ++r) {
        transposed[i].half[c.index(j, r)] = device_grads[i].half[static_cast<size_t>(r * c.n + j)];
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    packed_state.push_back(from_packed[i].state());
    host_state.push_back(from_host[i].state());
    host_grads.push_back(transposed[i].tensor({matrices[i].n, matrices[i].m}));
  }
  const zf_tensor packed_tensor = packed.tensor();
  const std::vector<double> lr(count, kLr), weight_decay(count, kWeightDecay);
  zenflow::cpu_adamw_step_skip_columns(packed_state, selected, {}, &packed_tensor, nullptr, lr, weight_decay,
                                       zenflow::adam_hparams(), 1.0f, ZF_CPU_ADAMW_INCREMENT_STEPS);
  zenflow::cpu_adamw_step_skip_columns(host_state, selected, host_grads, nullptr, nullptr, lr, weight_decay,
                                       zenflow::adam_hparams(), 1.0f, ZF_CPU_ADAMW_INCREMENT_STEPS);
  for (size_t i = 0; i < count; ++i) EXPECT_TRUE(from_packed[i] == from_host[i]) << "matrix " << i;
}

// ---- gather / scatter ----

// Gathers `columns` of every matrix into poisoned lists, checks them against the host
// state, scatters them into a poisoned fresh host state, and checks that the listed
// columns came back bit for bit while every other column stayed poisoned.
void expect_gather_scatter_round_trip(std::vector<ColumnMatrix> matrices,
                                      const std::vector<std::vector<int32_t>>& lists, bool with_master) {
  const size_t count = matrices.size();
  const float poison = zf::f32_from_bits(0x7fc0beefu);
  std::vector<ColumnMatrix> out(count), fresh(count);
  std::vector<std::vector<int32_t>> columns = lists;
  std::vector<zf_column_state> host_state, out_state, fresh_state;
  std::vector<zf_tensor> column_tensors;
  for (size_t i = 0; i < count; ++i) {
    ColumnMatrix& c = matrices[i];
    if (!with_master) c.master.clear();
    const int64_t moved = static_cast<int64_t>(columns[i].size());
    out[i].n = moved;
    out[i].m = c.m;
    out[i].master.assign(with_master ? static_cast<size_t>(moved * c.m) : 0, poison);
    out[i].exp_avg.assign(static_cast<size_t>(moved * c.m), poison);
    out[i].exp_avg_sq.assign(static_cast<size_t>(moved * c.m), poison);
    out[i].steps.assign(static_cast<size_t>(moved), -7);
    fresh[i].n = c.n;
    fresh[i].m = c.m;
    fresh[i].master.assign(with_master ? c.master.size() : 0, poison);
    fresh[i].exp_avg.assign(c.exp_avg.size(), poison);
    fresh[i].exp_avg_sq.assign(c.exp_avg_sq.size(), poison);
    fresh[i].steps.assign(c.steps.size(), -7);
    host_state.push_back(c.state());
    out_state.push_back(out[i].state());
    fresh_state.push_back(fresh[i].state());
    column_tensors.push_back(i32_tensor(columns[i]));
  }
  zenflow::cpu_gather_columns(host_state, column_tensors, out_state);
  zenflow::cpu_scatter_columns(out_state, column_tensors, fresh_state);
  for (size_t i = 0; i < count; ++i) {
    const ColumnMatrix& c = matrices[i];
    std::vector<bool> moved(static_cast<size_t>(c.n), false);
    for (size_t p = 0; p < columns[i].size(); ++p) {
      const int64_t j = columns[i][p];
      moved[static_cast<size_t>(j)] = true;
      EXPECT_EQ(out[i].steps[p], c.steps[static_cast<size_t>(j)]);
      for (int64_t r = 0; r < c.m; ++r) {
        const size_t listed = static_cast<size_t>(static_cast<int64_t>(p) * c.m + r);
        if (with_master) {
          ASSERT_EQ(zf::f32_bits(out[i].master[listed]), zf::f32_bits(c.master[c.index(j, r)]));
        }
        ASSERT_EQ(zf::f32_bits(out[i].exp_avg[listed]), zf::f32_bits(c.exp_avg[c.index(j, r)]));
        ASSERT_EQ(zf::f32_bits(out[i].exp_avg_sq[listed]), zf::f32_bits(c.exp_avg_sq[c.index(j, r)]));
      }
    }
    for (int64_t j = 0; j < c.n; ++j) {
      const bool back = moved[static_cast<size_t>(j)];
      EXPECT_EQ(fresh[i].steps[static_cast<size_t>(j)], back ? c.steps[static_cast<size_t>(j)] : -7);
      for (int64_t r = 0; r < c.m; ++r) {
        const size_t e = c.index(j, r);
        if (with_master) {
          ASSERT_EQ(zf::f32_bits(fresh[i].master[e]), zf::f32_bits(back ? c.master[e] : poison)) << i << " " << j;
        }
        ASSERT_EQ(zf::f32_bits(fresh[i].exp_avg[e]), zf::f32_bits(back ? c.exp_avg[e] : poison)) << i << " " << j;
        ASSERT_EQ(zf::f32_bits(fresh[i].exp_avg_sq[e]), zf::f32_bits(back ? c.exp_avg_sq[e] : poison)) << i << " " << j;
      }
    }
  }
}

TEST(GatherScatter, RoundTripKeepsBits) {
  std::mt19937_64 rng(41);
  // Prime shapes, 1 x N and N x 1 (host layout [n, m]: one row, or one column), empty
  // lists, every column, and a matrix large enough for the copy to go parallel.
  std::vector<ColumnMatrix> matrices;
  std::vector<std::vector<int32_t>> lists;
  auto add = [&](int64_t n, int64_t m, std::vector<int32_t> list) {
    matrices.push_back(random_column_matrix(n, m, {}, rng));
    lists.push_back(std::move(list));
  };
  add(13, 7, {0, 5, 12});
  add(1, 31, {0});         // one column of 31 rows
  add(31, 1, {2, 3, 29});  // 31 columns of one row
  add(17, 3, {});          // nothing moves
  add(5, 11, {0, 1, 2, 3, 4});
  add(997, 67, zf_test::random_selection(997, 499, rng));
  for (const bool with_master : {true, false}) {
    for (const int threads : {1, 3}) {
      zenflow::ScopedNumThreads pool(threads);
      expect_gather_scatter_round_trip(matrices, lists, with_master);
    }
  }
  expect_gather_scatter_round_trip({}, {}, true);  // an empty call
}

// ---- plans: built once, run many times with fresh pointers ----

TEST(CpuAdamwPlans, BuiltOnceRunManyTimesMatchesEntryPoints) {
  std::mt19937_64 rng(51);
  std::normal_distribution<float> normal;
  const std::vector<ColumnMatrix> start = step_matrices(rng);
  const size_t count = start.size();
  const std::vector<int64_t> offsets = packed_offsets(start);
  const size_t packed_size = static_cast<size_t>(offsets[count]);
  const zf_adam_hparams h = zenflow::adam_hparams(0.9, 0.95, 1e-8, ZF_ADAM_MODE_ADAMW);
  std::vector<std::vector<int32_t>> selections;
  for (const ColumnMatrix& c : start) selections.push_back(c.selected);
  std::vector<zf_tensor> selected;
  for (auto& s : selections) selected.push_back(i32_tensor(s));

  // The plans are built from one set of buffers (the structure), then run on others.
  std::vector<ColumnMatrix> plan_state = start, entry_state = start;
  std::vector<zf_column_state> build_state;
  for (auto& c : plan_state) build_state.push_back(c.state());
  Buffer build_packed(ZF_DTYPE_F16, packed_size), build_out(ZF_DTYPE_BF16, packed_size);
  const zf_tensor build_packed_tensor = build_packed.tensor(), build_out_tensor = build_out.tensor();
  zf::ColumnStepPlan step_plan;
  step_plan.build(build_state.data(), selected.data(), count, nullptr, &build_packed_tensor, &build_out_tensor);
  std::vector<std::vector<float>> plan_acc, entry_acc;
  std::vector<zf_tensor> build_acc;
  for (const ColumnMatrix& c : start) plan_acc.push_back(c.exp_avg);
  entry_acc = plan_acc;
  for (size_t i = 0; i < count; ++i) build_acc.push_back(f32_tensor(plan_acc[i], {start[i].n, start[i].m}));
  zf::AccumulatePlan accumulate_plan;
  accumulate_plan.build(build_acc.data(), selected.data(), count, &build_packed_tensor);
  EXPECT_EQ(step_plan.layout().total(), offsets[count]);
  EXPECT_EQ(accumulate_plan.layout().total(), offsets[count]);

  zf::ThreadPool own_pool(3);  // any pool runs a plan, not only the global one
  for (int round = 0; round < 3; ++round) {
    const std::vector<double> lr(count, 1e-3 * (round + 1)), weight_decay(count, 0.01 * round);
    // Fresh buffers every round: the state moves to new memory, the gradients are new.
    plan_state = std::vector<ColumnMatrix>(plan_state);
    std::vector<std::vector<float>> fresh_acc = plan_acc;
    plan_acc.swap(fresh_acc);
    Buffer packed(ZF_DTYPE_F16, packed_size);
    for (size_t e = 0; e < packed_size; ++e) packed.set(e, normal(rng));
    Buffer entry_packed = packed, plan_out(ZF_DTYPE_BF16, packed_size), entry_out(ZF_DTYPE_BF16, packed_size);

    std::vector<zf_tensor> plan_acc_tensors, entry_acc_tensors;
    std::vector<zf_column_state> plan_states, entry_states;
    for (size_t i = 0; i < count; ++i) {
      plan_acc_tensors.push_back(f32_tensor(plan_acc[i], {start[i].n, start[i].m}));
      entry_acc_tensors.push_back(f32_tensor(entry_acc[i], {start[i].n, start[i].m}));
      plan_states.push_back(plan_state[i].state());
      entry_states.push_back(entry_state[i].state());
    }
    const std::shared_ptr<zf::ThreadPool> global_pool = zf::global_thread_pool();
    zf::ThreadPool& pool = round == 1 ? own_pool : *global_pool;
    // Round 2 runs as parts of a pass past the streaming threshold (the engine's bucket by
    // bucket, matrix by matrix passes): the same bits through the non-temporal stores, with
    // the accumulate overwriting (a window's first), as adding into zeros does (the selected
    // columns, which neither touches, zeroed on both sides).
    const int64_t pass_elements = round == 2 ? int64_t{1} << 30 : 0;
    const std::vector<uint8_t> overwrite(count, round == 2 ? 1 : 0);
    if (round == 2) {
      for (auto& acc : entry_acc) std::fill(acc.begin(), acc.end(), 0.0f);
      for (auto& acc : plan_acc) std::fill(acc.begin(), acc.end(), 0.0f);
    }
    accumulate_plan.run(pool, plan_acc_tensors.data(), packed.data(), 0.25f, overwrite.data(), pass_elements);
    zenflow::cpu_accumulate(entry_acc_tensors, selected, entry_packed.tensor(), 0.25f);
    for (size_t i = 0; i < count; ++i) ASSERT_TRUE(same_bits(plan_acc[i], entry_acc[i])) << "round " << round;

    const uint32_t flags = ZF_CPU_ADAMW_ZERO_GRAD | ZF_CPU_ADAMW_INCREMENT_STEPS;
    zf::AdamRunValues values{lr.data(), weight_decay.data(), h, 0.5f, flags};
    values.pass_elements = pass_elements;
    step_plan.run(pool, zf::ColumnStepPointers{plan_states.data(), nullptr, packed.data(), plan_out.data()}, values);
    const zf_tensor entry_packed_tensor = entry_packed.tensor(), entry_out_tensor = entry_out.tensor();
    zenflow::cpu_adamw_step_skip_columns(entry_states, selected, {}, &entry_packed_tensor, &entry_out_tensor, lr,
                                         weight_decay, h, 0.5f, flags);
    for (size_t i = 0; i < count; ++i) ASSERT_TRUE(plan_state[i] == entry_state[i]) << "round " << round;
    ASSERT_TRUE(plan_out.bitwise_equal(entry_out)) << "round " << round;
    ASSERT_TRUE(packed.bitwise_equal(entry_packed)) << "round " << round;
  }

  // The dense plan likewise, with steps and learning rates changing between runs.
  std::vector<AdamState> plan_dense, entry_dense;
  for (const size_t n : {size_t{40001}, size_t{3}, size_t{1000}})
    plan_dense.push_back(random_state(n, ZF_DTYPE_BF16, rng));
  entry_dense = plan_dense;
  std::vector<zf_tensor> p, m, v, g;
  for (auto& s : plan_dense) {
    p.push_back(f32_tensor(s.param));
    m.push_back(f32_tensor(s.exp_avg));
    v.push_back(f32_tensor(s.exp_avg_sq));
    g.push_back(s.grad.tensor());
  }
  zf::AdamwStepPlan dense_plan;
  dense_plan.build(p.data(), m.data(), v.data(), g.data(), nullptr, plan_dense.size());
  for (int64_t t = 1; t <= 3; ++t) {
    plan_dense = std::vector<AdamState>(plan_dense);
    p.clear();
    m.clear();
    v.clear();
    g.clear();
    std::vector<zf_tensor> ep, em, ev, eg;
    for (size_t i = 0; i < plan_dense.size(); ++i) {
      refill_grad(plan_dense[i], rng);
      entry_dense[i].grad = plan_dense[i].grad;
      p.push_back(f32_tensor(plan_dense[i].param));
      m.push_back(f32_tensor(plan_dense[i].exp_avg));
      v.push_back(f32_tensor(plan_dense[i].exp_avg_sq));
      g.push_back(plan_dense[i].grad.tensor());
      ep.push_back(f32_tensor(entry_dense[i].param));
      em.push_back(f32_tensor(entry_dense[i].exp_avg));
      ev.push_back(f32_tensor(entry_dense[i].exp_avg_sq));
      eg.push_back(entry_dense[i].grad.tensor());
    }
    const std::vector<int64_t> steps = {t, t + 1, t};
    const std::vector<double> lr = {1e-3 * t, 1e-3, 2e-3}, weight_decay = {0.1, 0.1, 0.0};
    dense_plan.run(*zf::global_thread_pool(), zf::AdamwStepPointers{p.data(), m.data(), v.data(), g.data(), nullptr},
                   steps.data(), zf::AdamRunValues{lr.data(), weight_decay.data(), h, 1.0f, 0});
    zenflow::cpu_adamw_step(ep, em, ev, eg, {}, steps, lr, weight_decay, h, 1.0f);
    for (size_t i = 0; i < plan_dense.size(); ++i) ASSERT_TRUE(plan_dense[i] == entry_dense[i]) << "step " << t;
  }
}

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

zf_status call_step(zf_tensor p, zf_tensor m, zf_tensor v, zf_tensor g, zf_adam_hparams h, int64_t step_count = 1,
                    float grad_scale = 1.0f, double lr = kLr, double weight_decay = kWeightDecay) {
  return zf_cpu_adamw_step(&p, &m, &v, &g, nullptr, 1, &step_count, &lr, &weight_decay, &h, grad_scale,
                           ZF_CPU_ADAMW_ZERO_GRAD);
}

// `untouched` is called after the call has run (an argument would be evaluated in any order).
template <class Untouched>
void expect_error(zf_status status, zf_status expected, const char* fragment, const Untouched& untouched) {
  EXPECT_EQ(status, expected) << zf_last_error();
  EXPECT_NE(std::string(zf_last_error()).find(fragment), std::string::npos)
      << "message \"" << zf_last_error() << "\" lacks \"" << fragment << "\"";
  EXPECT_TRUE(untouched()) << "a failed call wrote to its buffers (" << fragment << ")";
}

TEST(CpuAdamwBadInput, ClearErrorsAndNothingWritten) {
  BadInputCase c;
  const auto c_untouched = [&] { return c.untouched(); };
  auto t = [](std::vector<float>& x, int64_t n = 64) { return f32_tensor(x, {n}); };
  const zf_adam_hparams good = zenflow::adam_hparams();
  const double nan = std::numeric_limits<double>::quiet_NaN();

  zf_adam_hparams h = good;
  h.beta1 = 1.0;
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.beta1", c_untouched);
  h = good;
  h.beta2 = nan;
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.beta2", c_untouched);
  h = good;
  h.eps = -1.0;
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.eps", c_untouched);
  h = good;
  const int unknown_mode = 7;  // as a C caller could pass it
  static_assert(sizeof(h.mode) == sizeof(unknown_mode), "zf_adam_mode is an int");
  std::memcpy(&h.mode, &unknown_mode, sizeof(unknown_mode));
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), h), ZF_ERROR_INVALID_VALUE, "hparams.mode", c_untouched);
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), good, 1, 1.0f, nan), ZF_ERROR_INVALID_VALUE, "lr[0]",
               c_untouched);
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), good, 1, 1.0f, -1e-3), ZF_ERROR_INVALID_VALUE, "lr[0]",
               c_untouched);
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), good, 1, 1.0f, kLr, std::numeric_limits<double>::infinity()),
               ZF_ERROR_INVALID_VALUE, "weight_decay[0]", c_untouched);
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), good, 1, std::nanf("")), ZF_ERROR_INVALID_VALUE, "grad_scale",
               c_untouched);
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g), good, 0), ZF_ERROR_INVALID_VALUE, "steps[0]", c_untouched);
  expect_error(call_step(t(c.p), t(c.m), t(c.v, 63), t(c.g), good), ZF_ERROR_INVALID_VALUE, "exp_avg_sqs[0]",
               c_untouched);
  expect_error(call_step(t(c.p), t(c.m), t(c.v), t(c.g, 32), good), ZF_ERROR_INVALID_VALUE, "grads[0]", c_untouched);

  zf_tensor misaligned = t(c.m, 32);
  misaligned.data = reinterpret_cast<char*>(c.m.data()) + 2;
  expect_error(call_step(t(c.p, 32), misaligned, t(c.v, 32), t(c.g, 32), good), ZF_ERROR_INVALID_VALUE, "exp_avgs[0]",
               c_untouched);
  zf_tensor strided = t(c.g, 32);
  strided.strides[0] = 2;
  expect_error(call_step(t(c.p, 32), t(c.m, 32), t(c.v, 32), strided, good), ZF_ERROR_INVALID_VALUE, "grads[0]",
               c_untouched);
  expect_error(call_step(t(c.p), t(c.p), t(c.v), t(c.g), good), ZF_ERROR_INVALID_VALUE, "overlaps", c_untouched);
  zf_tensor as_int = t(c.g);
  as_int.dtype = ZF_DTYPE_I32;
  expect_error(call_step(t(c.p), t(c.m), t(c.v), as_int, good), ZF_ERROR_INVALID_TYPE, "grads[0]", c_untouched);
  zf_tensor on_gpu = t(c.p);
  on_gpu.device = zenflow::cuda_device(0);
  expect_error(call_step(on_gpu, t(c.m), t(c.v), t(c.g), good), ZF_ERROR_INVALID_TYPE, "params[0]", c_untouched);
  // A shape whose element count overflows would look small after wrapping: rejected.
  zf_tensor huge = t(c.g);  // [2^40, 2^40], set by hand: contiguous_tensor would overflow computing strides
  huge.ndim = 2;
  huge.shape[0] = huge.shape[1] = huge.strides[0] = int64_t{1} << 40;
  huge.strides[1] = 1;
  expect_error(call_step(t(c.p), t(c.m), t(c.v), huge, good), ZF_ERROR_INVALID_VALUE, "PTRDIFF_MAX", c_untouched);
  zf_cpu_adamw_step(nullptr, nullptr, nullptr, nullptr, nullptr, 1, nullptr, nullptr, nullptr, &good, 1.0f, 0);
  EXPECT_NE(std::string(zf_last_error()).find("NULL array"), std::string::npos) << zf_last_error();

  // The skip-columns step on an [8, 8] host-layout matrix.
  std::vector<int32_t> counts(8, 1);
  auto skip_call = [&](std::vector<int32_t> sel, uint32_t flags = ZF_CPU_ADAMW_ZERO_GRAD) {
    zf_column_state state{t(c.p), f32_tensor(c.m, {8, 8}), t(c.v), i32_tensor(counts)};
    zf_tensor g = t(c.g);
    zf_tensor s = i32_tensor(sel);
    const double lr = kLr, weight_decay = kWeightDecay;
    return zf_cpu_adamw_step_skip_columns(&state, &s, 1, &g, nullptr, nullptr, &lr, &weight_decay, &good, 1.0f, flags);
  };
  expect_error(skip_call({3, 1}), ZF_ERROR_INVALID_VALUE, "strictly increasing", c_untouched);
  expect_error(skip_call({1, 1}), ZF_ERROR_INVALID_VALUE, "strictly increasing", c_untouched);
  expect_error(skip_call({2, 8}), ZF_ERROR_INVALID_VALUE, "selected[0]", c_untouched);
  expect_error(skip_call({-1}), ZF_ERROR_INVALID_VALUE, "outside [0, 8)", c_untouched);
  expect_error(skip_call({1}, 4u), ZF_ERROR_INVALID_VALUE, "flags", c_untouched);
  {
    zf_column_state state{t(c.p), f32_tensor(c.m, {8, 8}), t(c.v), i32_tensor(counts)};
    zf_tensor g = t(c.g);
    const double lr = kLr, weight_decay = kWeightDecay;
    expect_error(
        zf_cpu_adamw_step_skip_columns(&state, nullptr, 1, &g, &g, nullptr, &lr, &weight_decay, &good, 1.0f, 0),
        ZF_ERROR_INVALID_VALUE, "exactly one", c_untouched);
    expect_error(zf_cpu_adamw_step_skip_columns(&state, nullptr, 1, nullptr, nullptr, nullptr, &lr, &weight_decay,
                                                &good, 1.0f, 0),
                 ZF_ERROR_INVALID_VALUE, "exactly one", c_untouched);
    zf_tensor short_packed = t(c.g, 63);
    expect_error(zf_cpu_adamw_step_skip_columns(&state, nullptr, 1, nullptr, &short_packed, nullptr, &lr, &weight_decay,
                                                &good, 1.0f, 0),
                 ZF_ERROR_INVALID_VALUE, "packed_grads", c_untouched);
    state.master = t(c.p, 0);
    expect_error(
        zf_cpu_adamw_step_skip_columns(&state, nullptr, 1, &g, nullptr, nullptr, &lr, &weight_decay, &good, 1.0f, 0),
        ZF_ERROR_INVALID_VALUE, "state[0].master", c_untouched);
  }
  EXPECT_EQ(skip_call({1, 2}), ZF_SUCCESS) << zf_last_error();
  EXPECT_FALSE(c.untouched());

  // Accumulate: a packed buffer of the wrong size, a NaN scale.
  BadInputCase d;
  const auto d_untouched = [&] { return d.untouched(); };
  zf_tensor acc = f32_tensor(d.p, {64});
  zf_tensor block = f32_tensor(d.g, {63});
  expect_error(zf_cpu_accumulate(&acc, nullptr, 1, &block, 1.0f), ZF_ERROR_INVALID_VALUE, "packed", d_untouched);
  block.shape[0] = 64;
  expect_error(zf_cpu_accumulate(&acc, nullptr, 1, &block, std::nanf("")), ZF_ERROR_INVALID_VALUE, "scale",
               d_untouched);
  expect_error(zf_cpu_accumulate(&acc, nullptr, 1, nullptr, 1.0f), ZF_ERROR_INVALID_VALUE, "packed", d_untouched);
}

// Step counts: below 0, or INT32_MAX when the call increments them (it cannot), or below 1
// when used as they are, fail the call before anything is written, naming the column;
// the counts of selected columns are not read.
TEST(CpuAdamwBadInput, StepCountsRejected) {
  BadInputCase c;
  std::vector<int32_t> counts(8, 5), selected = {6};
  const zf_adam_hparams h = zenflow::adam_hparams();
  const double lr = kLr, weight_decay = kWeightDecay;
  auto call = [&](uint32_t flags) {
    zf_column_state state{f32_tensor(c.p, {8, 8}), f32_tensor(c.m, {8, 8}), f32_tensor(c.v, {8, 8}),
                          i32_tensor(counts)};
    zf_tensor g = f32_tensor(c.g, {8, 8}), s = i32_tensor(selected);
    return zf_cpu_adamw_step_skip_columns(&state, &s, 1, &g, nullptr, nullptr, &lr, &weight_decay, &h, 1.0f,
                                          flags | ZF_CPU_ADAMW_ZERO_GRAD);
  };
  const auto c_untouched = [&] { return c.untouched(); };
  const std::vector<int32_t> good = counts;
  counts[3] = -1;
  expect_error(call(ZF_CPU_ADAMW_INCREMENT_STEPS), ZF_ERROR_INVALID_VALUE, "state[0].steps[3]: step count -1",
               [&] { return c.untouched() && counts[0] == 5; });
  counts = good;
  counts[7] = INT32_MAX;
  expect_error(call(ZF_CPU_ADAMW_INCREMENT_STEPS), ZF_ERROR_INVALID_VALUE, "state[0].steps[7]", c_untouched);
  EXPECT_NE(std::string(zf_last_error()).find("cannot be incremented"), std::string::npos) << zf_last_error();
  EXPECT_EQ(counts[0], 5);
  counts = good;
  counts[2] = 0;
  expect_error(call(0), ZF_ERROR_INVALID_VALUE, "state[0].steps[2]", c_untouched);
  // Without increment INT32_MAX is a valid step; 0 is valid with increment.
  counts = good;
  counts[7] = INT32_MAX;
  counts[6] = -100;  // selected: not read
  EXPECT_EQ(call(0), ZF_SUCCESS) << zf_last_error();
  EXPECT_EQ(counts[7], INT32_MAX);
  counts[7] = 0;
  EXPECT_EQ(call(ZF_CPU_ADAMW_INCREMENT_STEPS), ZF_SUCCESS) << zf_last_error();
  EXPECT_EQ(counts[7], 1);
  EXPECT_EQ(counts[6], -100);
  EXPECT_EQ(counts[0], 6);

  // Gather and scatter move counts, which must be counts.
  std::vector<float> host_m(8 * 8, 1.0f), host_v(8 * 8, 1.0f), list_m(2 * 8, 3.0f), list_v(2 * 8, 3.0f), no_master;
  std::vector<int32_t> host_counts(8, 2), list_counts(2, 4), columns = {1, 4};
  zf_column_state host{f32_tensor(no_master, {0}), f32_tensor(host_m, {8, 8}), f32_tensor(host_v, {8, 8}),
                       i32_tensor(host_counts)};
  zf_column_state list{f32_tensor(no_master, {0}), f32_tensor(list_m, {2, 8}), f32_tensor(list_v, {2, 8}),
                       i32_tensor(list_counts)};
  zf_tensor column_tensor = i32_tensor(columns);
  host_counts[4] = -3;
  expect_error(zf_cpu_gather_columns(&host, &column_tensor, 1, &list), ZF_ERROR_INVALID_VALUE, "host[0].steps[4]",
               [&] { return list_counts[0] == 4 && list_m[0] == 3.0f; });
  host_counts[4] = 2;
  list_counts[1] = -1;
  expect_error(zf_cpu_scatter_columns(&list, &column_tensor, 1, &host), ZF_ERROR_INVALID_VALUE, "in[0].steps[1]",
               [&] { return host_counts[1] == 2 && host_m[8] == 1.0f; });
}

// No buffer a call writes may share memory with any other buffer of the call, across
// matrices as well as within one; buffers that are only read may.
TEST(CpuAdamwBadInput, OverlapAcrossBuffersRejected) {
  std::vector<float> a(256, 1.0f), b(256, 0.5f), c(256, 0.25f), d(256, 2.0f), e(256, 0.0f), f(256, 0.0f);
  auto untouched = [&] {
    return std::all_of(a.begin(), a.end(), [](float x) { return x == 1.0f; }) &&
           std::all_of(b.begin(), b.end(), [](float x) { return x == 0.5f; }) &&
           std::all_of(c.begin(), c.end(), [](float x) { return x == 0.25f; }) &&
           std::all_of(d.begin(), d.end(), [](float x) { return x == 2.0f; });
  };
  const zf_adam_hparams h = zenflow::adam_hparams();
  const double lr[2] = {kLr, kLr}, weight_decay[2] = {0.0, 0.0};
  const int64_t steps[2] = {1, 1};

  // Two params on the same memory (halves of `a` overlapping by one element).
  {
    zf_tensor p[2] = {contiguous_tensor(a.data(), ZF_DTYPE_F32, {64}),
                      contiguous_tensor(a.data() + 63, ZF_DTYPE_F32, {64})};
    zf_tensor m[2] = {f32_tensor(b, {64}), contiguous_tensor(b.data() + 64, ZF_DTYPE_F32, {64})};
    zf_tensor v[2] = {f32_tensor(c, {64}), contiguous_tensor(c.data() + 64, ZF_DTYPE_F32, {64})};
    zf_tensor g[2] = {f32_tensor(d, {64}), contiguous_tensor(d.data() + 64, ZF_DTYPE_F32, {64})};
    expect_error(zf_cpu_adamw_step(p, m, v, g, nullptr, 2, steps, lr, weight_decay, &h, 1.0f, 0),
                 ZF_ERROR_INVALID_VALUE, "params[", untouched);
    // Two gradients on the same memory are fine while only read, not when zeroed.
    p[1] = contiguous_tensor(a.data() + 64, ZF_DTYPE_F32, {64});
    g[1] = g[0];
    expect_error(zf_cpu_adamw_step(p, m, v, g, nullptr, 2, steps, lr, weight_decay, &h, 1.0f, ZF_CPU_ADAMW_ZERO_GRAD),
                 ZF_ERROR_INVALID_VALUE, "grads[", untouched);
    // An output copy on another tensor's moment.
    zf_tensor out[2] = {f32_tensor(e, {64}), contiguous_tensor(b.data() + 32, ZF_DTYPE_F32, {64})};
    g[1] = contiguous_tensor(d.data() + 64, ZF_DTYPE_F32, {64});
    expect_error(zf_cpu_adamw_step(p, m, v, g, out, 2, steps, lr, weight_decay, &h, 1.0f, 0), ZF_ERROR_INVALID_VALUE,
                 "overlaps", untouched);
    g[1] = g[0];
    EXPECT_EQ(zf_cpu_adamw_step(p, m, v, g, nullptr, 2, steps, lr, weight_decay, &h, 1.0f, 0), ZF_SUCCESS)
        << zf_last_error();
  }
  std::fill(a.begin(), a.end(), 1.0f);
  std::fill(b.begin(), b.end(), 0.5f);
  std::fill(c.begin(), c.end(), 0.25f);

  // The skip-columns step: state[1].steps on selected[0]; packed_out on an accumulator.
  {
    std::vector<int32_t> counts(16, 1), sel = {0, 1};
    counts[8] = 0;  // state[1]'s counts, which selected[0] reads as the indices {0, 1}
    zf_column_state state[2] = {
        {f32_tensor(a, {64}), f32_tensor(b, {8, 8}), f32_tensor(c, {64}),
         contiguous_tensor(counts.data(), ZF_DTYPE_I32, {8})},
        {contiguous_tensor(a.data() + 64, ZF_DTYPE_F32, {64}), contiguous_tensor(b.data() + 64, ZF_DTYPE_F32, {8, 8}),
         contiguous_tensor(c.data() + 64, ZF_DTYPE_F32, {64}),
         contiguous_tensor(counts.data() + 8, ZF_DTYPE_I32, {8})}};
    zf_tensor selected[2] = {contiguous_tensor(counts.data() + 8, ZF_DTYPE_I32, {2}), i32_tensor(sel)};
    zf_tensor grads[2] = {f32_tensor(d, {8, 8}), contiguous_tensor(d.data() + 64, ZF_DTYPE_F32, {8, 8})};
    expect_error(zf_cpu_adamw_step_skip_columns(state, selected, 2, grads, nullptr, nullptr, lr, weight_decay, &h, 1.0f,
                                                ZF_CPU_ADAMW_INCREMENT_STEPS),
                 ZF_ERROR_INVALID_VALUE, "state[1].steps", [&] { return untouched() && counts[8] == 0; });
    selected[0] = i32_tensor(sel);
    zf_tensor packed_out = contiguous_tensor(d.data() + 64, ZF_DTYPE_F32, {12 * 8});
    expect_error(
        zf_cpu_adamw_step_skip_columns(state, selected, 2, grads, nullptr, &packed_out, lr, weight_decay, &h, 1.0f, 0),
        ZF_ERROR_INVALID_VALUE, "packed_out", untouched);
    // Both selections on the same memory: only read, so accepted.
    EXPECT_EQ(zf_cpu_adamw_step_skip_columns(state, selected, 2, grads, nullptr, nullptr, lr, weight_decay, &h, 1.0f,
                                             ZF_CPU_ADAMW_INCREMENT_STEPS),
              ZF_SUCCESS)
        << zf_last_error();
  }
  std::fill(a.begin(), a.end(), 1.0f);
  std::fill(b.begin(), b.end(), 0.5f);
  std::fill(c.begin(), c.end(), 0.25f);

  // Accumulate: the packed buffer on the second accumulator.
  {
    zf_tensor accumulators[2] = {f32_tensor(a, {64}), contiguous_tensor(a.data() + 64, ZF_DTYPE_F32, {64})};
    zf_tensor packed = contiguous_tensor(a.data() + 64, ZF_DTYPE_F32, {128});
    expect_error(zf_cpu_accumulate(accumulators, nullptr, 2, &packed, 1.0f), ZF_ERROR_INVALID_VALUE, "overlaps",
                 untouched);
  }

  // Gather: the list's moments on the host state.
  {
    std::vector<int32_t> counts(8, 1), list_counts(2, 0), columns = {1, 2};
    std::vector<float> none;
    zf_column_state host{f32_tensor(none, {0}), f32_tensor(b, {8, 16}), f32_tensor(c, {8, 16}), i32_tensor(counts)};
    zf_column_state out{f32_tensor(none, {0}), f32_tensor(f, {2, 16}),
                        contiguous_tensor(c.data() + 100, ZF_DTYPE_F32, {2, 16}), i32_tensor(list_counts)};
    zf_tensor column_tensor = i32_tensor(columns);
    expect_error(zf_cpu_gather_columns(&host, &column_tensor, 1, &out), ZF_ERROR_INVALID_VALUE, "out[0].exp_avg_sq",
                 [&] { return untouched() && list_counts[0] == 0; });
  }
}

TEST(CpuAdamwFlat, BadLayoutsRejectedAndNothingWritten) {
  std::vector<float> master(16, 1.0f), m(16, 0.5f), v(16, 0.25f), g0(8, 2.0f), g1(5, 2.0f), out_data(16, 3.0f);
  const auto untouched = [&] {
    for (size_t i = 0; i < 16; ++i) {
      if (master[i] != 1.0f || m[i] != 0.5f || v[i] != 0.25f || out_data[i] != 3.0f) return false;
    }
    return true;
  };
  zf_tensor grads[2] = {f32_tensor(g0), f32_tensor(g1)};
  zf_tensor outs[2] = {f32_tensor(out_data, {8}), contiguous_tensor(out_data.data() + 8, ZF_DTYPE_F32, {5})};
  const zf_tensor master_t = f32_tensor(master), m_t = f32_tensor(m), v_t = f32_tensor(v);
  const int64_t steps[2] = {1, 1};
  const double lr[2] = {kLr, kLr}, wd[2] = {kWeightDecay, kWeightDecay};
  const zf_adam_hparams h = zenflow::adam_hparams();
  auto call = [&](const int64_t* offsets, const int64_t* sizes, const zf_tensor* params, const zf_tensor* flat_master,
                  const zf_tensor* exp_avg_sq, const zf_tensor* out) {
    return zf_cpu_adamw_step_flat(params, flat_master, &m_t, exp_avg_sq, offsets, sizes, grads, out, 2, steps, lr, wd,
                                  &h, 1.0f, 0);
  };
  const int64_t sizes[2] = {8, 5};
  const int64_t overlapping[2] = {0, 7}, past_end[2] = {0, 12}, negative[2] = {-1, 8}, good[2] = {0, 8};
  expect_error(call(overlapping, sizes, nullptr, &master_t, &v_t, outs), ZF_ERROR_INVALID_VALUE, "offsets[1]",
               untouched);
  expect_error(call(past_end, sizes, nullptr, &master_t, &v_t, outs), ZF_ERROR_INVALID_VALUE, "offsets[1]", untouched);
  expect_error(call(negative, sizes, nullptr, &master_t, &v_t, outs), ZF_ERROR_INVALID_VALUE, "offsets[0]", untouched);
  const int64_t wrong_sizes[2] = {8, 4};
  expect_error(call(good, wrong_sizes, nullptr, &master_t, &v_t, outs), ZF_ERROR_INVALID_VALUE, "grads[1]", untouched);
  expect_error(call(good, sizes, outs, &master_t, &v_t, outs), ZF_ERROR_INVALID_VALUE, "params/master", untouched);
  expect_error(call(good, sizes, nullptr, nullptr, &v_t, outs), ZF_ERROR_INVALID_VALUE, "params/master", untouched);
  const zf_tensor short_v = f32_tensor(v, {15});
  expect_error(call(good, sizes, nullptr, &master_t, &short_v, outs), ZF_ERROR_INVALID_VALUE, "exp_avg_sq", untouched);
  const zf_tensor into_master[2] = {outs[0], contiguous_tensor(master.data() + 3, ZF_DTYPE_F32, {5})};
  expect_error(call(good, sizes, nullptr, &master_t, &v_t, into_master), ZF_ERROR_INVALID_VALUE, "overlap", untouched);
  EXPECT_EQ(call(good, sizes, nullptr, &master_t, &v_t, outs), ZF_SUCCESS) << zf_last_error();
  EXPECT_FALSE(untouched());
}

}  // namespace

// ---- the window's first accumulate (engine: acc_fresh) ----

namespace {

// The kernel table of every SIMD level this CPU runs, scalar first (the kernel-level tests
// call them directly; the plan-level tests go through ScopedSimdLevel).
std::vector<const zf::simd::KernelTable*> kernel_tables_this_cpu_has() {
  std::vector<const zf::simd::KernelTable*> tables = {zf::simd::kernel_table_scalar()};
#if defined(ZENFLOW_HAVE_X86_SIMD)
  if (zf_simd_level_supported() >= ZF_SIMD_AVX2) tables.push_back(zf::simd::kernel_table_avx2());
  if (zf_simd_level_supported() >= ZF_SIMD_AVX512) tables.push_back(zf::simd::kernel_table_avx512());
#endif
  return tables;
}

// The overwrite form of the accumulate kernel gives, at every level the CPU has, the bits of
// adding into a zeroed accumulator (-0.0 products included: they become +0.0 there), and
// never reads the accumulator: it starts as NaN garbage here.
TEST(AccumulateKernel, OverwriteEqualsAddingIntoZerosBitForBit) {
  const std::vector<const zf::simd::KernelTable*> tables = kernel_tables_this_cpu_has();
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const zf::simd::KernelTable* table : tables) {
    for (zf_dtype dtype : {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16}) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{16}, int64_t{37}, int64_t{131}}) {
        std::vector<float> values(static_cast<size_t>(count));
        for (float& v : values) v = normal(rng);
        if (count > 2) values[1] = -0.0f, values[2] = 0.0f;
        std::vector<uint16_t> half(values.size());
        for (size_t i = 0; i < values.size(); ++i)
          half[i] = dtype == ZF_DTYPE_BF16 ? zf::f32_to_bf16(values[i]) : zf::f32_to_f16(values[i]);
        const void* x = dtype == ZF_DTYPE_F32 ? static_cast<const void*>(values.data()) : half.data();
        for (float scale : {0.75f, -1.0f}) {
          std::vector<float> added(values.size(), 0.0f), written(values.size(), std::nanf(""));
          table->accumulate(added.data(), x, dtype, count, scale, false, false);
          table->accumulate(written.data(), x, dtype, count, scale, true, false);
          EXPECT_TRUE(added.empty() || std::memcmp(added.data(), written.data(), added.size() * sizeof(float)) == 0)
              << zf_simd_level_name(table->level) << " " << zf_dtype_name(dtype) << " count " << count;
          // Streamed (non-temporal stores after an alignment head): the same bits at every
          // offset of the accumulator from a 64-byte boundary, and nothing outside it written.
          for (size_t shift = 0; shift < 16; ++shift) {
            std::vector<float> storage(values.size() + 32, std::nanf(""));
            float* aligned = storage.data() + (16 - reinterpret_cast<uintptr_t>(storage.data()) % 64 / 4) % 16;
            float* streamed = aligned + shift;
            table->accumulate(streamed, x, dtype, count, scale, true, true);
            EXPECT_TRUE(added.empty() || std::memcmp(added.data(), streamed, added.size() * sizeof(float)) == 0)
                << zf_simd_level_name(table->level) << " " << zf_dtype_name(dtype) << " count " << count << " shift "
                << shift;
            for (float* p = storage.data(); p < storage.data() + storage.size(); ++p) {
              if (p < streamed || p >= streamed + count)
                EXPECT_TRUE(std::isnan(*p)) << "written outside, shift " << shift;
            }
          }
        }
      }
    }
  }
}

// A plan over more than 4M elements (where the first accumulate streams its accumulators):
// a matrix written fresh and one added into, each bit for bit its definition, at every
// level, with a pool of 3 threads (ranges that start anywhere) and a bf16 buffer.
TEST(AccumulateKernel, LargeRunWithFreshAndOpenAccumulatorsMatchesDefinition) {
  const int64_t rows = 1031, cols = 2053;  // 2.1M elements each: 4.2M in the run
  const size_t n = static_cast<size_t>(rows * cols);
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  Buffer packed(ZF_DTYPE_BF16, 2 * n);
  for (size_t e = 0; e < 2 * n; ++e) packed.set(e, normal(rng));
  std::vector<float> open_before(n);
  for (float& v : open_before) v = normal(rng);
  std::vector<float> fresh(n, std::nanf("")), open = open_before;
  std::vector<zf_tensor> acc = {f32_tensor(fresh, {cols, rows}), f32_tensor(open, {cols, rows})};
  const zf_tensor packed_tensor = packed.tensor();
  zf::AccumulatePlan plan;
  plan.build(acc.data(), nullptr, 2, &packed_tensor);
  ASSERT_GE(plan.layout().total(), int64_t{1} << 22);
  zf::ThreadPool pool(3);
  const uint8_t overwrite[2] = {1, 0};
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    std::fill(fresh.begin(), fresh.end(), std::nanf(""));
    open = open_before;
    plan.run(pool, acc.data(), packed.data(), 0.75f, overwrite);
    for (size_t e = 0; e < n; ++e) {
      ASSERT_EQ(zf::f32_bits(fresh[e]), zf::f32_bits(zf::accumulate_element(0.0f, packed.get(e), 0.75f)))
          << zf_simd_level_name(level) << " element " << e;
      ASSERT_EQ(zf::f32_bits(open[e]), zf::f32_bits(zf::accumulate_element(open_before[e], packed.get(n + e), 0.75f)))
          << zf_simd_level_name(level) << " element " << e;
    }
  }
}

}  // namespace

// ---- the window's last accumulate fused into its update (engine: the closing step) ----

namespace {

// Fused (AdamStepArgs::fuse_accumulate), a step gives, at every level, the bits of the
// accumulate storing fma(g, s, A) (or into zeros) and a plain step reading that fp32 value
// back: master, m, v and the output copy, the output written over the gradient it reads (the
// engine's U) or elsewhere, streamed or not, for every gradient and output
// dtype and tails of every length. The accumulator is only read.
TEST(FusedAccumulateStep, EqualsAccumulateThenStepBitForBit) {
  const std::vector<const zf::simd::KernelTable*> tables = kernel_tables_this_cpu_has();
  const zf_adam_hparams hparams{0.9, 0.999, 1e-8, ZF_ADAM_MODE_ADAMW};
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const zf::simd::KernelTable* table : tables) {
    for (zf_dtype grad_dtype : kFloatTypes) {
      for (int out_kind = -1; out_kind < 3; ++out_kind) {  // -1: no output copy
        for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{16}, int64_t{37}, int64_t{131}}) {
          const auto n = static_cast<size_t>(count);
          std::vector<float> master(n), m(n), v(n), acc(n);
          Buffer grad(grad_dtype, n);
          for (size_t e = 0; e < n; ++e) {
            master[e] = normal(rng);
            m[e] = 0.1f * normal(rng);
            v[e] = std::fabs(0.01f * normal(rng));
            acc[e] = 3.0f * normal(rng);
            grad.set(e, 2.0f * normal(rng));
          }
          if (n > 2) grad.set(1, -0.0f), acc[2] = -0.0f;
          const std::vector<float> acc_before = acc;
          for (const bool fresh : {true, false}) {
            for (const bool stream : {false, true}) {
              zf::simd::AdamStepArgs base{};
              base.out_dtype = out_kind < 0 ? ZF_DTYPE_F32 : kFloatTypes[out_kind];
              base.stream_out = stream;
              base.grad_scale = 0.25f;
              base.scalars = scalars_for(hparams, kLr, kWeightDecay, 3);
              // the unfused passes: accumulate into A (a fresh one: written as adding into zeros)
              std::vector<float> summed = fresh ? std::vector<float>(n, std::nanf("")) : acc;
              table->accumulate(summed.data(), grad.data(), grad_dtype, count, -1.5f, fresh, false);
              std::vector<float> p1 = master, m1 = m, v1 = v;
              Buffer out1(base.out_dtype, n);
              zf::simd::AdamStepArgs plain = base;
              plain.param = p1.data(), plain.exp_avg = m1.data(), plain.exp_avg_sq = v1.data();
              plain.grad = summed.data(), plain.grad_dtype = ZF_DTYPE_F32;
              plain.out = out_kind < 0 ? nullptr : out1.data();
              table->adam_step(plain, count);
              // fused, into a separate output and in place over the gradient
              for (const bool in_place : {false, true}) {
                if (in_place && (out_kind < 0 || base.out_dtype != grad_dtype)) continue;
                std::vector<float> p2 = master, m2 = m, v2 = v;
                Buffer out2(base.out_dtype, n), grad_copy = grad;
                out2.poison();
                zf::simd::AdamStepArgs fused = base;
                fused.param = p2.data(), fused.exp_avg = m2.data(), fused.exp_avg_sq = v2.data();
                fused.grad = in_place ? out2.data() : grad_copy.data();
                if (in_place) out2 = grad;
                fused.grad = in_place ? out2.data() : grad_copy.data();
                fused.grad_dtype = grad_dtype;
                fused.out = out_kind < 0 ? nullptr : out2.data();
                fused.fuse_accumulate = true;
                fused.accumulator = fresh ? nullptr : acc.data();
                fused.accumulate_scale = -1.5f;
                table->adam_step(fused, count);
                const std::string what = std::string(zf_simd_level_name(table->level)) + " grad " +
                                         zf_dtype_name(grad_dtype) + " out " + std::to_string(out_kind) + " count " +
                                         std::to_string(count) + (fresh ? " fresh" : " open") +
                                         (stream ? " streamed" : "") + (in_place ? " in place" : "");
                EXPECT_TRUE(same_bits(p1, p2) && same_bits(m1, m2) && same_bits(v1, v2)) << what;
                if (out_kind >= 0) EXPECT_TRUE(out1.bitwise_equal(out2)) << what;
                EXPECT_TRUE(same_bits(acc, acc_before)) << what << ": the accumulator was written";
              }
            }
          }
        }
      }
    }
  }
}

// The column step plan fused, as the engine's window update runs it: the packed gradient in
// the packed output (U) itself, a fresh matrix and one with an accumulator, a pool of 3
// threads over more than 4M elements (streamed output), at every level:
// the bits of the accumulate plan and then the plain plan on the accumulators.
TEST(FusedAccumulateStep, ColumnPlanInPlaceEqualsAccumulateThenStep) {
  const int64_t rows = 1031, cols = 2053;
  const size_t n = static_cast<size_t>(rows * cols);
  std::mt19937 rng(31);
  std::normal_distribution<float> normal;
  std::vector<int32_t> selected = {0, 5, 6, 700, 2052};
  const auto deferred = static_cast<size_t>(rows * (cols - static_cast<int64_t>(selected.size())));
  Buffer packed(ZF_DTYPE_BF16, 2 * deferred);
  for (size_t e = 0; e < packed.size(); ++e) packed.set(e, normal(rng));
  std::vector<float> state_init(2 * n);  // per matrix: master, then A
  for (float& x : state_init) x = normal(rng);
  const zf_adam_hparams hparams{0.9, 0.999, 1e-8, ZF_ADAM_MODE_ADAMW};
  zf::ThreadPool pool(3);
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    struct Run {
      std::vector<float> master, m, v, acc[2];
      std::vector<int32_t> steps;
      Buffer out;
    };
    auto fresh_run = [&]() {
      Run r;
      for (int i = 0; i < 2; ++i) r.acc[i].assign(state_init.begin() + static_cast<ptrdiff_t>(n), state_init.end());
      r.master.assign(state_init.begin(), state_init.begin() + static_cast<ptrdiff_t>(n));
      r.master.insert(r.master.end(), state_init.begin(), state_init.begin() + static_cast<ptrdiff_t>(n));
      r.m.assign(2 * n, 0.01f);
      r.v.assign(2 * n, 0.02f);
      r.steps.assign(static_cast<size_t>(2 * cols), 4);
      r.out = Buffer(ZF_DTYPE_BF16, 2 * deferred);
      return r;
    };
    Run plain = fresh_run(), fused = fresh_run();
    std::vector<int32_t> sel = selected;
    // two matrices: [0] fresh (its A holds nothing), [1] open (A holds earlier steps)
    auto states = [&](Run& r, std::vector<zf_column_state>* s, std::vector<zf_tensor>* accs) {
      for (int i = 0; i < 2; ++i) {
        zf_column_state c{};
        const size_t own = static_cast<size_t>(i) * n;  // each matrix its own state
        c.master = contiguous_tensor(r.master.data() + own, ZF_DTYPE_F32, {cols, rows});
        c.exp_avg = contiguous_tensor(r.m.data() + own, ZF_DTYPE_F32, {cols, rows});
        c.exp_avg_sq = contiguous_tensor(r.v.data() + own, ZF_DTYPE_F32, {cols, rows});
        c.steps = contiguous_tensor(r.steps.data() + i * cols, ZF_DTYPE_I32, {cols});
        s->push_back(c);
        accs->push_back(contiguous_tensor(r.acc[i].data(), ZF_DTYPE_F32, {cols, rows}));
      }
    };
    // Each matrix is a plan of its own (the engine runs one matrix per call).
    for (int i = 0; i < 2; ++i) {
      const bool fresh = i == 0;
      std::vector<zf_column_state> ps, fs;
      std::vector<zf_tensor> pa, fa;
      states(plain, &ps, &pa);
      states(fused, &fs, &fa);
      zf_tensor sel_t = contiguous_tensor(sel.data(), ZF_DTYPE_I32, {static_cast<int64_t>(sel.size())});
      const size_t at = static_cast<size_t>(i) * deferred;
      // unfused: accumulate the packed gradient into A, then the plain plan on A
      zf_tensor packed_t = contiguous_tensor(static_cast<uint16_t*>(packed.data()) + at, ZF_DTYPE_BF16,
                                             {static_cast<int64_t>(deferred)});
      zf::AccumulatePlan accumulate;
      accumulate.build(&pa[static_cast<size_t>(i)], &sel_t, 1, &packed_t);
      const uint8_t overwrite = fresh ? 1 : 0;
      accumulate.run(pool, &pa[static_cast<size_t>(i)], packed_t.data, -0.5f, &overwrite);
      zf_tensor out_plain = contiguous_tensor(static_cast<uint16_t*>(plain.out.data()) + at, ZF_DTYPE_BF16,
                                              {static_cast<int64_t>(deferred)});
      zf::ColumnStepPlan step;
      step.build(&ps[static_cast<size_t>(i)], &sel_t, 1, &pa[static_cast<size_t>(i)], nullptr, &out_plain);
      const double lr = kLr, wd = kWeightDecay;
      zf::AdamRunValues values{&lr, &wd, hparams, 1.0f / 3.0f, ZF_CPU_ADAMW_INCREMENT_STEPS, 0};
      zf::ColumnStepPointers pp{&ps[static_cast<size_t>(i)], &pa[static_cast<size_t>(i)], nullptr, out_plain.data};
      step.run(pool, pp, values);
      // fused: the packed gradient copied into U, the plan reading and writing U
      uint16_t* u = static_cast<uint16_t*>(fused.out.data()) + at;
      std::memcpy(u, static_cast<uint16_t*>(packed.data()) + at, deferred * 2);
      zf_tensor u_t = contiguous_tensor(u, ZF_DTYPE_BF16, {static_cast<int64_t>(deferred)});
      zf::ColumnStepPlan fused_step;
      fused_step.build(&fs[static_cast<size_t>(i)], &sel_t, 1, nullptr, &u_t, &u_t);
      const float* accumulator = fresh ? nullptr : fused.acc[i].data();
      zf::ColumnStepPointers fp{&fs[static_cast<size_t>(i)], nullptr, u, u};
      fp.fuse_accumulate = true;
      fp.accumulators = &accumulator;
      values.accumulate_scale = -0.5f;
      fused_step.run(pool, fp, values);
    }
    const char* name = zf_simd_level_name(level);
    EXPECT_TRUE(same_bits(plain.master, fused.master)) << name;
    EXPECT_TRUE(same_bits(plain.m, fused.m)) << name;
    EXPECT_TRUE(same_bits(plain.v, fused.v)) << name;
    EXPECT_EQ(plain.steps, fused.steps) << name;
    EXPECT_TRUE(plain.out.bitwise_equal(fused.out)) << name;
    EXPECT_TRUE(std::equal(fused.acc[1].begin(), fused.acc[1].end(), state_init.begin() + static_cast<ptrdiff_t>(n)))
        << name << ": the accumulator was written";
  }
}

}  // namespace

namespace {

// The streaming roof's pass (simd stream_pass): every written stream holds the sum of the
// read streams (bf16 streams as bf16) times scale, at every level this CPU has, for every
// stream count (one instantiation each), vector by vector and block by block (counts across
// blocks), with and without non-temporal stores and prefetch, for counts with every tail;
// nothing past count is touched.
TEST(StreamPass, EveryLevelWritesTheScaledSumOfTheReadStreams) {
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  // Stream s is of kind s % 4: a bf16 read, an f32 read-write, an f32 write, a bf16 write.
  enum Kind { kBf16Read, kF32ReadWrite, kF32Write, kBf16Write };
  constexpr int64_t kMost = 1024 + 13 + 64;
  struct Aligned {
    alignas(64) unsigned char bytes[kMost * 4];
  };
  std::vector<Aligned> buffers(zf::simd::kMaxStreamPassStreams);
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    for (int streams = 1; streams <= zf::simd::kMaxStreamPassStreams; ++streams) {
      for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{37}, int64_t{1024 + 13}}) {
        for (int variant = 0; variant < 8; ++variant) {  // every one the roof times
          const bool stream = (variant & 1) != 0;
          const bool blocked = (variant & 2) != 0;
          const bool prefetch = (variant & 4) != 0;
          const int64_t padded = count + 64;
          zf::simd::StreamPassArgs a{};
          a.streams = streams;
          std::vector<float> before(static_cast<size_t>(streams * padded));
          for (int s = 0; s < streams; ++s) {
            const Kind kind = static_cast<Kind>(s % 4);
            a.data[s] = buffers[static_cast<size_t>(s)].bytes;
            a.bytes[s] = kind == kBf16Read || kind == kBf16Write ? 2 : 4;
            a.read[s] = kind == kBf16Read || kind == kF32ReadWrite;
            a.write[s] = kind != kBf16Read;
            for (int64_t i = 0; i < padded; ++i) {
              const float value = a.read[s] ? uniform(rng) : 77.0f;
              if (a.bytes[s] == 2) {
                static_cast<uint16_t*>(a.data[s])[i] = zf::f32_to_bf16(value);
                before[static_cast<size_t>(s * padded + i)] = zf::bf16_to_f32(zf::f32_to_bf16(value));
              } else {
                static_cast<float*>(a.data[s])[i] = value;
                before[static_cast<size_t>(s * padded + i)] = value;
              }
            }
          }
          a.stream = stream;
          a.prefetch = prefetch;
          a.blocked = blocked;
          a.scale = 0.5f;
          zf::simd::active_kernels().stream_pass(a, count);
          const std::string where = std::string(zf_simd_level_name(level)) + " streams " + std::to_string(streams) +
                                    " count " + std::to_string(count) + (stream ? " streamed" : "") +
                                    (blocked ? " blocked" : "") + (prefetch ? " prefetched" : "");
          for (int64_t i = 0; i < padded; ++i) {
            float sum = 0.0f;
            for (int s = 0; s < streams; ++s) {
              if (a.read[s]) sum += before[static_cast<size_t>(s * padded + i)];
            }
            const float expected = sum * 0.5f;
            for (int s = 0; s < streams; ++s) {
              const float held = a.bytes[s] == 2 ? zf::bf16_to_f32(static_cast<const uint16_t*>(a.data[s])[i])
                                                 : static_cast<const float*>(a.data[s])[i];
              const float want = i >= count || !a.write[s] ? before[static_cast<size_t>(s * padded + i)]
                                 : a.bytes[s] == 2         ? zf::bf16_to_f32(zf::f32_to_bf16(expected))
                                                           : expected;
              ASSERT_EQ(held, want) << where << " stream " << s << " element " << i;
            }
          }
        }
      }
    }
  }
}

}  // namespace
