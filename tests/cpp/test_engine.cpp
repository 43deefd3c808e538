// The engine on the host backend against a float64 reference and plain AdamW: the exact cases,
// staleness, lossless re-selection, clipping, loss scaling, determinism, stats.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>

#include "common/host_memory.hpp"
#include "engine/schedule.hpp"
#include "engine/testing.hpp"
#include "test_engine_util.hpp"

namespace {

using namespace zf_engine_test;

// ---- against the float64 reference of the whole algorithm ----

using Sweep = std::tuple<double, int64_t, bool, int64_t>;  // topk, S, overlap, warm-up

// The engine's weights equal the reference's after every step of a run with re-selections
// and clipping, and after the final flush.
void expect_follows_reference(const RefConfig& rc, int64_t steps) {
  Model model = standard_model();
  Reference ref(model, rc);
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, engine_config(rc));
  for (int64_t t = 1; t <= steps; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t, true, 3);
    const std::vector<double> lrs = step_lrs(model, t);
    engine.step(tensors_of(grads), lrs);
    ref.step(grads, lrs);
    ASSERT_LE(worst_error(model, ref, 2e-6, 2e-5), 1.0) << "step " << t;
  }
  engine.flush();
  ref.flush();
  EXPECT_LE(worst_error(model, ref, 2e-6, 2e-5), 1.0) << "after flush";
  EXPECT_EQ(engine.stats().steps, steps);
}

class EngineVsReference : public ::testing::TestWithParam<Sweep> {};

TEST_P(EngineVsReference, WeightsAfterEveryStep) {
  RefConfig rc;
  std::tie(rc.topk_ratio, rc.update_interval, rc.overlap, rc.warm_up) = GetParam();
  rc.select_interval = 5;  // re-selections with changing top columns
  rc.max_grad_norm = 6.0;  // clips most steps
  expect_follows_reference(rc, 14);
}

INSTANTIATE_TEST_SUITE_P(Sweep, EngineVsReference,
                         ::testing::Combine(::testing::Values(0.0, 0.3, 1.0), ::testing::Values<int64_t>(1, 3),
                                            ::testing::Bool(), ::testing::Values<int64_t>(0, 2)));

// update_lag: the previous window's result lands after the lag-th step of the next window
// (a lag no shorter than the window: at its close).
class EngineUpdateLag : public ::testing::TestWithParam<int64_t> {};

TEST_P(EngineUpdateLag, WeightsAfterEveryStep) {
  RefConfig rc;
  rc.topk_ratio = 0.3;
  rc.update_interval = 4;
  rc.update_lag = GetParam();
  rc.select_interval = 8;
  rc.max_grad_norm = 6.0;
  expect_follows_reference(rc, 15);
}

INSTANTIATE_TEST_SUITE_P(Lags, EngineUpdateLag, ::testing::Values<int64_t>(0, 1, 3, 4, 9));

TEST(Engine, Bf16WithFp32MasterFollowsTheReference) {
  RefConfig rc;
  rc.topk_ratio = 0.3;
  rc.update_interval = 2;
  rc.select_interval = 4;
  Model model = standard_model(ZF_DTYPE_BF16, 3);
  Reference ref(model, rc);
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, engine_config(rc));
  for (int64_t t = 1; t <= 12; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t, true, 2);
    engine.step(tensors_of(grads), step_lrs(model, t));
    ref.step(grads, step_lrs(model, t));
  }
  engine.flush();
  ref.flush();
  // The weights are the fp32 masters rounded: within one bf16 ulp of the reference.
  EXPECT_LE(worst_error(model, ref, 1e-6, 1.0 / 128), 1.0);
  // The masters themselves are exact to fp32 rounding: the state carries them, unrounded.
  zenflow::EngineState state = engine.save_state();
  double worst = 0.0;
  size_t entry = 0;
  for (size_t i = 0; i < model.params.size(); ++i) {
    const float* master = static_cast<const float*>(state.data(entry));
    const std::vector<double>& want = ref.master(i);
    for (size_t e = 0; e < want.size(); ++e)
      worst = std::max(worst, std::fabs(master[e] - want[e]) / (2e-6 + 2e-5 * std::fabs(want[e])));
    entry += model.matrix(i) ? 8 : 4;
  }
  EXPECT_LE(worst, 1.0);
  EXPECT_GT(engine.stats().reselections, 0);
}

// ---- the exact cases, against plain AdamW (float64 loop) ----

