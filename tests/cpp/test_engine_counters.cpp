// The engine's counters at their limits (issue 25): Adam step counts (int32, per column on
// either side and per dense parameter), the schedule's counters and the skipped steps (int64),
// the loss scale and the statistics. A counter that the next step could take past its limit
// makes that step fail with INVALID_VALUE before anything changes; a state holding one does
// not load. The sanitizer builds run these: any signed overflow on the way fails them.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "test_engine_util.hpp"

namespace {

using namespace zf_engine_test;

bool states_equal(zenflow::EngineState& a, zenflow::EngineState& b) {
  if (a.layout.size() != b.layout.size() || a.counters != b.counters || a.loss_scale != b.loss_scale) return false;
  for (size_t e = 0; e < a.layout.size(); ++e) {
    if (a.layout[e].bytes != b.layout[e].bytes || std::memcmp(a.data(e), b.data(e), a.layout[e].bytes) != 0)
      return false;
  }
  return true;
}

// Sets every Adam step count of `state` (or only the last column of the first matrix) to `count`.
void set_step_counts(zenflow::EngineState& state, int32_t count, bool only_one = false) {
  for (size_t e = 0; e < state.layout.size(); ++e) {
    if (state.layout[e].kind != ZF_STATE_STEPS) continue;
    auto* counts = static_cast<int32_t*>(state.data(e));
    const size_t n = state.layout[e].bytes / 4;
    if (only_one) {
      if (n < 2) continue;
      counts[n - 1] = count;
      return;
    }
    for (size_t j = 0; j < n; ++j) counts[j] = count;
  }
}

int32_t largest_step_count(zenflow::EngineState& state) {
  int32_t largest = 0;
  for (size_t e = 0; e < state.layout.size(); ++e) {
    if (state.layout[e].kind != ZF_STATE_STEPS) continue;
    const auto* counts = static_cast<const int32_t*>(state.data(e));
    for (size_t j = 0; j < state.layout[e].bytes / 4; ++j) largest = std::max(largest, counts[j]);
  }
  return largest;
}

// Expects `call` to fail with INVALID_VALUE and a message holding `text`.
template <class Call>
void expect_refused(Call call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error mentioning '" << text << "'";
  } catch (const zenflow::Error& e) {
    EXPECT_EQ(e.status(), ZF_ERROR_INVALID_VALUE);
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

struct CountCase {
  const char* name;
  double topk_ratio;  // 1: every column on the device; 0: every column on the host
  int64_t update_interval;
  bool overlap;
  bool only_one_column;
};

void PrintTo(const CountCase& c, std::ostream* os) { *os << c.name; }

class EngineStepCountLimit : public ::testing::TestWithParam<CountCase> {};

// A state whose counts are INT32_MAX - 1 takes one more step (every count then at most
// INT32_MAX), and the step after it is refused, whole or split, changing nothing: the fuzzer's
// input fuzz/corpus/overflow-* reached `INT32_MAX + 1` here (adamw_selected.cpp and the host
// window step). A state holding INT32_MAX does not load; a state with smaller counts steps again.
TEST_P(EngineStepCountLimit, TheStepPastInt32MaxIsRefusedAndChangesNothing) {
  const CountCase& c = GetParam();
  Model model = standard_model(ZF_DTYPE_BF16, 3);
  zf_engine_config config = test_config();
  config.topk_ratio = c.topk_ratio;
  config.update_interval = c.update_interval;
  config.overlap_step = c.overlap;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, config);
  for (int64_t t = 1; t <= 3; ++t) {
    std::vector<HostTensor> g = make_grads(model, t);
    engine.step(tensors_of(g));
  }
  zenflow::EngineState fresh = engine.save_state();
  zenflow::EngineState near_limit = fresh;
  set_step_counts(near_limit, INT32_MAX - 1, c.only_one_column);
  engine.load_state(near_limit);
  std::vector<HostTensor> g4 = make_grads(model, 4);
  engine.step(tensors_of(g4));

  engine.flush();  // every count has taken its step (a save alone closes no window)
  zenflow::EngineState before = engine.save_state();
  EXPECT_EQ(largest_step_count(before), INT32_MAX);
  const std::vector<HostTensor> weights = model.params;
  const int64_t steps = engine.stats().steps;
  std::vector<HostTensor> g5 = make_grads(model, 5);
  expect_refused([&] { engine.step(tensors_of(g5)); }, "INT32_MAX");
  expect_refused([&] { engine.begin_step(); }, "INT32_MAX");
  expect_refused([&] { engine.end_step(); }, "no split step is open");  // begin_step opened none
  zenflow::EngineState after = engine.save_state();
  EXPECT_TRUE(states_equal(before, after));
  for (size_t i = 0; i < model.params.size(); ++i) EXPECT_TRUE(model.params[i].bitwise_equal(weights[i])) << i;
  EXPECT_EQ(engine.stats().steps, steps);

  // Saved at the limit, the state does not load (the next step could not take it).
  expect_refused([&] { engine.load_state(after); }, "out of range");
  // A state with room steps again.
  engine.load_state(fresh);
  engine.step(tensors_of(g5));
  EXPECT_EQ(engine.stats().steps, 4);
}

INSTANTIATE_TEST_SUITE_P(Layouts, EngineStepCountLimit,
                         ::testing::Values(CountCase{"MixedOverlap", 0.3, 4, true, false},
                                           CountCase{"MixedSync", 0.3, 1, false, false},
                                           CountCase{"AllOnTheDevice", 1.0, 2, true, false},
                                           CountCase{"AllOnTheHost", 0.0, 1, false, false},
                                           CountCase{"OneColumn", 0.3, 3, true, true}),
                         [](const ::testing::TestParamInfo<CountCase>& info) { return std::string(info.param.name); });

// Every step starts a window, and selects (strategy "step") or never selects again ("auto"
// with no epoch length), so that each schedule counter advances at every step.
zf_engine_config every_step_config(zf_select_strategy strategy) {
  zf_engine_config c = test_config();
  c.topk_ratio = 0.3;
  c.update_interval = 1;
  c.select_strategy = strategy;
  c.select_interval = strategy == ZF_SELECT_AUTO ? 0 : 1;  // "auto" takes no interval
  return c;
}

// A schedule counter at INT64_MAX - 1 allows one step; the next is refused, changing nothing;
// INT64_MAX itself does not load.
TEST(EngineCounterLimit, ScheduleCountersStopBeforeInt64Max) {
  for (int counter :
       {int{ZF_COUNTER_STEP}, int{ZF_COUNTER_WINDOW}, int{ZF_COUNTER_SINCE_SELECTION}, int{ZF_COUNTER_SELECTIONS}}) {
    SCOPED_TRACE("counter " + std::to_string(counter));
    Model model = standard_model(ZF_DTYPE_F32, 4);
    const zf_select_strategy strategy = counter == ZF_COUNTER_SINCE_SELECTION ? ZF_SELECT_AUTO : ZF_SELECT_STEP;
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, every_step_config(strategy));
    std::vector<HostTensor> g1 = make_grads(model, 1);
    engine.step(tensors_of(g1));
    zenflow::EngineState state = engine.save_state();
    state.counters[counter] = INT64_MAX;
    expect_refused([&] { engine.load_state(state); }, "INT64_MAX");
    state.counters[counter] = INT64_MAX - 1;
    engine.load_state(state);
    std::vector<HostTensor> g2 = make_grads(model, 2), g3 = make_grads(model, 3);
    engine.step(tensors_of(g2));
    zenflow::EngineState before = engine.save_state();
    EXPECT_EQ(before.counters[counter], INT64_MAX);
    const std::vector<HostTensor> weights = model.params;
    expect_refused([&] { engine.step(tensors_of(g3)); }, "INT64_MAX");
    expect_refused([&] { engine.begin_step(); }, "INT64_MAX");
    zenflow::EngineState after = engine.save_state();
    EXPECT_TRUE(states_equal(before, after));
    for (size_t i = 0; i < model.params.size(); ++i) EXPECT_TRUE(model.params[i].bitwise_equal(weights[i])) << i;
  }
}

