// The engine's schedule (docs/design.md section 3): which steps are warm-up, where windows
// start and close, and which window starts re-select. Pure bookkeeping, no tensors, so every
// rule is unit-tested on its own (tests/cpp/test_engine_schedule.cpp).
//
// Steps t = 1, 2, ... count only steps that were not skipped. Steps 1..W0 are warm-up: each
// is a window of its own, closed (synchronously) after its step, with nothing selected.
// W0 = max(full_warm_up_rounds, E), where E is decided once when auto_warm_up_rounds A > 0:
// steps are warm-up while E is undecided, and after the first step t >= min(kStartProbeSteps,
// A) the engine reads the matrices' Adam moments (start_signal_share) and calls decide_start:
// E = max(A, t) when the share is at least kFromScratchShare (a model trained from scratch),
// else E = t. With A = 0 there is no decision (E = 0).
// After warm-up, windows follow one another:
//   * fixed update_interval S: every window has S steps;
//   * update_interval "auto" (0): the window closes after a step when
//       due / counted >= auto_ratio   (counted > 0), or
//       steps in the window == max_update_interval   (always the bound),
//     where, per matrix with 0 < k < n, over the steps of the window so far,
//       E_sel = selected_sum / (k * steps),  E_def = deferred_sum / (n - k),
//     selected_sum / deferred_sum being the column norms sqrt(c) of the raw gradients (c the
//     column sums of squares) summed over the selected / deferred columns and over those
//     steps; the matrix is due when E_def >= E_sel (matrix_due below). Matrices with k == 0
//     or k == n are not counted.
// Selection happens at the first step of window 1 and at the first step of every later
// window for which steps_since_selection >= period (so with fixed S a "step" interval is
// rounded up to whole windows), where period is
//   * STEP:  select_interval (select_interval "auto" = 0: as AUTO);
//   * EPOCH: select_interval (0 counts as 1) * steps_per_epoch;
//   * AUTO:  steps_per_epoch when known (> 0), else never again after window 1.
// A selection can also be forced (after loading a state whose selection does not fit): it
// then happens at the next step, window start or not.
#pragma once

#include <algorithm>
#include <cstdint>

#include "zenflow/engine.h"
#include "zenflow/optim.h"

namespace zf {

struct ScheduleConfig {
  int64_t warm_up_rounds = 0;
  int64_t auto_warm_up_rounds = 0;  // 0: no detection
  int64_t update_interval = 4;      // 0: auto
  int64_t max_update_interval = 16;
  double auto_ratio = 0.99;
  zf_select_strategy strategy = ZF_SELECT_AUTO;
  int64_t select_interval = 0;  // 0: auto
  int64_t steps_per_epoch = 0;
  int64_t update_lag = 0;  // 0: an overlapped update lands at the next close
};

// The values of a window's host update (config window_scaling, engine.h zf_window_scaling)
// for one group, from the lr and weight decay of the window's closing step: `steps` (>= 1) is
// the steps accumulated in the window. span: AdamRunValues::step_span.
struct WindowStepValues {
  double lr;
  double weight_decay;
  int32_t span;
};
WindowStepValues window_step_values(zf_window_scaling scaling, int64_t steps, double lr, double weight_decay,
                                    zf_adam_mode mode);

// One matrix's window sums for the auto rule.
struct MatrixEnergy {
  double selected_sum;
  double deferred_sum;
  int64_t k;
  int64_t n;
};

// The consistent share of the gradient that Adam's moments show after step t (the
// header comment): sum_m_hat_sq = sum of (m / (1 - b1^s))^2 and sum_v_hat = sum of v / (1 -
// b2^s) over the matrices' elements (s their step counts). 0 when nothing can be read (no
// moments, beta1 0, t < 2).
double start_signal_share(double sum_m_hat_sq, double sum_v_hat, int64_t step, double beta1);

class Schedule {
 public:
  // Steps the detection reads before it decides, and the share above which a run looks like
  // one from scratch. Measured (benchmarks/results/2026-12-06-auto-warm-up.md): after 8 steps
  // of AdamW the share was 0.48 to 0.58 from scratch (GPT-2- and Llama-style, lr 1e-3 and
  // 3e-3) and 0.05 to 0.11 fine-tuning the demo's pretrained models.
  static constexpr int64_t kStartProbeSteps = 8;
  static constexpr double kFromScratchShare = 0.25;