std::vector<std::vector<double>> plain_adamw(const Model& start, int64_t steps) {
  std::vector<std::vector<double>> p, m, v;
  for (const auto& t : start.params) {
    p.push_back(t.values());
    m.emplace_back(p.back().size(), 0.0);
    v.emplace_back(p.back().size(), 0.0);
  }
  for (int64_t t = 1; t <= steps; ++t) {
    const std::vector<HostTensor> grads = make_grads(start, t);
    const std::vector<double> lrs = step_lrs(start, t);
    const double bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.999, t);
    for (size_t i = 0; i < p.size(); ++i) {
      const double lr = lrs[start.param_groups[i]], wd = start.groups[start.param_groups[i]].weight_decay;
      for (size_t e = 0; e < p[i].size(); ++e) {
        const double g = grads[i].get(static_cast<int64_t>(e));
        m[i][e] = 0.9 * m[i][e] + 0.1 * g;
        v[i][e] = 0.999 * v[i][e] + 0.001 * g * g;
        p[i][e] = p[i][e] * (1 - lr * wd) - lr * (m[i][e] / bc1) / (std::sqrt(v[i][e] / bc2) + 1e-8);
      }
    }
  }
  return p;
}

void expect_plain_adamw(zf_engine_config config, int64_t steps) {
  Model model = standard_model();
  const std::vector<std::vector<double>> want = plain_adamw(model, steps);
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, config);
  for (int64_t t = 1; t <= steps; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t);
    engine.step(tensors_of(grads), step_lrs(model, t));
  }
  engine.flush();
  for (size_t i = 0; i < model.params.size(); ++i) {
    const std::vector<double> got = model.params[i].values();
    for (size_t e = 0; e < got.size(); ++e)
      ASSERT_NEAR(got[e], want[i][e], 2e-6 + 2e-5 * std::fabs(want[i][e])) << "param " << i << " element " << e;
  }
}

TEST(Engine, MixedDtypeBucketsFollowTheReference) {
  // A bf16 bucket of an odd packed size followed by an f32 one: every bucket's place in the
  // upload copy U must be aligned for its dtype.
  RefConfig rc;
  rc.topk_ratio = 0.0;
  rc.update_interval = 2;
  Model model;
  model.groups = {zf_engine_group{1e-2, 0.0, 0}};
  model.param_groups = {0, 0};
  model.params.emplace_back(ZF_DTYPE_BF16, std::vector<int64_t>{1, 13});
  model.params.emplace_back(ZF_DTYPE_F32, std::vector<int64_t>{5, 7});
  for (HostTensor& t : model.params)
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 0.01f * static_cast<float>(i % 17) - 0.05f);
  Reference ref(model, rc);
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, engine_config(rc));
  for (int64_t t = 1; t <= 6; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t);
    engine.step(tensors_of(grads), step_lrs(model, t));
    ref.step(grads, step_lrs(model, t));
  }
  engine.flush();
  ref.flush();
  EXPECT_LE(worst_error(model, ref, 1e-6, 1.0 / 128), 1.0);
}

TEST(EngineExact, TopkRatioOneIsPlainAdamW) {
  zf_engine_config c = test_config();
  c.topk_ratio = 1.0;
  expect_plain_adamw(c, 9);
}

TEST(EngineExact, AllOnTheHostEveryStepIsPlainAdamW) {
  zf_engine_config c = test_config();
  c.topk_ratio = 0.0;
  c.update_interval = 1;
  c.overlap_step = 0;
  expect_plain_adamw(c, 9);
}

TEST(EngineExact, WarmUpCoveringEveryStepIsPlainAdamW) {
  zf_engine_config c = test_config();
  c.full_warm_up_rounds = 9;
  expect_plain_adamw(c, 9);
}

// ---- per-step hyper-parameters ----

// Betas (momentum cycling), eps and weight decays of step t.
void hyperparameters_at(const Model& model, int64_t t, double* beta1, double* beta2, double* eps,
                        std::vector<double>* weight_decays) {
  const double phase = static_cast<double>(t % 5) / 5.0;
  *beta1 = 0.85 + 0.1 * phase;
  *beta2 = 0.99 + 0.009 * phase;
  *eps = 1e-8 * static_cast<double>(1 + t);
  weight_decays->clear();
  for (const auto& g : model.groups) weight_decays->push_back(0.01 + g.weight_decay * static_cast<double>(t));
}

class EngineHyperparameters : public ::testing::TestWithParam<bool> {};

