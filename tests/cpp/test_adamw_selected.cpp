// zf_adamw_selected_columns on the host: against a float64 AdamW reference on every dtype
// pair, prime/1xN/Nx1/empty shapes, with and without master weights, per-column step
// counts, a gradient scale and the noop flag; dense mode; bad input writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>

#include "common/adam_math.hpp"
#include "common/column_index.hpp"
#include "common/thread_pool.hpp"
#include "ops/adamw_selected_plan.hpp"
#include "test_util.hpp"

namespace {

using zf_test::HostMatrix;
using zf_test::random_selection;

struct Case {
  HostMatrix param, grad;
  std::vector<int32_t> selected;
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<int32_t> steps;
  double lr, weight_decay;
  zf_column_state state() {
    zf_column_state s{};
    const int64_t k = static_cast<int64_t>(steps.size());
    s.master = zenflow::contiguous_tensor(master.empty() ? nullptr : master.data(), ZF_DTYPE_F32,
                                          {master.empty() ? 0 : param.rows, master.empty() ? 0 : k});
    s.exp_avg = zenflow::contiguous_tensor(exp_avg.data(), ZF_DTYPE_F32, {param.rows, k});
    s.exp_avg_sq = zenflow::contiguous_tensor(exp_avg_sq.data(), ZF_DTYPE_F32, {param.rows, k});
    s.steps = zenflow::contiguous_tensor(steps.data(), ZF_DTYPE_I32, {k});
    return s;
  }
};

Case make_case(zf_dtype param_dtype, zf_dtype grad_dtype, int64_t rows, int64_t cols, int64_t k, bool master,
               std::mt19937_64& rng) {
  Case c{zf_test::random_matrix(param_dtype, rows, cols, rng),
         zf_test::random_matrix(grad_dtype, rows, cols, rng, 0.1)};
  c.selected = random_selection(cols, k, rng);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const size_t slots = static_cast<size_t>(rows * k);
  c.exp_avg.resize(slots);
  c.exp_avg_sq.resize(slots);
  for (size_t s = 0; s < slots; ++s) {
    c.exp_avg[s] = 0.02f * (uniform(rng) - 0.5f);
    c.exp_avg_sq[s] = 1e-4f * uniform(rng);
  }
  if (master) {
    c.master.resize(slots);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        // The master is the exact value, the weight its rounding: offset it a little.
        c.master[static_cast<size_t>(r * k + j)] =
            static_cast<float>(c.param.values[static_cast<size_t>(r * cols + c.selected[static_cast<size_t>(j)])]) +
            1e-4f * (uniform(rng) - 0.5f);
      }
    }
  }
  std::uniform_int_distribution<int32_t> step(0, 6);
  c.steps.resize(static_cast<size_t>(k));
  for (auto& s : c.steps) s = step(rng);
  c.lr = 1e-3 * (1.0 + uniform(rng));
  c.weight_decay = 0.01 * uniform(rng);
  return c;
}

// float64 AdamW (torch.optim.AdamW's formula).
struct RefElement {
  double param, exp_avg, exp_avg_sq;
};
RefElement reference_adamw(double p, double m, double v, double g, int64_t step, double lr, double wd,
                           const zf_adam_hparams& o) {
  p *= 1.0 - lr * wd;
  m = o.beta1 * m + (1.0 - o.beta1) * g;
  v = o.beta2 * v + (1.0 - o.beta2) * g * g;
  const double bc1 = 1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(step));
  p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + o.eps);
  return {p, m, v};
}

double ulp_of(zf_dtype dtype, double value) {
  const int bits = dtype == ZF_DTYPE_F32 ? 24 : (dtype == ZF_DTYPE_BF16 ? 8 : 11);
  const double magnitude = std::max(std::fabs(value), dtype == ZF_DTYPE_F16 ? 6.1e-5 : 1e-30);
  return std::ldexp(1.0, std::ilogb(magnitude) - (bits - 1));
}