  explicit Schedule(const ScheduleConfig& config);

  struct StepKind {
    bool warm_up;       // a plain synchronous step, nothing selected
    bool window_start;  // first step of a window
    bool select;        // select (after a flush) before this step's update
  };
  // Called once per step that is not skipped, before its work.
  StepKind begin_step();
  // Called after the step's work: true when the window closes after this step. due and
  // counted are the auto rule's counts (ignored with a fixed interval).
  bool end_step(int64_t due_matrices, int64_t counted_matrices);
  // After an end_step that kept the window open: true when the previous window's overlapped
  // host update lands now (update_lag L >= 1, the window's L-th step). The rule reads only
  // the step count, so the landing step never depends on the host's speed.
  bool update_lands() const { return config_.update_lag > 0 && window_steps_ == config_.update_lag; }
  // Before begin_step: true when the next step, if it is not skipped, closes its window for
  // certain: a warm-up step, a fixed window's S-th step, or an adaptive window's step at
  // max_update_interval (the auto rule may close one earlier, which is not known before).
  bool next_step_closes() const {
    if (warm_up(step_ + 1)) return true;
    const int64_t bound = config_.update_interval > 0 ? config_.update_interval : config_.max_update_interval;
    return window_steps_ + 1 >= bound;
  }

  // The auto rule for one matrix (the header comment); false for a matrix not counted.
  static bool matrix_due(const MatrixEnergy& energy, int64_t steps_in_window);
  static bool counted(const MatrixEnergy& energy) { return energy.k > 0 && energy.k < energy.n; }

  // Whether step t is a warm-up step (t <= W0, or the start is still undecided).
  bool warm_up(int64_t t) const { return t <= config_.warm_up_rounds || warm_up_end_ < 0 || t <= warm_up_end_; }
  // After a warm-up step: true when the engine must decide the start now (the header comment).
  bool start_decision_due() const {
    return warm_up_end_ < 0 && step_ >= std::min(kStartProbeSteps, config_.auto_warm_up_rounds);
  }
  void decide_start(bool from_scratch) {
    warm_up_end_ = from_scratch ? std::max(config_.auto_warm_up_rounds, step_) : step_;
  }
  // W0 (the synchronous start's steps), -1 while undecided.
  int64_t warm_up_steps() const { return warm_up_end_ < 0 ? -1 : std::max(config_.warm_up_rounds, warm_up_end_); }

  void force_selection() { force_selection_ = true; }
  bool auto_interval() const { return config_.update_interval == 0; }
  // Steps between selections; INT64_MAX for "never again".
  int64_t select_period() const;

  int64_t step() const { return step_; }
  int64_t window() const { return window_; }
  int64_t window_steps() const { return window_steps_; }
  int64_t since_selection() const { return since_selection_; }
  int64_t selections() const { return selections_; }
  bool has_previous_window() const { return has_previous_window_; }

  // Throws zf::Error (INVALID_VALUE) when begin_step could take a counter past INT64_MAX.
  void check_room() const;

  // Checkpoint: the counters above, in the order of ZF_COUNTER_STEP .. HAS_PREVIOUS_WINDOW, and
  // ZF_COUNTER_WARM_UP_END (-1 undecided, and from an engine without detection).
  void save(int64_t* counters) const;
  // Throws zf::Error (INVALID_VALUE) on an inconsistent set, or one with a counter that no
  // step could advance (INT64_MAX), changing nothing.
  void check(const int64_t* counters) const;
  void load(const int64_t* counters);

 private:
  ScheduleConfig config_;
  int64_t step_ = 0;
  int64_t window_ = 0;
  int64_t window_steps_ = 0;
  int64_t since_selection_ = 0;
  int64_t selections_ = 0;
  bool has_previous_window_ = false;
  bool force_selection_ = false;
  // The decided end E of the synchronous start: -1 undecided (auto_warm_up_rounds > 0), 0
  // without detection.
  int64_t warm_up_end_ = 0;
};

}  // namespace zf