TEST_P(EngineHyperparameters, ChangedEveryStepFollowTheReference) {
  // A step's selected columns and dense parameters take its values; a window's host update
  // those of the window's last step, also when the values change again before a flush.
  RefConfig rc;
  rc.topk_ratio = 0.3;
  rc.update_interval = 3;
  rc.overlap = GetParam();
  rc.select_interval = 4;
  Model model = standard_model();
  Reference ref(model, rc);
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, engine_config(rc));
  for (int64_t t = 1; t <= 11; ++t) {
    double b1, b2, eps;
    std::vector<double> wds;
    hyperparameters_at(model, t, &b1, &b2, &eps, &wds);
    engine.set_hyperparameters(b1, b2, eps, wds);
    ref.set_hyperparameters(b1, b2, eps, wds);
    std::vector<HostTensor> grads = make_grads(model, t, true);
    engine.step(tensors_of(grads), step_lrs(model, t));
    ref.step(grads, step_lrs(model, t));
    ASSERT_LE(worst_error(model, ref, 1e-6, 1e-5), 1.0) << "step " << t;
  }
  const std::vector<double> late(model.groups.size(), 0.5);
  engine.set_hyperparameters(0.5, 0.6, 1e-3, late);  // after the open window's last step
  ref.set_hyperparameters(0.5, 0.6, 1e-3, late);
  engine.flush();
  ref.flush();
  EXPECT_LE(worst_error(model, ref, 1e-6, 1e-5), 1.0) << "after the flush";
  EXPECT_EQ(engine.stats().windows, 4u);  // 3 closes and the flush: none forced by a change
}

INSTANTIATE_TEST_SUITE_P(Overlap, EngineHyperparameters, ::testing::Bool());

TEST(EngineHyperparameters, BadValuesAreRefusedNamedAndChangeNothing) {
  RefConfig rc;
  rc.topk_ratio = 0.3;
  rc.update_interval = 2;
  auto run = [&](int bad) {
    Model model = standard_model();
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, engine_config(rc));
    std::vector<HostTensor> grads = make_grads(model, 1);
    engine.step(tensors_of(grads), step_lrs(model, 1));
    const double nan = std::nan("");
    const std::vector<double> good(model.groups.size(), 0.1);
    std::vector<double> wrong_count(model.groups.size() + 1, 0.1);
    std::vector<double> negative = good;
    negative.at(1) = -0.5;
    struct Case {
      double b1, b2, eps;
      const std::vector<double>* wds;
      const char* named;
    };
    const Case cases[] = {{1.0, 0.999, 1e-8, &good, "beta1"},
                          {0.9, nan, 1e-8, &good, "beta2"},
                          {0.9, 0.999, -1e-8, &good, "eps"},
                          {0.9, 0.999, INFINITY, &good, "eps"},
                          {0.9, 0.999, 1e-8, &wrong_count, "weight_decays"},
                          {0.9, 0.999, 1e-8, &negative, "weight_decays[1]"}};
    if (bad >= 0) {
      const Case& c = cases[bad];
      const zf_status status =
          zf_engine_set_hyperparameters(engine.get(), c.b1, c.b2, c.eps, c.wds->data(), c.wds->size());
      EXPECT_EQ(status, ZF_ERROR_INVALID_VALUE) << "case " << bad;
      EXPECT_NE(std::string(zf_last_error()).find(c.named), std::string::npos) << zf_last_error();
    }
    for (int64_t t = 2; t <= 6; ++t) {
      grads = make_grads(model, t);
      engine.step(tensors_of(grads), step_lrs(model, t));
    }
    engine.flush();
    return model.params;
  };
  const std::vector<HostTensor> want = run(-1);
  for (int bad = 0; bad < 6; ++bad) {
    const std::vector<HostTensor> got = run(bad);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(want[i].bitwise_equal(got[i])) << "case " << bad << " param " << i;
  }
}

// ---- staleness, shown directly ----

// One matrix, every column deferred. The reference states after j windows are computed
// with overlap off (each window applied at once); the engine's weights after step t must
// be the state after exactly expected(t) windows.
void check_staleness(bool overlap, int64_t lag = 0) {
  Model model;
  model.groups = {zf_engine_group{0.05, 0.0, 0}};
  model.params.emplace_back(ZF_DTYPE_F32, std::vector<int64_t>{3, 4});
  model.param_groups = {0};
  for (int64_t e = 0; e < 12; ++e) model.params[0].set(e, 0.1f * static_cast<float>(e));
  const int64_t S = 2, steps = 10;
  RefConfig rc;
  rc.topk_ratio = 0.0;
  rc.update_interval = S;
  rc.overlap = false;
  // states[j]: the weights after j windows
  std::vector<std::vector<double>> states = {model.params[0].values()};
  {
    Model copy = model;
    Reference ref(copy, rc);
    for (int64_t t = 1; t <= steps; ++t) {
      ref.step(make_grads(copy, t), {0.05});
      if (t % S == 0) states.push_back(ref.weights(0));
    }
  }
  zf_engine_config c = test_config();
  c.topk_ratio = 0.0;
  c.update_interval = S;
  c.overlap_step = overlap ? 1 : 0;
  c.update_lag = lag;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  for (int64_t t = 1; t <= steps; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t);
    engine.step(tensors_of(grads), {0.05});
    // Windows closed so far: t / S. Overlap off: all of them are applied. Overlap on: the
    // last one is still in flight (applied at the next close), so during window w + 2 the
    // weights hold every gradient up to the end of window w; with update_lag L < S it lands
    // after the L-th step of the next window.
    const int64_t closed = t / S;
    const bool landed = lag > 0 && lag < S && t % S >= lag;
    const int64_t applied = overlap && !landed ? std::max<int64_t>(0, closed - 1) : closed;
    const std::vector<double> got = model.params[0].values();
    for (size_t j = 0; j < states.size(); ++j) {
      bool equal = true;
      for (size_t e = 0; e < got.size(); ++e) equal = equal && std::fabs(got[e] - states[j][e]) < 1e-5;
      EXPECT_EQ(equal, static_cast<int64_t>(j) == applied) << "step " << t << ": state after " << j << " windows";
    }
  }
}