void expect_matches_reference(const Case& before, const Case& after, float scale, const zf_adam_hparams& o,
                              bool dense) {
  const int64_t rows = before.param.rows, cols = before.param.cols;
  const int64_t k = static_cast<int64_t>(before.steps.size());
  std::vector<bool> is_selected(static_cast<size_t>(cols), dense);
  for (int32_t j : before.selected) is_selected[static_cast<size_t>(j)] = true;
  for (int64_t c = 0; c < k; ++c) {
    const int64_t column = dense ? c : before.selected[static_cast<size_t>(c)];
    const int64_t step = int64_t{before.steps[static_cast<size_t>(c)]} + 1;
    ASSERT_EQ(after.steps[static_cast<size_t>(c)], step);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t element = static_cast<size_t>(r * cols + column), slot = static_cast<size_t>(r * k + c);
      const double p0 = before.master.empty() ? before.param.values[element] : before.master[slot];
      const double g = before.grad.values[element] * static_cast<double>(scale);
      const RefElement ref = reference_adamw(p0, before.exp_avg[slot], before.exp_avg_sq[slot], g, step, before.lr,
                                             before.weight_decay, o);
      // fp32 arithmetic in a different association than the reference: a few ulps.
      // m = m + (1 - beta1) * (g - m) cancels: its error scales with the inputs, not the result.
      const double m_scale = std::max({std::fabs(ref.exp_avg), std::fabs(double{before.exp_avg[slot]}), std::fabs(g)});
      ASSERT_NEAR(after.exp_avg[slot], ref.exp_avg, 4 * ulp_of(ZF_DTYPE_F32, m_scale) + 1e-30)
          << "r=" << r << " c=" << c;
      ASSERT_NEAR(after.exp_avg_sq[slot], ref.exp_avg_sq, 4 * ulp_of(ZF_DTYPE_F32, ref.exp_avg_sq) + 1e-30);
      // The update is about lr in size; its fp32 error is a few ulps of the parameter plus
      // a relative error of the step.
      const double tolerance = 8 * ulp_of(ZF_DTYPE_F32, ref.param) + 1e-5 * before.lr;
      if (!before.master.empty()) ASSERT_NEAR(after.master[slot], ref.param, tolerance);
      const double stored = after.param.dtype == ZF_DTYPE_F32    ? after.param.f32[element]
                            : after.param.dtype == ZF_DTYPE_BF16 ? zf::bf16_to_f32(after.param.half[element])
                                                                 : zf::f16_to_f32(after.param.half[element]);
      ASSERT_NEAR(stored, ref.param, ulp_of(after.param.dtype, ref.param) * 0.5 + tolerance)
          << "r=" << r << " column=" << column << " " << zf_dtype_name(after.param.dtype);
    }
  }
  // Unselected columns are untouched, bit for bit.
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      if (is_selected[static_cast<size_t>(j)]) continue;
      const size_t e = static_cast<size_t>(r * cols + j);
      if (before.param.dtype == ZF_DTYPE_F32) {
        ASSERT_EQ(zf::f32_bits(after.param.f32[e]), zf::f32_bits(before.param.f32[e]));
      } else {
        ASSERT_EQ(after.param.half[e], before.param.half[e]);
      }
    }
  }
}

const std::vector<std::tuple<int64_t, int64_t, int64_t>> kShapes = {{1, 1, 1},  {1, 4099, 409}, {4099, 1, 1},
                                                                    {7, 13, 3}, {31, 17, 17},   {97, 263, 26},
                                                                    {5, 40, 0}, {0, 12, 4},     {3, 0, 0}};

class AdamwSelectedSweep : public ::testing::TestWithParam<std::tuple<zf_dtype, zf_dtype, bool>> {};