zf_engine_config loss_scaling_config(double initial_scale) {
  zf_engine_config c = test_config();
  c.loss_scaling = ZF_LOSS_SCALING_DYNAMIC;
  c.initial_scale = initial_scale;
  c.growth_interval = 1;
  c.topk_ratio = 0.3;
  return c;
}

// The skipped-step count (dynamic loss scaling) likewise: at INT64_MAX - 1 an overflow step is
// skipped and counted once more; then every step is refused.
TEST(EngineCounterLimit, SkippedStepsStopAtInt64Max) {
  Model model = standard_model(ZF_DTYPE_F16, 6);
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, loss_scaling_config(8.0));
  zenflow::EngineState state = engine.save_state();
  state.counters[ZF_COUNTER_SKIPPED] = INT64_MAX;
  expect_refused([&] { engine.load_state(state); }, "skipped");
  state.counters[ZF_COUNTER_SKIPPED] = INT64_MAX - 1;
  engine.load_state(state);
  std::vector<HostTensor> overflow = make_grads(model, 1);
  overflow[0].set(0, INFINITY);
  engine.step(tensors_of(overflow));
  EXPECT_EQ(engine.stats().skipped_steps, INT64_MAX);
  zenflow::EngineState before = engine.save_state();
  const std::vector<HostTensor> weights = model.params;
  std::vector<HostTensor> good = make_grads(model, 2);
  expect_refused([&] { engine.step(tensors_of(good)); }, "skipped steps");
  zenflow::EngineState after = engine.save_state();
  EXPECT_TRUE(states_equal(before, after));
  for (size_t i = 0; i < model.params.size(); ++i) EXPECT_TRUE(model.params[i].bitwise_equal(weights[i])) << i;
}