TEST(EngineStaleness, OverlapOnDefersEachWindowByOneWindow) { check_staleness(true, 0); }
TEST(EngineStaleness, UpdateLagOneLandsOneStepIntoTheNextWindow) { check_staleness(true, 1); }
TEST(EngineStaleness, UpdateLagAsLongAsTheWindowLandsAtItsClose) { check_staleness(true, 2); }
TEST(EngineStaleness, OverlapOffAppliesEachWindowAtItsClose) { check_staleness(false); }

// ---- the C++ layer (zenflow.hpp): the stream with the call, the split step's calls ----

// on(stream) sets the stream of the call it precedes; the host backend has only the null
// stream, so another one (or a list of the wrong length) is refused and the engine goes on.
// The split step through mark_ready, take_released and end_step_with is bit for bit the
// plain step.
TEST(Engine, CppLayerPassesTheStreamWithTheCallAndSplitsSteps) {
  Model plain_model = standard_model(), split_model = standard_model();
  zf_engine_config c = test_config();
  c.release_gradients = 1;
  zenflow::Engine plain(plain_model.tensors(), plain_model.param_groups, plain_model.groups, c);
  zenflow::Engine split(split_model.tensors(), split_model.param_groups, split_model.groups, c);
  const zf_stream other = reinterpret_cast<zf_stream>(static_cast<uintptr_t>(0x10));
  size_t released = 0;
  for (int64_t t = 0; t < 6; ++t) {
    std::vector<HostTensor> grads = make_grads(plain_model, t);
    std::vector<zf_tensor> tensors = tensors_of(grads);
    plain.on(nullptr).step(tensors);
    try {
      split.on(other);
      FAIL() << "a stream on the host backend was accepted";
    } catch (const zenflow::Error& e) {
      EXPECT_NE(std::string(e.what()).find("stream"), std::string::npos) << e.what();
    }
    EXPECT_THROW(split.on(std::vector<zf_stream>{nullptr, nullptr}), zenflow::Error);
    split.on(std::vector<zf_stream>{nullptr}).begin_step();
    for (size_t i = tensors.size(); i-- > 0;) {
      split.mark_ready(i, tensors[i]);
      for (size_t j : split.take_released(tensors.size())) {
        tensors[j].data = nullptr;  // not read again
        ++released;
      }
    }
    split.on(nullptr).end_step_with(tensors);
    for (size_t i = 0; i < plain_model.params.size(); ++i)
      ASSERT_TRUE(plain_model.params[i].bitwise_equal(split_model.params[i])) << "param " << i << ", step " << t;
  }
  EXPECT_GT(released, 0u);
  split.refuse(ZF_ENGINE_CALL_STEP);  // without collectives a refusal does nothing (engine.h)
  std::vector<HostTensor> last = make_grads(plain_model, 6);
  plain.step(tensors_of(last));
  split.step(tensors_of(last));
  for (size_t i = 0; i < plain_model.params.size(); ++i)
    EXPECT_TRUE(plain_model.params[i].bitwise_equal(split_model.params[i])) << "param " << i << " after the refusal";
}

// ---- clipping and loss scaling ----

TEST(Engine, GlobalNormIsReportedAndClipsEveryGradient) {
  Model model = standard_model();
  zf_engine_config c = test_config();
  c.max_grad_norm = 1.0;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  std::vector<HostTensor> grads = make_grads(model, 1);
  double total = 0.0;
  for (const auto& g : grads)
    for (int64_t e = 0; e < g.numel(); ++e) total += g.get(e) * g.get(e);
  engine.step(tensors_of(grads));
  EXPECT_NEAR(engine.stats().last_global_norm, std::sqrt(total), 1e-5 * std::sqrt(total));
}