TEST_P(AdamwSelectedSweep, MatchesFloat64Reference) {
  const auto [param_dtype, grad_dtype, master] = GetParam();
  std::mt19937_64 rng(99 + param_dtype * 5 + grad_dtype + (master ? 100 : 0));
  const zf_adam_hparams options{0.9, 0.999, 1e-8, ZF_ADAM_MODE_ADAMW};
  for (const float scale : {1.0f, 0.37f}) {
    std::vector<Case> cases, before;
    for (const auto& [rows, cols, k] : kShapes)
      cases.push_back(make_case(param_dtype, grad_dtype, rows, cols, k, master, rng));
    before = cases;
    std::vector<zf_tensor> params, grads, selected;
    std::vector<zf_column_state> states;
    std::vector<double> lr, wd;
    for (auto& c : cases) {
      params.push_back(c.param.tensor());
      grads.push_back(c.grad.tensor());
      selected.push_back(zenflow::contiguous_tensor(c.selected.data(), ZF_DTYPE_I32, {int64_t(c.selected.size())}));
      states.push_back(c.state());
      lr.push_back(c.lr);
      wd.push_back(c.weight_decay);
    }
    float scale_value = scale;
    const zf_tensor scale_t = zenflow::contiguous_tensor(&scale_value, ZF_DTYPE_F32, {});
    int32_t noop = 0;
    const zf_tensor noop_t = zenflow::contiguous_tensor(&noop, ZF_DTYPE_I32, {1});
    zenflow::adamw_selected_columns(params, grads, selected, states, lr, wd, options, &scale_t, &noop_t);
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("case " + std::to_string(i));
      expect_matches_reference(before[i], cases[i], scale, options, false);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AdamwSelectedSweep,
                         ::testing::Combine(::testing::Values(ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16),
                                            ::testing::Values(ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16),
                                            ::testing::Bool()));

TEST(AdamwSelected, DenseModeUpdatesEveryColumnAndOneDimensionalParams) {
  std::mt19937_64 rng(5);
  const zf_adam_hparams options{0.8, 0.99, 1e-6, ZF_ADAM_MODE_ADAMW};
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 37}, {19, 23}}) {
    Case c = make_case(ZF_DTYPE_F32, ZF_DTYPE_F32, rows, cols, cols, false, rng);
    const Case before = c;
    zf_tensor param = c.param.tensor();
    if (rows == 1) {  // a bias: 1-D [n]
      param.ndim = 1;
      param.shape[0] = cols;
      param.strides[0] = 1;
    }
    zenflow::adamw_selected_columns({param}, {c.grad.tensor()}, {}, {c.state()}, {c.lr}, {c.weight_decay}, options);
    expect_matches_reference(before, c, 1.0f, options, true);
  }
}

TEST(AdamwSelected, NoopFlagChangesNothing) {
  std::mt19937_64 rng(6);
  Case c = make_case(ZF_DTYPE_BF16, ZF_DTYPE_BF16, 9, 31, 7, true, rng);
  const Case before = c;
  int32_t noop = 1;
  const zf_tensor noop_t = zenflow::contiguous_tensor(&noop, ZF_DTYPE_I32, {});
  const zf_tensor sel = zenflow::contiguous_tensor(c.selected.data(), ZF_DTYPE_I32, {7});
  zenflow::adamw_selected_columns({c.param.tensor()}, {c.grad.tensor()}, {sel}, {c.state()}, {c.lr}, {0.0},
                                  zenflow::adam_hparams(), nullptr, &noop_t);
  EXPECT_EQ(c.param.half, before.param.half);
  EXPECT_EQ(c.master, before.master);
  EXPECT_EQ(c.exp_avg, before.exp_avg);
  EXPECT_EQ(c.steps, before.steps);
}

