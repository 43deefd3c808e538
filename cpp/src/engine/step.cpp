// The state machine's step, in order, and its windows and flush (engine.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.hpp"
#include "engine/engine.hpp"
#include "engine/host_backend.hpp"

namespace zf {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

// ---- the step ----

void Engine::step(const zf_tensor* grads, size_t count, const double* lrs, size_t lr_count) {
  require(!in_split_step_, ZF_ERROR_INVALID_VALUE, "step: a split step (begin_step) is open");
  poll_host_lane();
  require(count == params_.size(), ZF_ERROR_INVALID_VALUE, "grads: ", count, " gradients for ", params_.size(),
          " parameters");
  require(count == 0 || grads != nullptr, ZF_ERROR_INVALID_VALUE, "grads: NULL");
  for (size_t i = 0; i < count; ++i) check_grad(grads[i], i);
  check_lrs(lrs, lr_count);
  run_step(grads, lrs);
}

void Engine::begin_step(const double* lrs, size_t lr_count) {
  require(!in_split_step_, ZF_ERROR_INVALID_VALUE, "begin_step: a split step is already open");
  poll_host_lane();
  check_lrs(lrs, lr_count);
  split_has_lrs_ = lrs != nullptr;
  split_lrs_.assign(lrs, lrs + (lrs ? lr_count : 0));
  submitted_.assign(params_.size(), zf_tensor{});
  submitted_flags_.assign(params_.size(), 0);
  in_split_step_ = true;
}

void Engine::submit(size_t first, const zf_tensor* grads, size_t count) {
  require(in_split_step_, ZF_ERROR_INVALID_VALUE, "submit: no split step is open (call begin_step)");
  require(first <= params_.size() && count <= params_.size() - first, ZF_ERROR_INVALID_VALUE, "submit: parameters [",
          first, ", ", first + count, ") out of range (", params_.size(), " parameters)");
  require(count == 0 || grads != nullptr, ZF_ERROR_INVALID_VALUE, "grads: NULL");
  for (size_t j = 0; j < count; ++j) {
    require(!submitted_flags_[first + j], ZF_ERROR_INVALID_VALUE, "submit: parameter ", first + j,
            " was already submitted in this step");
    check_grad(grads[j], first + j);
  }
  for (size_t j = 0; j < count; ++j) {
    submitted_[first + j] = grads[j];
    submitted_flags_[first + j] = 1;
  }
}

void Engine::end_step() {
  require(in_split_step_, ZF_ERROR_INVALID_VALUE, "end_step: no split step is open (call begin_step)");
  for (size_t i = 0; i < params_.size(); ++i)
    require(submitted_flags_[i], ZF_ERROR_INVALID_VALUE, "end_step: parameter ", i,
            " was not submitted (the split step stays open)");
  in_split_step_ = false;
  run_step(submitted_.data(), split_has_lrs_ ? split_lrs_.data() : nullptr);
}

void Engine::abort_step() {
  // The host backend does a split step's work only at end_step, so forgetting the submitted
  // gradients undoes it completely. No split step open: nothing to do.
  in_split_step_ = false;
  submitted_.clear();
  submitted_flags_.clear();
  split_lrs_.clear();
  split_has_lrs_ = false;
}

size_t Engine::find_nonfinite(const zf_tensor* grads) const {
  // Rare path: one statistics pass per parameter to name the first non-finite one.
  for (size_t i = 0; i < params_.size(); ++i) {
    ColumnStatsPlan plan({ColumnStatsMatrix{params_[i].rows, params_[i].cols, params_[i].tensor.dtype}});
    std::vector<float> col_sq(static_cast<size_t>(params_[i].cols));
    float* col = col_sq.data();
    const void* grad = grads[i].data;
    float total = 0.0f;
    int32_t nonfinite = 0;
    plan.run(static_cast<HostBackend&>(*backend_).pool(), &grad, &col, &total, &nonfinite, false);
    if (nonfinite) return i;
  }
  return 0;
}

void Engine::run_step(const zf_tensor* grads, const double* lrs) {
  check_usable();
  initialize_state();
  // 1. statistics of every gradient: column sums of squares, total, non-finite flag
  grad_ptrs_.resize(params_.size());
  col_sq_ptrs_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    grad_ptrs_[i] = grads[i].data;
    const Param& p = params_[i];
    col_sq_ptrs_[i] = p.matrix ? matrices_[p.index].col_sq.data() : dense_[p.index].col_sq.data();
  }
  float total_sq = 0.0f;
  int32_t nonfinite = 0;
  backend_->column_stats(*stats_plan_, grad_ptrs_.data(), col_sq_ptrs_.data(), &total_sq, &nonfinite);
  if (nonfinite) {
    if (config_.loss_scaling == ZF_LOSS_SCALING_DYNAMIC) {
      ++skipped_steps_;  // an overflow is part of the run; without loss scaling it is bad input
      loss_scale_ *= config_.backoff_factor;
      growth_tracker_ = 0;
      return;
    }
    fail(ZF_ERROR_INVALID_VALUE, "grads[", find_nonfinite(grads),
         "]: non-finite gradient (Inf or NaN); the step was skipped and nothing was written");
  }
  // 2. norm, clip coefficient; the scale every gradient of the step gets
  const double norm = std::sqrt(static_cast<double>(total_sq)) / loss_scale_;
  last_norm_ = norm;
  const double clip = config_.max_grad_norm > 0.0 ? std::min(1.0, config_.max_grad_norm / (norm + 1e-6)) : 1.0;
  const auto grad_scale = static_cast<float>(clip / loss_scale_);
  if (config_.loss_scaling == ZF_LOSS_SCALING_DYNAMIC && ++growth_tracker_ >= config_.growth_interval) {
    loss_scale_ *= config_.growth_factor;  // takes effect from the next step, as GradScaler.update()
    growth_tracker_ = 0;
  }
  step_lrs_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) step_lrs_[g] = lrs ? lrs[g] : groups_[g].lr;

  const Schedule::StepKind kind = schedule_.begin_step();
  // 3. selection (after a flush), the lossless exchange
  if (kind.select) select_columns();
  // 4. AdamW of the selected columns and the dense parameters
  device_pointers_.resize(device_plan_params_.size());
  for (size_t e = 0; e < device_plan_params_.size(); ++e) {
    const Param& p = params_[device_plan_params_[e]];
    AdamwSelectedPointers& ptr = device_pointers_[e];
    ptr.param = p.tensor.data;
    ptr.grad = grads[device_plan_params_[e]].data;
    ptr.lr = step_lrs_[static_cast<size_t>(p.group)];
    ptr.weight_decay = groups_[static_cast<size_t>(p.group)].weight_decay;
    if (p.matrix) {
      Matrix& m = matrices_[p.index];
      ptr.selected = m.selected.data();
      ptr.master = m.has_master ? device_float(m.dev_master) : nullptr;
      ptr.exp_avg = device_float(m.dev_exp_avg);
      ptr.exp_avg_sq = device_float(m.dev_exp_avg_sq);
      ptr.steps = device_int(m.dev_steps);
    } else {
      Dense& d = dense_[p.index];
      ptr.selected = nullptr;
      ptr.master = d.has_master ? device_float(d.dev_master) : nullptr;
      ptr.exp_avg = device_float(d.dev_exp_avg);
      ptr.exp_avg_sq = device_float(d.dev_exp_avg_sq);
      ptr.steps = device_int(d.dev_steps);
    }
  }
  if (!device_pointers_.empty()) backend_->adamw_selected(*device_plan_, device_pointers_.data(), grad_scale);
  // 5. deferred columns through the staging ring into the host accumulator
  for (Bucket& b : buckets_) defer_bucket(b, grads, grad_scale);
  if (!buckets_.empty()) {
    ++steps_accumulated_;
    last_lr_ = step_lrs_;
  }
  // 6. window bookkeeping, close
  int64_t due = 0, counted = 0;
  window_bookkeeping(kind.warm_up, &due, &counted);
  if (schedule_.end_step(due, counted)) close_window(kind.warm_up);
}