TEST(Engine, DynamicLossScalingSkipsOverflowStepsEverywhere) {
  // fp16 parameters; the same trajectory with and without an overflow step in the middle.
  auto run = [](bool overflow, double* final_scale, int64_t* skipped) {
    Model model = standard_model(ZF_DTYPE_F16, 5);
    zf_engine_config c = test_config();
    c.loss_scaling = ZF_LOSS_SCALING_DYNAMIC;
    c.initial_scale = 8.0;
    c.growth_interval = 3;
    c.update_interval = 2;
    c.topk_ratio = 0.3;
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
    int64_t good = 0;
    for (int64_t call = 1; good < 8; ++call) {
      const double scale = engine.loss_scale();
      std::vector<HostTensor> grads = make_grads(model, good + 1);
      for (auto& g : grads)
        for (int64_t e = 0; e < g.numel(); ++e) g.set(e, static_cast<float>(g.get(e) * scale));
      const bool bad = overflow && call == 4;
      if (bad) grads[1].set(3, INFINITY);
      const std::vector<Model> before = {model};
      engine.step(tensors_of(grads));
      if (bad) {
        for (size_t i = 0; i < model.params.size(); ++i)
          EXPECT_TRUE(model.params[i].bitwise_equal(before[0].params[i])) << "overflow step wrote param " << i;
        EXPECT_EQ(engine.loss_scale(), scale * 0.5);
      } else {
        ++good;
      }
    }
    engine.flush();
    *final_scale = engine.loss_scale();
    *skipped = engine.stats().skipped_steps;
    return model;
  };
  double scale_clean = 0, scale_overflow = 0;
  int64_t skipped_clean = 0, skipped_overflow = 0;
  const Model clean = run(false, &scale_clean, &skipped_clean);
  const Model with_overflow = run(true, &scale_overflow, &skipped_overflow);
  EXPECT_EQ(skipped_clean, 0);
  EXPECT_EQ(skipped_overflow, 1);
  EXPECT_EQ(scale_clean, 8.0 * 2 * 2);  // 8 good steps, growth every 3
  // after the overflow (at the 4th call): 8 -> 16 (3 good) -> 8 (overflow) -> 16 (3 more) -> ...
  EXPECT_EQ(scale_overflow, 16.0);
  // Power-of-two scales unscale exactly: the skipped step left no trace at all.
  for (size_t i = 0; i < clean.params.size(); ++i)
    EXPECT_TRUE(clean.params[i].bitwise_equal(with_overflow.params[i])) << "param " << i;
}

// ---- determinism ----

std::vector<HostTensor> determinism_run(int compute_threads, int host_threads, int split_parts) {
  Model model = standard_model(ZF_DTYPE_BF16, 11);
  zf_engine_config c = test_config();
  c.compute_threads = compute_threads;
  c.host_threads = host_threads;
  c.topk_ratio = 0.3;
  c.update_interval = 3;
  c.select_strategy = ZF_SELECT_STEP;
  c.select_interval = 4;
  c.max_grad_norm = 5.0;
  c.bucket_bytes = 100;  // several buckets through a ring of two slots
  c.staging_slots = 2;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  for (int64_t t = 1; t <= 13; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t, true, 3);
    std::vector<zf_tensor> g = tensors_of(grads);
    if (split_parts == 0) {
      engine.step(g, step_lrs(model, t));
    } else {
      if (split_parts == 2) {
        // a backward that failed half way: other gradients submitted, then the step discarded
        std::vector<HostTensor> failed = make_grads(model, t + 100, true, 3);
        std::vector<zf_tensor> f = tensors_of(failed);
        engine.begin_step(step_lrs(model, t + 100));
        engine.submit(2, std::vector<zf_tensor>(f.begin() + 2, f.end()));
        engine.abort_step();
      }
      engine.begin_step(step_lrs(model, t));
      // submit in reverse order of ranges, as a backward pass would
      std::vector<size_t> cuts = {0, 2, 3, g.size()};
      for (size_t part = cuts.size() - 1; part > 0; --part)
        engine.submit(cuts[part - 1], std::vector<zf_tensor>(g.begin() + cuts[part - 1], g.begin() + cuts[part]));
      engine.end_step();
    }
  }
  zenflow::EngineState state = engine.save_state();
  std::vector<HostTensor> out = model.params;
  for (size_t e = 0; e < state.layout.size(); ++e) {  // the whole state too, as f32 bits
    HostTensor t(ZF_DTYPE_F32, {static_cast<int64_t>((state.layout[e].bytes + 3) / 4)});
    std::memcpy(t.f32.data(), state.data(e), state.layout[e].bytes);
    out.push_back(std::move(t));
  }
  return out;
}