TEST(AdamwSelected, BadInputFailsAndWritesNothing) {
  std::mt19937_64 rng(7);
  Case c = make_case(ZF_DTYPE_F32, ZF_DTYPE_F32, 4, 10, 3, false, rng);
  const Case before = c;
  c.selected = {5, 2, 7};  // not ascending
  zf_tensor sel = zenflow::contiguous_tensor(c.selected.data(), ZF_DTYPE_I32, {3});
  zf_tensor param = c.param.tensor(), grad = c.grad.tensor();
  zf_column_state state = c.state();
  const double lr = 1e-3, wd = 0.0;
  const zf_adam_hparams o = zenflow::adam_hparams();
  EXPECT_EQ(zf_adamw_selected_columns(&param, &grad, &sel, &state, 1, &lr, &wd, nullptr, &o, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("ascending"), std::string::npos) << zf_last_error();
  c.selected = {2, 5, 10};  // out of range
  EXPECT_EQ(zf_adamw_selected_columns(&param, &grad, &sel, &state, 1, &lr, &wd, nullptr, &o, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_VALUE);
  c.selected = {2, 5, 7};
  state.exp_avg.shape[1] = 2;  // wrong state size
  EXPECT_EQ(zf_adamw_selected_columns(&param, &grad, &sel, &state, 1, &lr, &wd, nullptr, &o, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("state[0].exp_avg"), std::string::npos) << zf_last_error();
  state = c.state();
  state.exp_avg.dtype = ZF_DTYPE_BF16;
  EXPECT_EQ(zf_adamw_selected_columns(&param, &grad, &sel, &state, 1, &lr, &wd, nullptr, &o, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_TYPE);
  state = c.state();
  grad.shape[1] = 9;
  EXPECT_EQ(zf_adamw_selected_columns(&param, &grad, &sel, &state, 1, &lr, &wd, nullptr, &o, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_VALUE);
  grad = c.grad.tensor();
  zf_adam_hparams bad = o;
  bad.beta2 = 1.0;
  EXPECT_EQ(
      zf_adamw_selected_columns(&param, &grad, &sel, &state, 1, &lr, &wd, nullptr, &bad, nullptr, nullptr, nullptr),
      ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(c.param.f32, before.param.f32);
  EXPECT_EQ(c.exp_avg, before.exp_avg);
  EXPECT_EQ(c.steps, before.steps);
}

TEST(AdamwSelected, StepCountsThatCannotAdvanceAreRejected) {
  std::mt19937_64 rng(8);
  for (const int32_t bad_count : {-1, std::numeric_limits<int32_t>::max()}) {
    Case c = make_case(ZF_DTYPE_F32, ZF_DTYPE_F32, 5, 12, 4, false, rng);
    c.steps[2] = bad_count;
    const Case before = c;
    zf_tensor sel = zenflow::contiguous_tensor(c.selected.data(), ZF_DTYPE_I32, {4});
    zf_tensor param = c.param.tensor(), grad = c.grad.tensor();
    zf_column_state state = c.state();
    const double lr = 1e-3, wd = 0.0;
    const zf_adam_hparams o = zenflow::adam_hparams();
    EXPECT_EQ(
        zf_adamw_selected_columns(&param, &grad, &sel, &state, 1, &lr, &wd, nullptr, &o, nullptr, nullptr, nullptr),
        ZF_ERROR_INVALID_VALUE);
    EXPECT_NE(std::string(zf_last_error()).find("state[0].steps[2]"), std::string::npos) << zf_last_error();
    EXPECT_EQ(c.param.f32, before.param.f32);
    EXPECT_EQ(c.steps, before.steps);
  }
}

TEST(AdamwSelected, AliasedBuffersAreRejectedBeforeAnyWrite) {
  std::mt19937_64 rng(9);
  Case c = make_case(ZF_DTYPE_F32, ZF_DTYPE_F32, 6, 10, 3, false, rng);
  const Case before = c;
  const zf_tensor sel = zenflow::contiguous_tensor(c.selected.data(), ZF_DTYPE_I32, {3});
  const double lr = 1e-3, wd = 0.0;
  const zf_adam_hparams o = zenflow::adam_hparams();
  const auto expect_overlap = [&](zf_tensor param, zf_tensor grad, zf_tensor selected, zf_column_state state,
                                  const char* first, const char* second) {
    EXPECT_EQ(zf_adamw_selected_columns(&param, &grad, &selected, &state, 1, &lr, &wd, nullptr, &o, nullptr, nullptr,
                                        nullptr),
              ZF_ERROR_INVALID_VALUE);
    const std::string message = zf_last_error();
    EXPECT_NE(message.find("overlaps"), std::string::npos) << message;
    EXPECT_TRUE(message.find(first) != std::string::npos && message.find(second) != std::string::npos) << message;
  };
  zf_column_state state = c.state();
  state.exp_avg_sq = state.exp_avg;  // exp_avg is exp_avg_sq
  expect_overlap(c.param.tensor(), c.grad.tensor(), sel, state, "state[0].exp_avg", "state[0].exp_avg_sq");
  expect_overlap(c.param.tensor(), c.param.tensor(), sel, c.state(), "params[0]", "grads[0]");  // params is grads
  state = c.state();
  state.steps.data = c.selected.data();  // steps aliasing the selection they index
  expect_overlap(c.param.tensor(), c.grad.tensor(), sel, state, "selected[0]", "state[0].steps");
  EXPECT_EQ(c.param.f32, before.param.f32);
  EXPECT_EQ(c.exp_avg, before.exp_avg);
  EXPECT_EQ(c.selected, before.selected);
  EXPECT_EQ(c.steps, before.steps);
}

TEST(AdamwSelected, DeviceResidentLrEqualsLrArrayAndAdamModeDiffers) {
  std::mt19937_64 rng(10);
  const Case original = make_case(ZF_DTYPE_BF16, ZF_DTYPE_F32, 7, 19, 5, true, rng);
  const auto run = [&](bool use_tensor, zf_adam_mode mode) {
    Case c = original;
    const zf_tensor sel = zenflow::contiguous_tensor(c.selected.data(), ZF_DTYPE_I32, {5});
    float lr_value = 2e-3f;
    const zf_tensor lr_t = zenflow::contiguous_tensor(&lr_value, ZF_DTYPE_F32, {1});
    const zf_adam_hparams h{0.9, 0.999, 1e-8, mode};
    const std::vector<double> lr = use_tensor ? std::vector<double>{} : std::vector<double>{double(lr_value)};
    zenflow::adamw_selected_columns({c.param.tensor()}, {c.grad.tensor()}, {sel}, {c.state()}, lr, {0.05}, h, nullptr,
                                    nullptr, use_tensor ? &lr_t : nullptr);
    return c;
  };
  const Case by_array = run(false, ZF_ADAM_MODE_ADAMW), by_tensor = run(true, ZF_ADAM_MODE_ADAMW);
  EXPECT_EQ(by_array.param.half, by_tensor.param.half);
  EXPECT_EQ(by_array.master, by_tensor.master);
  EXPECT_EQ(by_array.exp_avg_sq, by_tensor.exp_avg_sq);
  const Case adam = run(false, ZF_ADAM_MODE_ADAM);
  EXPECT_NE(adam.master, by_array.master);  // L2 penalty instead of decoupled decay
}

TEST(AdamwSelected, BitwiseIdenticalAcrossPoolSizes) {
  std::mt19937_64 rng(11);
  // Large enough (rows * k over 32K) that the host twin splits the work over the pool.
  const Case original = make_case(ZF_DTYPE_F16, ZF_DTYPE_BF16, 1031, 97, 41, true, rng);
  std::vector<Case> results;
  for (const int threads : {1, 2, 3}) {
    zenflow::ScopedNumThreads pool(threads);
    Case c = original;
    const zf_tensor sel = zenflow::contiguous_tensor(c.selected.data(), ZF_DTYPE_I32, {41});
    zenflow::adamw_selected_columns({c.param.tensor()}, {c.grad.tensor()}, {sel}, {c.state()}, {1e-3}, {0.01});
    results.push_back(c);
  }
  for (size_t r = 1; r < results.size(); ++r) {
    EXPECT_EQ(results[r].param.half, results[0].param.half);
    EXPECT_EQ(results[r].master, results[0].master);
    EXPECT_EQ(results[r].exp_avg, results[0].exp_avg);
    EXPECT_EQ(results[r].exp_avg_sq, results[0].exp_avg_sq);
    EXPECT_EQ(results[r].steps, results[0].steps);
  }
}

// The element-wise definition the CUDA kernel computes (common/adam_math.hpp), applied one
// element at a time: the host twin must give exactly these bits at every SIMD level.
void apply_definition(Case& c, float scale, const zf_adam_hparams& o) {
  const int64_t k = static_cast<int64_t>(c.steps.size()), cols = c.param.cols;
  const bool dense = static_cast<int64_t>(c.selected.size()) != k;  // dense cases keep no list
  for (int64_t j = 0; j < k; ++j) {
    const zf::AdamHyperParams hyper{c.lr, o.beta1, o.beta2, o.eps, c.weight_decay, o.mode == ZF_ADAM_MODE_ADAMW};
    const zf::AdamStepScalars scalars = zf::adam_step_scalars(hyper, int64_t{c.steps[static_cast<size_t>(j)]} + 1);
    const int64_t column = dense ? j : c.selected[static_cast<size_t>(j)];
    for (int64_t r = 0; r < c.param.rows; ++r) {
      const size_t slot = static_cast<size_t>(r * k + j);
      const int64_t element = r * cols + column;
      const float g = zf::load_as_float(c.grad.data(), c.grad.dtype, element) * scale;
      float value = c.master.empty() ? zf::load_as_float(c.param.data(), c.param.dtype, element) : c.master[slot];
      zf::adam_update_element(value, c.exp_avg[slot], c.exp_avg_sq[slot], g, scalars);
      if (!c.master.empty()) c.master[slot] = value;
      zf::store_from_float(c.param.data(), c.param.dtype, element, value);
    }
  }
  for (auto& step : c.steps) ++step;
}

void expect_bitwise_equal(const Case& got, const Case& expected) {
  EXPECT_EQ(got.param.f32.size(), expected.param.f32.size());
  for (size_t e = 0; e < got.param.f32.size(); ++e) {
    ASSERT_EQ(zf::f32_bits(got.param.f32[e]), zf::f32_bits(expected.param.f32[e])) << "param element " << e;
  }
  EXPECT_EQ(got.param.half, expected.param.half);
  const std::pair<const std::vector<float>*, const std::vector<float>*> states[] = {
      {&got.master, &expected.master}, {&got.exp_avg, &expected.exp_avg}, {&got.exp_avg_sq, &expected.exp_avg_sq}};
  for (const auto& [a, b] : states) {
    ASSERT_EQ(a->size(), b->size());
    for (size_t s = 0; s < a->size(); ++s) ASSERT_EQ(zf::f32_bits((*a)[s]), zf::f32_bits((*b)[s])) << "slot " << s;
  }
  EXPECT_EQ(got.steps, expected.steps);
}

TEST(AdamwSelected, EqualsTheElementDefinitionBitwiseAtEveryLevel) {
  std::mt19937_64 rng(21);
  const zf_adam_hparams options{0.9, 0.999, 1e-8, ZF_ADAM_MODE_ADAMW};
  const zf_dtype dtypes[] = {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16};
  // Rows x (cols, k): runs of one step count longer than the kernel's 256-column pieces,
  // vector tails, k = 1, every column selected, and a dense call (k < 0 below).
  const std::vector<std::tuple<int64_t, int64_t, int64_t, bool>> shapes = {
      {37, 600, 530, true}, {37, 600, 530, false}, {9, 41, 19, false},  {300, 7, 1, true},
      {11, 23, 23, false},  {13, 300, -1, true},   {13, 300, -1, false}};
  for (const zf_simd_level level : zenflow::supported_simd_levels()) {
    zenflow::ScopedSimdLevel simd(level);
    for (const zf_dtype param_dtype : dtypes) {
      for (const zf_dtype grad_dtype : dtypes) {
        for (const bool master : {false, true}) {
          for (const auto& [rows, cols, k, same_steps] : shapes) {
            const bool dense = k < 0;
            Case c = make_case(param_dtype, grad_dtype, rows, cols, dense ? cols : k, master, rng);
            if (dense) c.selected.clear();
            if (same_steps) std::fill(c.steps.begin(), c.steps.end(), 3);
            Case expected = c;
            const float scale = same_steps ? 1.0f : 0.37f;
            apply_definition(expected, scale, options);
            float scale_value = scale;
            const zf_tensor scale_t = zenflow::contiguous_tensor(&scale_value, ZF_DTYPE_F32, {});
            const int64_t kk = static_cast<int64_t>(c.steps.size());
            std::vector<zf_tensor> selected;
            if (!dense) selected.push_back(zenflow::contiguous_tensor(c.selected.data(), ZF_DTYPE_I32, {kk}));
            zenflow::adamw_selected_columns({c.param.tensor()}, {c.grad.tensor()}, selected, {c.state()}, {c.lr},
                                            {c.weight_decay}, options, &scale_t);
            SCOPED_TRACE(std::string(zf_simd_level_name(level)) + " param " + zf_dtype_name(param_dtype) + " grad " +
                         zf_dtype_name(grad_dtype) + (master ? " master" : "") + " shape " + std::to_string(rows) +
                         "x" + std::to_string(cols) + " k " + std::to_string(kk));
            expect_bitwise_equal(c, expected);
          }
        }
      }
    }
  }
}

TEST(AdamwSelected, PlanRunsWithFreshPointersAsTheCEntryPoint) {
  std::mt19937_64 rng(12);
  const Case original = make_case(ZF_DTYPE_BF16, ZF_DTYPE_BF16, 13, 29, 6, true, rng);
  Case by_call = original;
  const zf_tensor sel = zenflow::contiguous_tensor(by_call.selected.data(), ZF_DTYPE_I32, {6});
  for (int step = 0; step < 3; ++step) {
    zenflow::adamw_selected_columns({by_call.param.tensor()}, {by_call.grad.tensor()}, {sel}, {by_call.state()}, {1e-3},
                                    {0.01});
  }
  zf::AdamwSelectedPlan plan({{13, 29, 6, ZF_DTYPE_BF16, ZF_DTYPE_BF16, true}}, zenflow::adam_hparams());
  Case by_plan = original;
  auto pool = zf::global_thread_pool();
  for (int step = 0; step < 3; ++step) {
    Case fresh = by_plan;  // new buffers every step: the plan holds no pointer
    const zf::AdamwSelectedPointers pointers{fresh.param.data(),
                                             fresh.grad.data(),
                                             fresh.selected.data(),
                                             fresh.master.data(),
                                             fresh.exp_avg.data(),
                                             fresh.exp_avg_sq.data(),
                                             fresh.steps.data(),
                                             1e-3,
                                             0.01};
    plan.run(*pool, &pointers, 1.0f);
    by_plan = fresh;
  }
  EXPECT_EQ(by_plan.param.half, by_call.param.half);
  EXPECT_EQ(by_plan.master, by_call.master);
  EXPECT_EQ(by_plan.steps, by_call.steps);
}

// The step that follows a stored count, on the host and in the CUDA kernels alike: a count at
// INT32_MAX stays there (never INT32_MAX + 1, a signed overflow), a negative one counts as 0.
TEST(AdamNextStepCount, SaturatesAtInt32Max) {
  EXPECT_EQ(zf::adam_next_step_count(0), 1);
  EXPECT_EQ(zf::adam_next_step_count(41), 42);
  EXPECT_EQ(zf::adam_next_step_count(-7), 1);
  EXPECT_EQ(zf::adam_next_step_count(INT32_MAX - 1), INT32_MAX);
  EXPECT_EQ(zf::adam_next_step_count(INT32_MAX), INT32_MAX);
  EXPECT_EQ(zf::adam_next_step_count(INT32_MIN), 1);
}

// The plan runs without the entry point's checks (the engine runs it every step, its counts
// bounded by the engine): a count at INT32_MAX takes step INT32_MAX and stays, bit for bit as
// a count of INT32_MAX - 1 would, as in the CUDA kernel. The sanitizer builds see no overflow.
TEST(AdamwSelected, PlanSaturatesACountAtInt32Max) {
  std::mt19937_64 rng(14);
  const Case original = make_case(ZF_DTYPE_BF16, ZF_DTYPE_BF16, 9, 17, 5, true, rng);
  Case at_max = original, below_max = original;
  std::fill(at_max.steps.begin(), at_max.steps.end(), INT32_MAX);
  std::fill(below_max.steps.begin(), below_max.steps.end(), INT32_MAX - 1);
  zf::AdamwSelectedPlan plan({{9, 17, 5, ZF_DTYPE_BF16, ZF_DTYPE_BF16, true}}, zenflow::adam_hparams());
  auto pool = zf::global_thread_pool();
  for (Case* c : {&at_max, &below_max}) {
    const zf::AdamwSelectedPointers pointers{c->param.data(),
                                             c->grad.data(),
                                             c->selected.data(),
                                             c->master.data(),
                                             c->exp_avg.data(),
                                             c->exp_avg_sq.data(),
                                             c->steps.data(),
                                             1e-3,
                                             0.01};
    plan.run(*pool, &pointers, 1.0f);
  }
  EXPECT_EQ(at_max.param.half, below_max.param.half);
  EXPECT_EQ(at_max.master, below_max.master);
  EXPECT_EQ(at_max.exp_avg, below_max.exp_avg);
  EXPECT_NE(at_max.param.half, original.param.half);
  EXPECT_EQ(at_max.steps, std::vector<int32_t>(5, INT32_MAX));
  EXPECT_EQ(below_max.steps, std::vector<int32_t>(5, INT32_MAX));
}

// beta^step without libm (host and device compute it alike): correctly rounded on cases
// checked in exact rational arithmetic (where glibc's pow is one ulp off), and never more
// than one ulp from pow over small and huge steps.
TEST(AdamBetaPower, CorrectlyRoundedAndWithinOneUlpOfPow) {
  // Python: float(Fraction(beta) ** step), the exactly rounded value.
  EXPECT_EQ(zf::adam_beta_power(0.999, 2904), 0.054723996727378245);
  EXPECT_EQ(zf::adam_beta_power(0.9, 10), 0.3486784401000001);
  EXPECT_EQ(zf::adam_beta_power(0.9, -3), 1.0);
  EXPECT_EQ(zf::adam_beta_power(0.0, 0), 1.0);
  const double betas[] = {0.9, 0.999, 0.95, 0.99, 0.5, 0.0, 0.3, 0.999999, 0.1234567};
  std::vector<int64_t> steps;
  for (int64_t step = 0; step <= 3000; ++step) steps.push_back(step);
  for (int64_t step = 3001; step < (int64_t{1} << 31); step = step * 3 + 7) steps.push_back(step);
  steps.push_back(INT32_MAX);
  size_t differ = 0;
  for (double beta : betas) {
    for (int64_t step : steps) {
      const double ours = zf::adam_beta_power(beta, step), libm = std::pow(beta, static_cast<double>(step));
      if (ours != libm) ++differ;
      ASSERT_LE(std::fabs(ours - libm), std::fabs(std::nextafter(libm, 0.0) - libm) * 1.0000001)
          << "beta " << beta << " step " << step;
    }
  }
  EXPECT_LT(differ, steps.size() * std::size(betas) / 100);
}

}  // namespace