void Engine::window_bookkeeping(bool warm_up, int64_t* due, int64_t* counted) {
  if (warm_up) return;
  const bool window_scores = config_.selection_score == ZF_SCORE_WINDOW;
  const bool auto_interval = schedule_.auto_interval();
  if (!window_scores && !auto_interval) return;
  for (Matrix& m : matrices_) {
    const size_t n = static_cast<size_t>(m.cols);
    if (window_scores) {
      float* current = m.window_score.data() + n;
      for (size_t j = 0; j < n; ++j) current[j] += m.col_sq[j];
    }
    if (!auto_interval) continue;
    const MatrixEnergy probe{0.0, 0.0, static_cast<int64_t>(m.selected.size()), m.cols};
    if (!Schedule::counted(probe)) continue;
    double selected_sum = 0.0, deferred_sum = 0.0;
    size_t s = 0;
    for (size_t j = 0; j < n; ++j) {
      if (s < m.selected.size() && static_cast<size_t>(m.selected[s]) == j) {
        selected_sum += m.col_sq[j];
        ++s;
      } else {
        deferred_sum += m.col_sq[j];
      }
    }
    m.energy[0] = static_cast<float>(m.energy[0] + selected_sum);
    m.energy[1] = static_cast<float>(m.energy[1] + deferred_sum);
    ++*counted;
    if (Schedule::matrix_due(MatrixEnergy{m.energy[0], m.energy[1], probe.k, probe.n}, schedule_.window_steps()))
      ++*due;
  }
}