TEST(EngineDeterminism, BitwiseAcrossRunsPoolSizesTheSplitFormAndAbortedSteps) {
  const std::vector<HostTensor> base = determinism_run(1, 1, 0);
  const std::vector<std::vector<HostTensor>> others = {determinism_run(1, 1, 0), determinism_run(3, 2, 0),
                                                       determinism_run(2, 3, 1), determinism_run(1, 1, 1),
                                                       determinism_run(1, 2, 2)};
  for (const auto& other : others) {
    ASSERT_EQ(other.size(), base.size());
    for (size_t i = 0; i < base.size(); ++i) EXPECT_TRUE(base[i].bitwise_equal(other[i])) << "buffer " << i;
  }
}

// ---- stats ----

TEST(EngineStats, BytesDownAndUpFollowTheFormula) {
  Model model;
  model.groups = {zf_engine_group{1e-3, 0.0, 0}};
  model.params.emplace_back(ZF_DTYPE_BF16, std::vector<int64_t>{6, 20});
  model.params.emplace_back(ZF_DTYPE_F32, std::vector<int64_t>{4, 10});
  model.params.emplace_back(ZF_DTYPE_F32, std::vector<int64_t>{10});
  model.param_groups = {0, 0, 0};
  zf_engine_config c = test_config();
  c.topk_ratio = 0.25;  // k = 5 and 2
  c.update_interval = 3;
  c.overlap_step = 1;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  for (int64_t t = 1; t <= 9; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t);
    engine.step(tensors_of(grads));
  }
  const int64_t per_step = 6 * (20 - 5) * 2 + 4 * (10 - 2) * 4;
  zf_engine_stats s = engine.stats();
  EXPECT_EQ(s.steps, 9);
  EXPECT_EQ(s.windows, 3);
  EXPECT_EQ(s.bytes_down, 9 * per_step);
  EXPECT_EQ(s.bytes_up, 2 * per_step);  // overlap: window 3's update is still in flight
  EXPECT_DOUBLE_EQ(s.selected_fraction, 7.0 / 30.0);
  EXPECT_EQ(s.device_state_bytes > 0, true);
  EXPECT_GE(s.host_state_bytes, 5 * 4 * (6 * 20 + 4 * 10));
  engine.flush();
  EXPECT_EQ(engine.stats().bytes_up, 3 * per_step);
  EXPECT_GE(engine.stats().stall_seconds_flush, 0.0);
}

TEST(EngineMemory, AttachedDeviceMemoryIsUsed) {
  Model model = standard_model();
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, test_config());
  const size_t bytes = engine.device_memory_size();
  ASSERT_GT(bytes, 0u);
  std::vector<uint64_t> memory(bytes / 8 + 64);
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(memory.data()) + 255) / 256 * 256);
  EXPECT_THROW(engine.attach_device_memory(aligned, bytes - 1), zenflow::Error);
  engine.attach_device_memory(aligned, bytes);
  EXPECT_THROW(engine.attach_device_memory(aligned, bytes), zenflow::Error);  // once only
  // Same trajectory as an engine that allocates its own.
  Model other = standard_model();
  zenflow::Engine own(other.tensors(), other.param_groups, other.groups, test_config());
  for (int64_t t = 1; t <= 6; ++t) {
    std::vector<HostTensor> g1 = make_grads(model, t), g2 = make_grads(other, t);
    engine.step(tensors_of(g1));
    own.step(tensors_of(g2));
  }
  for (size_t i = 0; i < model.params.size(); ++i) EXPECT_TRUE(model.params[i].bitwise_equal(other.params[i]));
}

// The host lane streams the engine's host state against the staging slots and the upload
// copies, which start on a cache line; a state array 16 bytes off one (what malloc gives a
// large block) split every vector access across two lines and cost the window's first
// accumulate and its update 17 to 38 points of their streaming roof
// (benchmarks/results/2026-12-07-host-lane-fast-state.md). A block of a huge page or more
// starts on one and is advised for transparent huge pages (common/host_memory.hpp).
TEST(HostMemory, EveryBlockStartsOnALineAndALargeOneOnAHugePage) {
  const size_t huge = zf::kHugePageBytes;
  for (size_t bytes :
       {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, huge - 1, huge, huge + 4096 + 3, 4 * huge + 17}) {
    auto* p = static_cast<unsigned char*>(zf::allocate_streamed(bytes));
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % zf::kCacheLineBytes, 0u) << bytes;
#if defined(__linux__)
    if (bytes >= huge) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % huge, 0u) << bytes;
