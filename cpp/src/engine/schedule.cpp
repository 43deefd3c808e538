#include "engine/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/adam_math.hpp"
#include "common/error.hpp"

namespace zf {

Schedule::Schedule(const ScheduleConfig& config)
    : config_(config), warm_up_end_(config.auto_warm_up_rounds > 0 ? -1 : 0) {}

double start_signal_share(double sum_m_hat_sq, double sum_v_hat, int64_t step, double beta1) {
  if (!(sum_v_hat > 0.0) || !std::isfinite(sum_v_hat) || !std::isfinite(sum_m_hat_sq) || step < 2 || beta1 <= 0.0)
    return 0.0;
  // E[m_hat^2] / E[v_hat] for gradients of independent noise after t steps: the bias-corrected
  // EMA's weights (1 - b1) b1^(t - i) / (1 - b1^t), squared and summed.
  const double power = adam_beta_power(beta1, step);
  const double noise = (1.0 - beta1) / (1.0 + beta1) * (1.0 + power) / (1.0 - power);
  if (!(noise < 1.0)) return 0.0;
  return (sum_m_hat_sq / sum_v_hat - noise) / (1.0 - noise);
}

WindowStepValues window_step_values(zf_window_scaling scaling, int64_t steps, double lr, double weight_decay,
                                    zf_adam_mode mode) {
  if (scaling == ZF_WINDOW_SCALING_NONE || steps <= 1) return {lr, weight_decay, 1};
  const int32_t span = static_cast<int32_t>(std::min<int64_t>(steps, INT32_MAX));
  const double s = static_cast<double>(span);
  const double scaled_lr = lr * (scaling == ZF_WINDOW_SCALING_SQRT ? std::sqrt(s) : s);
  if (mode != ZF_ADAM_MODE_ADAMW || scaled_lr == 0.0) return {scaled_lr, weight_decay, span};
  // AdamW's decay of S steps, (1 - lr * wd)^S, as the one factor 1 - scaled_lr * wd' that
  // the kernel forms. (Adam's L2 term is part of each gradient, so the mean gradient's own
  // term is already the window's.)
  const double decay = adam_beta_power(1.0 - lr * weight_decay, span);
  return {scaled_lr, (1.0 - decay) / scaled_lr, span};
}

int64_t Schedule::select_period() const {
  const int64_t never = std::numeric_limits<int64_t>::max();
  switch (config_.strategy) {
    case ZF_SELECT_STEP:
      if (config_.select_interval > 0) return config_.select_interval;
      break;
    case ZF_SELECT_EPOCH: {
      // A period past INT64_MAX steps is never reached: "never again", not a wrapped product.
      int64_t period = 0;
      if (__builtin_mul_overflow(config_.select_interval > 0 ? config_.select_interval : 1, config_.steps_per_epoch,
                                 &period))
        return never;
      return period;
    }
    case ZF_SELECT_AUTO:
      break;
  }
  return config_.steps_per_epoch > 0 ? config_.steps_per_epoch : never;
}

Schedule::StepKind Schedule::begin_step() {
  ++step_;
  if (warm_up(step_)) return StepKind{true, true, false};
  StepKind kind{false, window_steps_ == 0, false};
  if (kind.window_start) ++window_;
  kind.select = force_selection_ || (kind.window_start && (selections_ == 0 || since_selection_ >= select_period()));
  if (kind.select) {
    since_selection_ = 0;
    ++selections_;
    force_selection_ = false;
  }
  ++since_selection_;
  ++window_steps_;
  return kind;
}

bool Schedule::end_step(int64_t due_matrices, int64_t counted_matrices) {
  if (warm_up(step_)) return true;
  bool close;
  if (config_.update_interval > 0) {
    close = window_steps_ >= config_.update_interval;
  } else {
    close = window_steps_ >= config_.max_update_interval ||
            (counted_matrices > 0 &&
             static_cast<double>(due_matrices) / static_cast<double>(counted_matrices) >= config_.auto_ratio);
  }
  if (close) {
    window_steps_ = 0;
    has_previous_window_ = true;
  }
  return close;
}

bool Schedule::matrix_due(const MatrixEnergy& e, int64_t steps_in_window) {
  if (!counted(e) || steps_in_window <= 0) return false;
  const double selected = e.selected_sum / (static_cast<double>(e.k) * static_cast<double>(steps_in_window));
  const double deferred = e.deferred_sum / static_cast<double>(e.n - e.k);
  return deferred >= selected;
}

void Schedule::check_room() const {
  const int64_t limit = std::numeric_limits<int64_t>::max();
  require(step_ < limit && window_ < limit && since_selection_ < limit && selections_ < limit, ZF_ERROR_INVALID_VALUE,
          "step: a schedule counter is at INT64_MAX (step ", step_, ", window ", window_, ", since selection ",
          since_selection_, ", selections ", selections_,
          "); the engine refuses further steps and changed nothing (load a state with smaller counters)");
}

void Schedule::save(int64_t* c) const {
  c[ZF_COUNTER_STEP] = step_;
  c[ZF_COUNTER_WINDOW] = window_;
  c[ZF_COUNTER_WINDOW_STEPS] = window_steps_;
  c[ZF_COUNTER_SINCE_SELECTION] = since_selection_;
  c[ZF_COUNTER_SELECTIONS] = selections_;
  c[ZF_COUNTER_HAS_PREVIOUS_WINDOW] = has_previous_window_ ? 1 : 0;
  c[ZF_COUNTER_WARM_UP_END] = config_.auto_warm_up_rounds > 0 ? warm_up_end_ : -1;
}

void Schedule::check(const int64_t* c) const {
  for (int i = ZF_COUNTER_STEP; i <= ZF_COUNTER_HAS_PREVIOUS_WINDOW; ++i) {
    require(c[i] >= 0, ZF_ERROR_INVALID_VALUE, "counters[", i, "]: negative (", c[i], ")");
    require(c[i] < std::numeric_limits<int64_t>::max(), ZF_ERROR_INVALID_VALUE, "counters[", i,
            "]: INT64_MAX, which no step can advance (a state that cannot take another step)");
  }
  require(c[ZF_COUNTER_HAS_PREVIOUS_WINDOW] <= 1, ZF_ERROR_INVALID_VALUE, "counters[",
          int{ZF_COUNTER_HAS_PREVIOUS_WINDOW}, "]: not 0 or 1");
  require(c[ZF_COUNTER_WARM_UP_END] >= -1 && c[ZF_COUNTER_WARM_UP_END] < std::numeric_limits<int64_t>::max(),
          ZF_ERROR_INVALID_VALUE, "counters[", int{ZF_COUNTER_WARM_UP_END}, "]: ", c[ZF_COUNTER_WARM_UP_END],
          " is not a synchronous start's end (-1 undecided, or a step count)");
  const int64_t bound = config_.update_interval > 0 ? config_.update_interval : config_.max_update_interval;
  require(c[ZF_COUNTER_WINDOW_STEPS] < bound, ZF_ERROR_INVALID_VALUE, "counters[", int{ZF_COUNTER_WINDOW_STEPS},
          "]: ", c[ZF_COUNTER_WINDOW_STEPS], " steps in the open window, this engine's windows close at ", bound);
}

void Schedule::load(const int64_t* c) {
  step_ = c[ZF_COUNTER_STEP];
  window_ = c[ZF_COUNTER_WINDOW];
  window_steps_ = c[ZF_COUNTER_WINDOW_STEPS];
  since_selection_ = c[ZF_COUNTER_SINCE_SELECTION];
  selections_ = c[ZF_COUNTER_SELECTIONS];
  has_previous_window_ = c[ZF_COUNTER_HAS_PREVIOUS_WINDOW] != 0;
  // An engine without detection ignores a decision. One with it takes the saved one; an
  // undecided state decides after its next step from the loaded moments (a fresh state, one of
  // an engine without detection, or torch's), unless windows have run (its start is over).
  warm_up_end_ = 0;
  if (config_.auto_warm_up_rounds > 0) {
    warm_up_end_ = c[ZF_COUNTER_WARM_UP_END];
    if (warm_up_end_ < 0 && c[ZF_COUNTER_WINDOW] > 0) warm_up_end_ = c[ZF_COUNTER_STEP];
  }
  force_selection_ = false;
}

}  // namespace zf