void Engine::defer_bucket(Bucket& b, const zf_tensor* grads, float grad_scale) {
  if (b.packed_bytes == 0) return;
  const size_t slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % slot_jobs_.size();
  if (slot_jobs_[slot]) {  // back-pressure: the host still holds this slot
    wait_job(slot_jobs_[slot], &stall_back_pressure_);
    slot_jobs_[slot].reset();
  }
  for (size_t i = b.first; i < b.last; ++i) b.grad_ptrs[i - b.first] = grads[matrices_[i].param].data;
  uint8_t* device_slot = device_ + staging_offset_ + slot * slot_stride_;
  backend_->pack(*b.pack, b.grad_ptrs.data(), b.selected_ptrs.data(), device_slot + kSlotHeaderBytes);
  const SlotHeader header{grad_scale, 0};
  std::memcpy(device_slot, &header, sizeof(header));  // on CUDA: a tiny kernel writes it
  uint8_t* host_slot = host_slots_.data() + slot * slot_stride_;
  backend_->copy_down(host_slot, device_slot, kSlotHeaderBytes + b.packed_bytes);
  const int acc = acc_current_;
  slot_jobs_[slot] = lane_->submit_accumulate([&b, host_slot, acc](ThreadPool& pool) {
    SlotHeader h;
    std::memcpy(&h, host_slot, sizeof(h));
    if (h.skip) return;
    b.accumulate.run(pool, b.acc_tensors[acc].data(), host_slot + kSlotHeaderBytes, h.grad_scale);
  });
  bytes_down_ += static_cast<int64_t>(b.packed_bytes);
}

void Engine::wait_all_slots(double* stall) {
  for (auto& job : slot_jobs_) {
    if (job) wait_job(job, stall);
    job.reset();
  }
}

// ---- windows ----

void Engine::start_update() {
  // The host AdamW of the deferred columns on A / steps_accumulated, one chunk per matrix,
  // writing the upload copy U; A is zeroed as it is consumed.
  std::vector<WorkQueue::Chunk> chunks;
  const int acc = acc_current_;
  const float scale = 1.0f / static_cast<float>(steps_accumulated_);
  for (Matrix& m : matrices_) {
    if (m.selected.size() == static_cast<size_t>(m.cols)) continue;
    const size_t group = static_cast<size_t>(params_[m.param].group);
    const double lr = last_lr_[group];
    const double wd = groups_[group].weight_decay;
    uint8_t* out = upload_.data() + m.upload_offset;
    const zf_adam_hparams hparams = hparams_;
    chunks.push_back([this, &m, acc, scale, lr, wd, out, hparams](ThreadPool& pool) {
      const zf_column_state state = host_state(m, true);
      zf_tensor grad = state.exp_avg;
      grad.data = m.acc[acc].data();
      ColumnStepPointers pointers{&state, &grad, nullptr, out};
      AdamRunValues values{&lr, &wd, hparams, scale, ZF_CPU_ADAMW_ZERO_GRAD | ZF_CPU_ADAMW_INCREMENT_STEPS};
      m.update_plan.run(pool, pointers, values);
    });
  }
  acc_current_ ^= 1;
  steps_accumulated_ = 0;
  if (!chunks.empty()) inflight_ = lane_->submit_update(std::move(chunks));
}

void Engine::finish_update(double* stall) {
  if (!inflight_) return;
  auto job = std::move(inflight_);
  inflight_.reset();
  wait_job(job, stall);
  // Upload U bucket by bucket: copy up, then scatter into W[:, unselected].
  uint8_t* device_upload = device_ + upload_buffer_offset_;
  for (Bucket& b : buckets_) {
    if (b.packed_bytes == 0) continue;
    backend_->copy_up(device_upload, upload_.data() + b.upload_offset, b.packed_bytes);
    for (size_t i = b.first; i < b.last; ++i) b.param_ptrs[i - b.first] = params_[matrices_[i].param].tensor.data;
    backend_->scatter(*b.pack, b.param_ptrs.data(), b.selected_ptrs.data(), device_upload);
    bytes_up_ += static_cast<int64_t>(b.packed_bytes);
  }
}

void Engine::close_window(bool warm_up) {
  const bool had_steps = steps_accumulated_ > 0;
  if (config_.overlap_step && !warm_up) {
    finish_update(&stall_close_);  // window w-1's result goes up now
    if (had_steps) start_update();
  } else if (had_steps) {
    start_update();
    finish_update(&stall_close_);
  }
  if (!warm_up && had_steps) ++windows_;
  for (Matrix& m : matrices_) {
    m.energy[0] = m.energy[1] = 0.0f;
    if (!warm_up && config_.selection_score == ZF_SCORE_WINDOW) {
      const size_t n = static_cast<size_t>(m.cols);
      std::copy(m.window_score.begin() + n, m.window_score.end(), m.window_score.begin());
      std::fill(m.window_score.begin() + n, m.window_score.end(), 0.0f);
    }
  }
}

void Engine::flush_internal() {
  const auto start = Clock::now();
  double ignored = 0.0;
  finish_update(&ignored);
  if (steps_accumulated_ > 0) {
    start_update();
    if (schedule_.step() > config_.full_warm_up_rounds) ++windows_;
    finish_update(&ignored);
  }
  wait_all_slots(&ignored);
  stall_flush_ += seconds_since(start);
}

void Engine::flush() {
  require(!in_split_step_, ZF_ERROR_INVALID_VALUE, "flush: a split step is open");
  poll_host_lane();
  if (!initialized_) return;
  flush_internal();
}

}  // namespace zf