#endif
    for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 131 + bytes);
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; ++i) wrong += p[i] != static_cast<unsigned char>(i * 131 + bytes);
    EXPECT_EQ(wrong, 0u) << bytes;
    zf::free_streamed(p, bytes);
  }
  zf::free_streamed(nullptr, huge);
  // A wider alignment (the host backend's arena takes CUDA's 256 bytes), small and large.
  for (size_t bytes : {size_t{1}, size_t{4096} + 3, huge + 256}) {
    void* p = zf::allocate_streamed(bytes, 256);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << bytes;
    std::memset(p, 7, bytes);
    zf::free_streamed(p, bytes, 256);
  }
}

// The advice shows in /proc/self/smaps ("THPeligible: 1" for the mapping that holds the
// block) wherever the system takes it: transparent huge pages "madvise" or "always".
TEST(HostMemory, ALargeBlockIsEligibleForTransparentHugePages) {
#if !defined(__linux__)
  GTEST_SKIP() << "transparent huge pages are Linux's";
#else
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(setting, mode);
  if (mode.find("[madvise]") == std::string::npos && mode.find("[always]") == std::string::npos)
    GTEST_SKIP() << "transparent huge pages off here: '" << mode << "'";
  const size_t bytes = 3 * zf::kHugePageBytes + 4096;
  auto* p = static_cast<unsigned char*>(zf::allocate_streamed(bytes));
  std::memset(p, 1, bytes);
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false, found = false;
  int eligible = -1;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = lo <= at && at < hi;
      found = found || inside;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) eligible = std::atoi(line.c_str() + 12);
  }
  zf::free_streamed(p, bytes);
  ASSERT_TRUE(found) << "no mapping in /proc/self/smaps holds the block";
  if (eligible < 0) GTEST_SKIP() << "this kernel's smaps has no THPeligible field";
  EXPECT_EQ(eligible, 1);
#endif
}

TEST(EngineMemory, EveryHostArrayTheLaneStreamsStartsOnACacheLine) {
  for (size_t count : {size_t{1}, size_t{3}, size_t{77}, size_t{1000}, size_t{1} << 20}) {
    zf::StreamedVector<float> v(count, 1.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % zf::kCacheLineBytes, 0u) << count;
    v.resize(count * 3 + 5);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % zf::kCacheLineBytes, 0u) << count;
  }
  for (const bool overlap : {false, true}) {
    Model model = standard_model(ZF_DTYPE_BF16);
    zf_engine_config config = test_config();
    config.topk_ratio = 0.3;
    config.update_interval = 2;
    config.select_strategy = ZF_SELECT_STEP;
    config.select_interval = 4;
    config.overlap_step = overlap;
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, config);
    for (int64_t t = 1; t <= 7; ++t) {
      std::vector<HostTensor> grads = make_grads(model, t, true);
      engine.step(tensors_of(grads));
      if (t == 4) {
        zenflow::EngineState state = engine.save_state();
        engine.load_state(state);
      }
      const std::vector<const void*> bases = zf::testing::host_stream_bases(engine.get());
      ASSERT_GT(bases.size(), 5u);
      for (size_t i = 0; i < bases.size(); ++i)
        EXPECT_EQ(reinterpret_cast<uintptr_t>(bases[i]) % zf::kCacheLineBytes, 0u) << "array " << i << ", step " << t;
    }
  }
}

// The engine's own large blocks (host state arrays, the arena of the host backend's staging
// slots, the upload copies) come from allocate_streamed: each starts on a huge page.
TEST(EngineMemory, EveryLargeHostBlockStartsOnAHugePage) {
#if !defined(__linux__)
  GTEST_SKIP() << "huge-page alignment is Linux's";
#else
  Model model;
  model.groups = {zf_engine_group{1e-2, 0.0, 0}};
  model.params.emplace_back(ZF_DTYPE_BF16, std::vector<int64_t>{1024, 2048});  // 8 MiB per fp32 host array
  model.params.emplace_back(ZF_DTYPE_BF16, std::vector<int64_t>{7, 11});
  model.param_groups = {0, 0};
  for (auto& p : model.params)
    for (int64_t e = 0; e < p.numel(); ++e) p.set(e, 0.001f * static_cast<float>(e % 97));
  zf_engine_config config = test_config();
  config.topk_ratio = 0.1;
  config.update_interval = 2;
  config.bucket_bytes = size_t{8} << 20;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, config);
  for (int64_t t = 1; t <= 4; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t);
    engine.step(tensors_of(grads));
  }
  const auto blocks = zf::testing::host_stream_blocks(engine.get());
  size_t large = 0;
  for (const auto& [start, bytes] : blocks) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(start) % zf::kCacheLineBytes, 0u) << bytes;
    if (bytes < zf::kHugePageBytes) continue;
    ++large;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(start) % zf::kHugePageBytes, 0u) << bytes;
  }
  EXPECT_GE(large, 6u);  // master, moments, two accumulators, the staging slots' arena, the upload copies