// The loss scale stays a normal fp32, as torch's GradScaler keeps its fp32 scale: growth stops
// below FLT_MAX (a run whose gradients never overflow, all zeros here), backoff at FLT_MIN (a
// run that overflows step after step), so the fp32 gradient scale, its inverse, stays finite.
TEST(EngineCounterLimit, LossScaleStaysANormalFp32) {
  Model model = standard_model(ZF_DTYPE_F16, 7);
  zenflow::Engine growing(model.tensors(), model.param_groups, model.groups, loss_scaling_config(0x1p120));
  std::vector<HostTensor> zeros = make_grads(model, 1);
  for (HostTensor& g : zeros)
    for (int64_t e = 0; e < g.numel(); ++e) g.set(e, 0.0f);
  for (int step = 0; step < 12; ++step) growing.step(tensors_of(zeros));
  EXPECT_EQ(growing.loss_scale(), 0x1p127);  // 2^128 is past FLT_MAX

  Model other = standard_model(ZF_DTYPE_F16, 7);
  zenflow::Engine shrinking(other.tensors(), other.param_groups, other.groups, loss_scaling_config(0x1p-120));
  std::vector<HostTensor> overflow = make_grads(other, 1);
  overflow[2].set(1, NAN);
  for (int step = 0; step < 12; ++step) shrinking.step(tensors_of(overflow));
  EXPECT_EQ(shrinking.loss_scale(), double{FLT_MIN});
  EXPECT_EQ(shrinking.stats().skipped_steps, 12);
  std::vector<HostTensor> tiny = make_grads(other, 2);  // scaled by FLT_MIN: unscaled by 2^126
  for (HostTensor& g : tiny)
    for (int64_t e = 0; e < g.numel(); ++e) g.set(e, static_cast<float>(g.get(e) * 0x1p-140));
  shrinking.step(tensors_of(tiny));
  for (const HostTensor& p : other.params)
    for (int64_t e = 0; e < p.numel(); ++e) ASSERT_TRUE(std::isfinite(p.get(e)));
}

// The statistics counters (bytes moved, windows, reselections) stop at INT64_MAX instead of
// wrapping to a negative count.
TEST(EngineCounterLimit, StatisticsCountersSaturate) {
  int64_t counter = INT64_MAX - 5;
  zf::add_saturating(counter, 3);
  EXPECT_EQ(counter, INT64_MAX - 2);
  zf::add_saturating(counter, 1000);
  EXPECT_EQ(counter, INT64_MAX);
  zf::add_saturating(counter, 1);
  EXPECT_EQ(counter, INT64_MAX);
  int64_t zero = 0;
  zf::add_saturating(zero, INT64_MAX);
  EXPECT_EQ(zero, INT64_MAX);
}

}  // namespace
