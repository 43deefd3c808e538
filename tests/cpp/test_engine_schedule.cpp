// The engine's schedule on its own (cpp/src/engine/schedule.hpp): warm-up, fixed windows,
// selection periods, and the auto interval rule on scripted energies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.hpp"
#include "engine/schedule.hpp"

namespace {

using zf::MatrixEnergy;
using zf::Schedule;
using zf::ScheduleConfig;

struct Trace {
  std::vector<int64_t> closes;   // steps after which a window closed
  std::vector<int64_t> selects;  // steps that selected
  std::vector<int64_t> warm;     // warm-up steps
};

Trace run(const ScheduleConfig& config, int64_t steps) {
  Schedule s(config);
  Trace t;
  for (int64_t i = 1; i <= steps; ++i) {
    const Schedule::StepKind kind = s.begin_step();
    if (kind.warm_up) t.warm.push_back(i);
    if (kind.select) t.selects.push_back(i);
    if (s.end_step(0, 0)) t.closes.push_back(i);
  }
  return t;
}

TEST(EngineSchedule, FixedIntervalWindowsAndOneSelection) {
  ScheduleConfig c;
  c.update_interval = 3;
  const Trace t = run(c, 10);
  EXPECT_EQ(t.closes, (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(t.selects, (std::vector<int64_t>{1}));  // auto strategy, no epoch length: once
  EXPECT_TRUE(t.warm.empty());
}

TEST(EngineSchedule, WarmUpStepsAreWindowsOfTheirOwnThenTheGridStarts) {
  ScheduleConfig c;
  c.update_interval = 4;
  c.warm_up_rounds = 2;
  const Trace t = run(c, 11);
  EXPECT_EQ(t.warm, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(t.closes, (std::vector<int64_t>{1, 2, 6, 10}));
  EXPECT_EQ(t.selects, (std::vector<int64_t>{3}));
}

// auto_warm_up_rounds: steps are warm-up until the decision, due after step min(8, A); from
// scratch the start runs to A (and at least full_warm_up_rounds), else it ends at once.
TEST(EngineSchedule, TheDetectedStartRunsToItsLengthOrEndsAtTheDecision) {
  for (const bool from_scratch : {true, false}) {
    for (const int64_t fixed : {int64_t{0}, int64_t{5}, int64_t{12}}) {
      ScheduleConfig c;
      c.update_interval = 4;
      c.warm_up_rounds = fixed;
      c.auto_warm_up_rounds = 10;
      Schedule s(c);
      std::vector<int64_t> warm, decided_at;
      for (int64_t i = 1; i <= 20; ++i) {
        if (s.begin_step().warm_up) warm.push_back(i);
        s.end_step(0, 0);
        EXPECT_EQ(s.warm_up_steps(), decided_at.empty()
                                         ? -1
                                         : (from_scratch ? std::max<int64_t>(10, fixed) : std::max<int64_t>(8, fixed)));
        if (s.start_decision_due()) {
          decided_at.push_back(i);
          s.decide_start(from_scratch);
        }
      }
      EXPECT_EQ(decided_at, (std::vector<int64_t>{Schedule::kStartProbeSteps}));
      const int64_t end = std::max<int64_t>(fixed, from_scratch ? 10 : 8);
      ASSERT_EQ(warm.size(), static_cast<size_t>(end)) << "scratch " << from_scratch << " fixed " << fixed;
      EXPECT_EQ(warm.back(), end);
    }
  }
  ScheduleConfig short_start;  // A below the probe: decided after step A
  short_start.auto_warm_up_rounds = 3;
  Schedule s(short_start);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(s.begin_step().warm_up);
    s.end_step(0, 0);
  }
  EXPECT_TRUE(s.start_decision_due());
  s.decide_start(true);
  EXPECT_EQ(s.warm_up_steps(), 3);
  EXPECT_FALSE(s.begin_step().warm_up);
}

// The decision follows a checkpoint; an undecided state decides after its next step unless
// windows have run; an engine without detection ignores a saved decision.
TEST(EngineSchedule, TheStartDecisionFollowsACheckpoint) {
  ScheduleConfig c;
  c.update_interval = 4;
  c.auto_warm_up_rounds = 20;
  Schedule a(c);
  for (int i = 0; i < 9; ++i) {
    a.begin_step();
    a.end_step(0, 0);
    if (a.start_decision_due()) a.decide_start(true);
  }
  int64_t counters[ZF_ENGINE_STATE_COUNTERS] = {};
  a.save(counters);
  EXPECT_EQ(counters[ZF_COUNTER_WARM_UP_END], 20);
  Schedule b(c);
  b.check(counters);
  b.load(counters);
  EXPECT_EQ(b.warm_up_steps(), 20);
  EXPECT_FALSE(b.start_decision_due());
  counters[ZF_COUNTER_WARM_UP_END] = -1;  // undecided at step 9: decided after step 10
  b.load(counters);
  EXPECT_TRUE(b.begin_step().warm_up);
  b.end_step(0, 0);
  EXPECT_TRUE(b.start_decision_due());
  counters[ZF_COUNTER_WINDOW] = 2;  // undecided, but windows have run: the start is over
  b.load(counters);
  EXPECT_EQ(b.warm_up_steps(), 9);
  EXPECT_FALSE(b.begin_step().warm_up);
  counters[ZF_COUNTER_WARM_UP_END] = -2;
  EXPECT_THROW(b.check(counters), zf::Error);
  ScheduleConfig fixed = c;
  fixed.auto_warm_up_rounds = 0;
  Schedule none(fixed);
  counters[ZF_COUNTER_WARM_UP_END] = 20;
  counters[ZF_COUNTER_WINDOW] = 0;
  none.load(counters);
  EXPECT_EQ(none.warm_up_steps(), 0);
  EXPECT_FALSE(none.begin_step().warm_up);
  int64_t saved[ZF_ENGINE_STATE_COUNTERS] = {};
  none.save(saved);
  EXPECT_EQ(saved[ZF_COUNTER_WARM_UP_END], -1);  // no decision made
}

// The share: 0 for pure noise's ratio at any step, 1 for a constant gradient (m_hat^2 =
// v_hat), 0 when nothing can be read.
TEST(EngineSchedule, StartSignalShareFromTheMoments) {
  const double b1 = 0.9;
  for (int64_t t : {2, 3, 8, 100}) {
    const double p = std::pow(b1, static_cast<double>(t));
    const double noise = (1 - b1) / (1 + b1) * (1 + p) / (1 - p);
    EXPECT_NEAR(zf::start_signal_share(noise * 5.0, 5.0, t, b1), 0.0, 1e-12) << t;
    EXPECT_NEAR(zf::start_signal_share(5.0, 5.0, t, b1), 1.0, 1e-12) << t;
    EXPECT_NEAR(zf::start_signal_share((noise + 0.25 * (1 - noise)) * 2.0, 2.0, t, b1), 0.25, 1e-12) << t;
  }
  EXPECT_EQ(zf::start_signal_share(1.0, 0.0, 8, b1), 0.0);
  EXPECT_EQ(zf::start_signal_share(1.0, 1.0, 1, b1), 0.0);
  EXPECT_EQ(zf::start_signal_share(1.0, 1.0, 8, 0.0), 0.0);
  EXPECT_EQ(zf::start_signal_share(NAN, 1.0, 8, b1), 0.0);
}

TEST(EngineSchedule, StepStrategyRoundsUpToWholeWindows) {
  ScheduleConfig c;
  c.update_interval = 4;
  c.strategy = ZF_SELECT_STEP;
  c.select_interval = 6;  // rounded up to 8
  EXPECT_EQ(run(c, 20).selects, (std::vector<int64_t>{1, 9, 17}));
  c.select_interval = 4;
  EXPECT_EQ(run(c, 12).selects, (std::vector<int64_t>{1, 5, 9}));
  c.select_interval = 0;  // "auto" with step: as auto (no epoch length: once)
  EXPECT_EQ(run(c, 12).selects, (std::vector<int64_t>{1}));
}

TEST(EngineSchedule, EpochAndAutoStrategies) {
  ScheduleConfig c;
  c.update_interval = 2;
  c.strategy = ZF_SELECT_EPOCH;
  c.steps_per_epoch = 3;
  c.select_interval = 2;  // every 6 steps
  EXPECT_EQ(run(c, 14).selects, (std::vector<int64_t>{1, 7, 13}));
  c.strategy = ZF_SELECT_AUTO;  // once per epoch: 3 steps, rounded up to 4
  EXPECT_EQ(run(c, 10).selects, (std::vector<int64_t>{1, 5, 9}));
}

TEST(EngineSchedule, ForcedSelectionHappensAtTheNextStep) {
  ScheduleConfig c;
  c.update_interval = 4;
  Schedule s(c);
  for (int i = 0; i < 2; ++i) {
    s.begin_step();
    s.end_step(0, 0);
  }
  s.force_selection();
  const Schedule::StepKind kind = s.begin_step();
  EXPECT_TRUE(kind.select);
  EXPECT_FALSE(kind.window_start);
  EXPECT_EQ(s.selections(), 2);
}

TEST(EngineSchedule, AutoRuleMatrixDue) {
  // E_sel = sel / (k * steps), E_def = def / (n - k)
  EXPECT_FALSE(Schedule::matrix_due(MatrixEnergy{10.0, 4.0, 2, 6}, 1));    // 5 vs 1
  EXPECT_TRUE(Schedule::matrix_due(MatrixEnergy{10.0, 20.0, 2, 6}, 1));    // 5 vs 5
  EXPECT_FALSE(Schedule::matrix_due(MatrixEnergy{10.0, 3.9, 2, 6}, 2));    // 2.5 vs 0.975
  EXPECT_TRUE(Schedule::matrix_due(MatrixEnergy{10.0, 10.0, 2, 6}, 2));    // 2.5 vs 2.5: due (>=)
  EXPECT_FALSE(Schedule::matrix_due(MatrixEnergy{10.0, 100.0, 0, 6}, 2));  // k = 0: not counted
  EXPECT_FALSE(Schedule::matrix_due(MatrixEnergy{10.0, 100.0, 6, 6}, 2));  // k = n: not counted
}

TEST(EngineSchedule, AutoIntervalClosesOnRatioOrAtTheBound) {
  ScheduleConfig c;
  c.update_interval = 0;
  c.max_update_interval = 5;
  c.auto_ratio = 0.5;
  Schedule s(c);
  // Scripted due counts: window 1 closes when 1 of 2 matrices is due (ratio 0.5), at step 3.
  const int64_t due[] = {0, 0, 1, 0, 0, 0, 0, 0, 2};
  std::vector<int64_t> closes;
  for (int64_t t = 1; t <= 9; ++t) {
    s.begin_step();
    if (s.end_step(due[t - 1], 2)) closes.push_back(t);
  }
  // window 1: 1..3 (ratio); window 2: 4..8 (bound 5); window 3 starts at 9 and closes (2/2).
  EXPECT_EQ(closes, (std::vector<int64_t>{3, 8, 9}));
  // No counted matrix: only the bound closes.
  Schedule none(c);
  closes.clear();
  for (int64_t t = 1; t <= 10; ++t) {
    none.begin_step();
    if (none.end_step(0, 0)) closes.push_back(t);
  }
  EXPECT_EQ(closes, (std::vector<int64_t>{5, 10}));
}

TEST(EngineSchedule, CountersRoundTrip) {
  ScheduleConfig c;
  c.update_interval = 3;
  Schedule a(c);
  for (int i = 0; i < 4; ++i) {
    a.begin_step();
    a.end_step(0, 0);
  }
  int64_t counters[ZF_ENGINE_STATE_COUNTERS] = {};
  a.save(counters);
  Schedule b(c);
  b.check(counters);
  b.load(counters);
  for (int i = 0; i < 5; ++i) {
    const auto ka = a.begin_step(), kb = b.begin_step();
    EXPECT_EQ(ka.select, kb.select);
    EXPECT_EQ(a.end_step(0, 0), b.end_step(0, 0));
  }
  counters[ZF_COUNTER_WINDOW_STEPS] = 3;  // a full window cannot be open
  EXPECT_THROW(b.check(counters), zf::Error);
}

// Counters at INT64_MAX: such a state does not load, and a schedule one step short of it takes
// that step and then refuses the next (the engine asks before every step).
TEST(EngineSchedule, CountersStopBeforeInt64Max) {
  for (int counter :
       {int{ZF_COUNTER_STEP}, int{ZF_COUNTER_WINDOW}, int{ZF_COUNTER_SINCE_SELECTION}, int{ZF_COUNTER_SELECTIONS}}) {
    ScheduleConfig c;
    c.update_interval = 1;  // every step starts a window; selects every step, or (auto) never again
    c.strategy = counter == ZF_COUNTER_SINCE_SELECTION ? ZF_SELECT_AUTO : ZF_SELECT_STEP;
    c.select_interval = 1;
    int64_t counters[ZF_ENGINE_STATE_COUNTERS] = {};
    counters[ZF_COUNTER_SELECTIONS] = 1;  // as after one step
    counters[ZF_COUNTER_SINCE_SELECTION] = 1;
    counters[counter] = INT64_MAX;
    Schedule s(c);
    EXPECT_THROW(s.check(counters), zf::Error) << "counter " << counter;
    counters[counter] = INT64_MAX - 1;
    s.check(counters);
    s.load(counters);
    s.check_room();
    s.begin_step();
    s.end_step(0, 0);
    EXPECT_THROW(s.check_room(), zf::Error) << "counter " << counter;
  }
}

// An epoch period past INT64_MAX steps (select_interval times steps_per_epoch) is "never
// again", not a wrapped, negative product.
TEST(EngineSchedule, EpochPeriodPastInt64MaxIsNever) {
  ScheduleConfig c;
  c.strategy = ZF_SELECT_EPOCH;
  c.select_interval = int64_t{1} << 40;
  c.steps_per_epoch = int64_t{1} << 40;
  EXPECT_EQ(Schedule(c).select_period(), INT64_MAX);
  c.select_interval = 3;
  c.steps_per_epoch = INT64_MAX / 3;
  EXPECT_EQ(Schedule(c).select_period(), INT64_MAX / 3 * 3);
  const Trace t = run(c, 5);
  EXPECT_EQ(t.selects, (std::vector<int64_t>{1}));
}

}  // namespace

namespace {

// The window update's values (window_scaling): none and one-step windows leave the closing
// step's values; sqrt and linear scale the lr and spread AdamW's decay of S steps,
// (1 - lr wd)^S, over the scaled lr; Adam's L2 coefficient is part of each gradient and stays.
TEST(WindowStepValues, EachScalingAsDocumented) {
  const double lr = 3e-3, wd = 0.1;
  for (const zf_window_scaling scaling : {ZF_WINDOW_SCALING_NONE, ZF_WINDOW_SCALING_SQRT, ZF_WINDOW_SCALING_LINEAR}) {
    const zf::WindowStepValues one = zf::window_step_values(scaling, 1, lr, wd, ZF_ADAM_MODE_ADAMW);
    EXPECT_EQ(one.lr, lr);
    EXPECT_EQ(one.weight_decay, wd);
    EXPECT_EQ(one.span, 1);
  }
  const zf::WindowStepValues none = zf::window_step_values(ZF_WINDOW_SCALING_NONE, 4, lr, wd, ZF_ADAM_MODE_ADAMW);
  EXPECT_EQ(none.lr, lr);
  EXPECT_EQ(none.weight_decay, wd);
  EXPECT_EQ(none.span, 1);
  for (const int64_t steps : {2, 3, 4, 16, 1000}) {
    const double s = static_cast<double>(steps);
    const zf::WindowStepValues root = zf::window_step_values(ZF_WINDOW_SCALING_SQRT, steps, lr, wd, ZF_ADAM_MODE_ADAMW);
    const zf::WindowStepValues linear =
        zf::window_step_values(ZF_WINDOW_SCALING_LINEAR, steps, lr, wd, ZF_ADAM_MODE_ADAMW);
    EXPECT_EQ(root.span, steps);
    EXPECT_EQ(linear.span, steps);
    EXPECT_DOUBLE_EQ(root.lr, lr * std::sqrt(s));
    EXPECT_DOUBLE_EQ(linear.lr, lr * s);
    const double decay = std::pow(1.0 - lr * wd, s);
    EXPECT_NEAR(1.0 - root.lr * root.weight_decay, decay, 1e-15) << steps;
    EXPECT_NEAR(1.0 - linear.lr * linear.weight_decay, decay, 1e-15) << steps;
    const zf::WindowStepValues adam = zf::window_step_values(ZF_WINDOW_SCALING_SQRT, steps, lr, wd, ZF_ADAM_MODE_ADAM);
    EXPECT_DOUBLE_EQ(adam.lr, lr * std::sqrt(s));
    EXPECT_EQ(adam.weight_decay, wd);
  }
  // lr 0 (a schedule at its end): nothing moves, and the decay is not divided by 0
  const zf::WindowStepValues still = zf::window_step_values(ZF_WINDOW_SCALING_SQRT, 4, 0.0, wd, ZF_ADAM_MODE_ADAMW);
  EXPECT_EQ(still.lr, 0.0);
  EXPECT_EQ(still.weight_decay, wd);
}

}  // namespace