#endif
}

}  // namespace

namespace {

using namespace zf_engine_test;

TEST(EngineShapes, ScalarsTinyMatricesAndAnEmptyModel) {
  Model model;
  model.groups = {zf_engine_group{1e-2, 0.0, 0}};
  model.params.emplace_back(ZF_DTYPE_F32, std::vector<int64_t>{});      // 0-D: dense
  model.params.emplace_back(ZF_DTYPE_F32, std::vector<int64_t>{1, 1});  // a 1x1 matrix
  model.params.emplace_back(ZF_DTYPE_F16, std::vector<int64_t>{2, 1, 3});
  model.param_groups = {0, 0, 0};
  for (auto& p : model.params)
    for (int64_t e = 0; e < p.numel(); ++e) p.set(e, 0.25f * static_cast<float>(e + 1));
  for (double ratio : {0.0, 0.5, 1.0}) {
    Model run = model;
    RefConfig rc;
    rc.topk_ratio = ratio;
    rc.update_interval = 2;
    Reference ref(run, rc);
    zenflow::Engine engine(run.tensors(), run.param_groups, run.groups, engine_config(rc));
    for (int64_t t = 1; t <= 5; ++t) {
      std::vector<HostTensor> grads = make_grads(run, t);
      engine.step(tensors_of(grads));
      ref.step(grads, {1e-2});
    }
    engine.flush();
    ref.flush();
    EXPECT_LE(worst_error(run, ref, 1e-5, 2e-3), 1.0) << "topk_ratio " << ratio;  // fp16 weights
  }
  zenflow::Engine empty({}, {}, {}, test_config());
  empty.step({});
  empty.flush();
  EXPECT_EQ(empty.stats().steps, 1);
  zenflow::EngineState state = empty.save_state();
  empty.load_state(state);
}

}  // namespace

namespace {

// Every window_scaling against the reference: windows of 3 after 2 warm-up steps, overlap
// with update_lag 1, re-selections, clipping, and a final flush of a 2-step partial window
// (its update stands for 2 steps).
TEST(EngineWindowScaling, EachScalingFollowsTheReference) {
  for (const zf_window_scaling scaling : {ZF_WINDOW_SCALING_NONE, ZF_WINDOW_SCALING_SQRT, ZF_WINDOW_SCALING_LINEAR}) {
    SCOPED_TRACE(static_cast<int>(scaling));
    RefConfig rc;
    rc.topk_ratio = 0.3;
    rc.update_interval = 3;
    rc.update_lag = 1;
    rc.warm_up = 2;
    rc.select_interval = 6;
    rc.max_grad_norm = 6.0;
    rc.window_scaling = scaling;
    expect_follows_reference(rc, 16);
  }
}

// ---- the synchronous start's detection (auto_warm_up_rounds) ----

// A run whose gradient is the same at every step (the moments' consistent share is 1, as far
// from trained), or fresh noise every step (about 0, as a pretrained model's).
struct StartRun {
  Model model;
  zf_engine_stats mid_probe{}, end{};
};

StartRun run_start(const zf_engine_config& config, bool consistent, int64_t steps) {
  StartRun run{standard_model(), {}, {}};
  zenflow::Engine engine(run.model.tensors(), run.model.param_groups, run.model.groups, config);
  for (int64_t t = 1; t <= steps; ++t) {
    std::vector<HostTensor> grads = make_grads(run.model, consistent ? 1 : t);
    engine.step(tensors_of(grads), step_lrs(run.model, t));
    if (t == 5) run.mid_probe = engine.stats();
  }
  engine.flush();
  run.end = engine.stats();
  return run;
}

TEST(EngineStart, ADetectedStartIsTheFixedStartItDecides) {
  for (const bool consistent : {true, false}) {
    zf_engine_config detect = test_config();
    detect.auto_warm_up_rounds = 12;
    const StartRun got = run_start(detect, consistent, 20);
    const int64_t length = consistent ? 12 : zf::Schedule::kStartProbeSteps;
    EXPECT_EQ(got.mid_probe.synchronous_start_steps, -1) << "undecided before the probe's last step";
    EXPECT_EQ(got.end.synchronous_start_steps, length) << "consistent " << consistent;
    zf_engine_config fixed = test_config();
    fixed.full_warm_up_rounds = length;
    const StartRun want = run_start(fixed, consistent, 20);
    EXPECT_EQ(want.end.synchronous_start_steps, length);
    EXPECT_EQ(got.end.windows, want.end.windows);
    for (size_t i = 0; i < got.model.params.size(); ++i)
      EXPECT_TRUE(got.model.params[i].bitwise_equal(want.model.params[i])) << "param " << i;
  }
}

}  // namespace
