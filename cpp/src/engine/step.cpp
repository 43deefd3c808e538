// The state machine's step, in order, and its windows and flush (engine.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/adam_math.hpp"
#include "common/error.hpp"
#include "engine/engine.hpp"

namespace zf {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

// ---- the step ----

void Engine::step(const zf_tensor* grads, size_t count, const double* lrs, size_t lr_count) {
  if (agree(Agreement::kStep, [&] { check_step_arguments(grads, count, lrs, lr_count); }))
    return step_as_split(grads, lrs, lr_count);
  closing_into_upload_ = closing_step_into_upload();
  run_step(grads, lrs, false);
}

void Engine::step_as_split(const zf_tensor* grads, const double* lrs, size_t lr_count) {
  // Data parallel: other ranks began a split step (their backward handed gradients over; this
  // rank's had none to hand). Their collectives are the split step's, so this rank takes the
  // same form, with every gradient at once. Its checks passed in the agreement; a host-lane
  // failure found since still joins the others' collectives, as refused.
  try {
    open_split_step(lrs, lr_count);
  } catch (...) {
    const std::exception_ptr local = std::current_exception();
    in_split_step_ = true;
    start_split_reductions();
    end_split_step_refused(local);
  }
  submit(0, grads, params_.size());
  end_step();
}

void Engine::check_step_arguments(const zf_tensor* grads, size_t count, const double* lrs, size_t lr_count) {
  require(!in_split_step_, ZF_ERROR_INVALID_VALUE, "step: a split step (begin_step) is open");
  poll_host_lane();
  require(count == params_.size(), ZF_ERROR_INVALID_VALUE, "grads: ", count, " gradients for ", params_.size(),
          " parameters");
  require(count == 0 || grads != nullptr, ZF_ERROR_INVALID_VALUE, "grads: NULL");
  for (size_t i = 0; i < count; ++i) check_grad(grads[i], i);
  check_lrs(lrs, lr_count);
  check_counters_have_room();
}

void Engine::check_counters_have_room() const {
  require(step_count_bound_ < INT32_MAX, ZF_ERROR_INVALID_VALUE,
          "step: an Adam step count may have reached INT32_MAX (2147483647), the most its int32 holds (the largest "
          "count loaded plus the steps taken since is ",
          step_count_bound_,
          "); the engine refuses further steps and changed nothing (load a state with smaller counts)");
  schedule_.check_room();
  require(skipped_steps_ < INT64_MAX, ZF_ERROR_INVALID_VALUE,
          "step: the count of skipped steps is at INT64_MAX; the engine refuses further steps and changed nothing");
}

void Engine::begin_step(const double* lrs, size_t lr_count) {
  if (!parallel()) return open_split_step(lrs, lr_count);
  // Data parallel: the split step's collectives start at submit (its buckets are reduced as
  // they fill), so the ranks agree first. A refusal fails every rank here; none stays open.
  const bool was_open = in_split_step_;
  try {
    agree(Agreement::kSplitStep, [&] { open_split_step(lrs, lr_count); });
  } catch (...) {
    if (!was_open && in_split_step_) drop_split_step();
    throw;
  }
}

void Engine::open_split_step(const double* lrs, size_t lr_count) {
  require(!in_split_step_, ZF_ERROR_INVALID_VALUE, "begin_step: a split step is already open");
  poll_host_lane();
  check_lrs(lrs, lr_count);
  check_counters_have_room();
  initialize_state();
  split_has_lrs_ = lrs != nullptr;
  split_lrs_.assign(lrs, lrs + (lrs ? lr_count : 0));
  submitted_.assign(params_.size(), zf_tensor{});
  submitted_flags_.assign(params_.size(), 0);
  held_gradient_bytes_ = held_gradient_bytes_peak_ = 0;
  deferred_split_error_ = nullptr;
  // A selection step needs every column sum before anything is packed: its work waits for
  // end_step. Any other step starts at submit (the schedule is not advanced by a peek). A
  // data-parallel one reduces each bucket as it fills, then takes its statistics and (but at
  // a selection step) packs and copies it down.
  early_ = !next_step_selects() && !parallel();
  closing_into_upload_ = closing_step_into_upload();
  if (early_ || parallel()) start_split_reductions();
  in_split_step_ = true;
}

void Engine::start_split_reductions() {
  ensure_device_memory();
  split_select_ = next_step_selects();
  buckets_reduced_ = 0;
  backend_->fill_device_zero(arena_.base() + flags_offset_, (flag_count() + agreement_slots()) * 4);
  bucket_pending_.assign(buckets_.size(), 0);
  for (const Bucket& b : buckets_) bucket_pending_[static_cast<size_t>(&b - buckets_.data())] = b.last - b.first;
  bucket_early_.assign(buckets_.size(), 0);
  bucket_reduced_.assign(buckets_.size(), 0);
  bucket_released_.assign(buckets_.size(), 0);
  releases_pending_.clear();
  early_buckets_.clear();
}

ColumnStatsPlan& Engine::range_stats_plan(size_t first, size_t count) {
  std::unique_ptr<ColumnStatsPlan>& plan = range_plans_[{first, count}];
  if (!plan) {
    std::vector<ColumnStatsMatrix> matrices;
    for (size_t i = first; i < first + count; ++i)
      matrices.push_back(ColumnStatsMatrix{params_[i].rows, params_[i].cols, params_[i].tensor.dtype});
    plan = std::make_unique<ColumnStatsPlan>(std::move(matrices));
  }
  return *plan;
}

void Engine::check_submit_arguments(size_t first, const zf_tensor* grads, size_t count) const {
  require(in_split_step_, ZF_ERROR_INVALID_VALUE, "submit: no split step is open (call begin_step)");
  require(first <= params_.size() && count <= params_.size() - first, ZF_ERROR_INVALID_VALUE, "submit: parameters [",
          first, ", ", first + count, ") out of range (", params_.size(), " parameters)");
  require(count == 0 || grads != nullptr, ZF_ERROR_INVALID_VALUE, "grads: NULL");
  for (size_t j = 0; j < count; ++j) {
    require(!submitted_flags_[first + j], ZF_ERROR_INVALID_VALUE, "submit: parameter ", param_name(first + j),
            " was already submitted in this step");
    check_grad(grads[j], first + j);
  }
}

void Engine::submit(size_t first, const zf_tensor* grads, size_t count) {
  if (parallel()) {
    // As in begin_step: the first refusal waits for end_step's agreement.
    if (deferred_split_error_) return;
    try {
      check_submit_arguments(first, grads, count);
    } catch (...) {
      deferred_split_error_ = std::current_exception();
      return;
    }
  } else {
    check_submit_arguments(first, grads, count);
  }
  for (size_t j = 0; j < count; ++j) {
    submitted_[first + j] = grads[j];
    submitted_flags_[first + j] = 1;
    hold_gradient_bytes(static_cast<int64_t>(params_[first + j].numel * zf_dtype_size(grads[j].dtype)));
  }
  if (parallel()) {  // its buckets are reduced as they fill
    for (size_t j = 0; j < count; ++j) {
      const Param& p = params_[first + j];
      if (p.matrix) --bucket_pending_[matrices_[p.index].bucket];
    }
    return reduce_ready_buckets();
  }
  if (!early_ || count == 0) return;
  // The range's statistics now; its flag goes to the slot of its first parameter.
  backend_->column_stats(range_stats_plan(first, count), grads, &col_sq_tensors_[first],
                         device_float(total_sink_offset_), device_int(flags_offset_) + first,
                         arena_.base() + stats_workspace_offset_, stats_workspace_bytes_);
  for (size_t j = 0; j < count; ++j) {
    const Param& p = params_[first + j];
    if (!p.matrix) continue;
    const size_t b = matrices_[p.index].bucket;
    if (--bucket_pending_[b] == 0 && early_buckets_.size() < ring_.host_slots()) {
      defer_bucket_early(buckets_[b]);
      release_bucket(buckets_[b]);
    }
  }
}

void Engine::end_step() {
  if (!parallel()) {
    check_end_step_arguments();
    const StepInputs inputs = close_split_step();
    return run_step(inputs.grads, inputs.lrs, inputs.stats_done);
  }
  // Data parallel: a rank with no split step open never agreed to one; its agreement meets
  // the others' (begin_step's, or this call's on a rank that made the same mistake).
  if (!in_split_step_) {
    agree(Agreement::kStep, [&] { check_end_step_arguments(); });
    return;  // not reached: the check refuses
  }
  std::exception_ptr local = deferred_split_error_;
  if (!local) {
    try {
      check_end_step_arguments();
      poll_host_lane();
    } catch (...) {
      local = std::current_exception();
    }
  }
  if (local) end_split_step_refused(local);
  try {
    reduce_remaining_buckets(false);
  } catch (...) {
    drop_split_step();
    throw;
  }
  const StepInputs inputs = close_split_step();
  run_step(inputs.grads, inputs.lrs, inputs.stats_done);
}

void Engine::end_split_step_refused(const std::exception_ptr& local) {
  // The same collectives as a rank that goes on (the buckets not reduced yet, the dense
  // gradients, the column sums, the flags), with zeros, then this rank's slot in the folded
  // agreement: every rank raises, nothing of the step is applied anywhere.
  const ParallelStepScope scope(*this);
  try {
    ensure_device_memory();
    reduce_remaining_buckets(true);
    reduce_dense(nullptr);
    backend_->fill_device_zero(arena_.base() + col_sq_offset_, matrix_col_floats_ * 4);
    backend_->fill_device_zero(arena_.base() + flags_offset_, (flag_count() + agreement_slots()) * 4);
    share_statistics(true, local);  // rethrows `local`, or a failed collective's error
  } catch (...) {
    drop_split_step();
    throw;
  }
  drop_split_step();
  std::rethrow_exception(local);  // not reached
}

void Engine::drop_split_step() {
  cancel_early_buckets();
  in_split_step_ = false;
  buckets_reduced_ = 0;
  deferred_split_error_ = nullptr;
  submitted_.clear();
  submitted_flags_.clear();
  split_lrs_.clear();
  split_has_lrs_ = false;
}

void Engine::check_end_step_arguments() const {
  require(in_split_step_, ZF_ERROR_INVALID_VALUE, "end_step: no split step is open (call begin_step)");
  for (size_t i = 0; i < params_.size(); ++i)
    require(submitted_flags_[i], ZF_ERROR_INVALID_VALUE, "end_step: parameter ", param_name(i),
            " was not submitted (the split step stays open)");
}

Engine::StepInputs Engine::close_split_step() {
  in_split_step_ = false;
  // Data parallel: the matrices' statistics were taken as their buckets were reduced.
  return StepInputs{submitted_.data(), split_has_lrs_ ? split_lrs_.data() : nullptr, early_ || parallel()};
}

void Engine::abort_step() {
  // Work started at submit is the statistics (overwritten by the next step) and the early
  // buckets' copies, whose accumulates were never queued: nothing of the step remains. Data
  // parallel: the other ranks are in this step's collectives; this rank joins them as
  // refused, so that they raise instead of waiting (its error is not this call's to report).
  if (parallel() && in_split_step_) {
    try {
      end_split_step_refused(std::make_exception_ptr(
          Error(ZF_ERROR_INVALID_VALUE, "abort_step: the split step was discarded on this rank")));
    } catch (...) {
    }
    return;
  }
  drop_split_step();
}

void Engine::late_gradient(size_t index, const zf_tensor& grad) {
  if (!parallel() || !in_split_step_ || deferred_split_error_ || index >= params_.size()) return;
  const Param& p = params_[index];
  if (p.matrix && bucket_reduced_[matrices_[p.index].bucket]) {
    deferred_split_error_ = std::make_exception_ptr(
        Error(ZF_ERROR_INVALID_VALUE,
              "grads[" + std::to_string(param_name(index)) +
                  "]: its gradient grew after its bucket was reduced over the ranks (a parameter used in two "
                  "backward passes of one step, as reentrant activation checkpointing does with a shared one); "
                  "data parallel reduces each bucket once, as it fills: use non-reentrant checkpointing, or "
                  "step() without overlap_backward. The step was not taken on any rank"));
    return;
  }
  try {
    check_grad(grad, index);
    submitted_[index] = grad;  // read when its bucket is reduced (dense ones: at end_step)
  } catch (...) {
    deferred_split_error_ = std::current_exception();
  }
}

void Engine::reduce_ready_buckets() {
  // In the fixed order every rank follows, so the ranks' collectives match whatever order
  // their gradients arrive in; a bucket that fills out of order waits for those before it.
  // A failure here (a collective) waits for end_step, as a refusal of submit does.
  const ParallelStepScope scope(*this);
  try {
    while (buckets_reduced_ < buckets_.size()) {
      Bucket& b = bucket_in_reduce_order(buckets_reduced_);
      if (bucket_pending_[static_cast<size_t>(&b - buckets_.data())] != 0) return;
      reduce_bucket_in_backward(b, false);
      ++buckets_reduced_;
    }
  } catch (...) {
    deferred_split_error_ = std::current_exception();
  }
}

void Engine::reduce_remaining_buckets(bool zeros) {
  const ParallelStepScope scope(*this);
  while (buckets_reduced_ < buckets_.size()) {
    reduce_bucket_in_backward(bucket_in_reduce_order(buckets_reduced_), zeros);
    ++buckets_reduced_;
  }
  // Everything after (the dense reduction, the statistics' exchange, the step) runs on the
  // compute lane, after the reductions.
  if (!buckets_.empty()) backend_->wait(Lane::kCompute, backend_->record(Lane::kReduce));
}

void Engine::reduce_bucket_in_backward(Bucket& b, bool zeros) {
  // On the reduction lane, after everything enqueued on the compute lane so far (the
  // bucket's gradients, and the last users of the scratch and the staging slots), so that the
  // backward goes on beside it on the caller's stream.
  const Event written = backend_->record(Lane::kCompute);
  struct OnReduceLane {
    explicit OnReduceLane(Backend& backend) : backend_(backend) { backend_.compute_on(Lane::kReduce); }
    ~OnReduceLane() { backend_.compute_on(Lane::kCompute); }
    Backend& backend_;
  } on_reduce_lane(*backend_);
  backend_->wait(Lane::kReduce, written);
  bucket_reduced_[static_cast<size_t>(&b - buckets_.data())] = 1;
  if (zeros) return reduce_bucket(b, nullptr, split_select_);
  reduce_bucket(b, submitted_.data(), split_select_);
  bucket_statistics(b, submitted_.data());
  if (!split_select_ && early_buckets_.size() < ring_.host_slots()) {
    defer_bucket_early(b);
    release_bucket(b);
  }
}

void Engine::bucket_statistics(const Bucket& b, const zf_tensor* grads) {
  for (size_t i = b.first; i < b.last; ++i) {
    const size_t param = matrices_[i].param;
    backend_->column_stats(range_stats_plan(param, 1), grads + param, &col_sq_tensors_[param],
                           device_float(total_sink_offset_), device_int(flags_offset_) + param,
                           arena_.base() + stats_workspace_offset_, stats_workspace_bytes_);
  }
}

void Engine::dense_statistics(const zf_tensor* grads) {
  // Runs of consecutive dense parameters, one pass each (its flag at its first parameter).
  for (size_t i = 0; i < params_.size();) {
    if (params_[i].matrix) {
      ++i;
      continue;
    }
    size_t stop = i;
    while (stop < params_.size() && !params_[stop].matrix) ++stop;
    backend_->column_stats(range_stats_plan(i, stop - i), grads + i, &col_sq_tensors_[i],
                           device_float(total_sink_offset_), device_int(flags_offset_) + i,
                           arena_.base() + stats_workspace_offset_, stats_workspace_bytes_);
    i = stop;
  }
}

StagingRing::Slot Engine::pack_into_next_slot(Bucket& b, const zf_tensor* grads) {
  std::shared_ptr<WorkJob> busy;
  const StagingRing::Slot slot = ring_.next(&busy);
  if (busy) wait_job(busy, &stall_back_pressure_);  // back-pressure: the host still held this slot
  bind_gradients(b, grads);
  if (!backend_->host_visible())                                // else the host lane reads the device slot in place
    backend_->wait(Lane::kCompute, ring_.copied(slot.device));  // its last copy down has read it
  backend_->pack(*b.pack, b.matrix_tensors.data(), b.selected_ptrs.data(),
                 ring_.device_slot(slot.device) + kSlotHeaderBytes);
  return slot;
}

void Engine::defer_bucket_early(Bucket& b) {
  if (b.packed_bytes == 0) return;
  if (closing_into_upload_) {
    pack_into_upload(b, submitted_.data());
  } else {
    const StagingRing::Slot slot = pack_into_next_slot(b, submitted_.data());
    if (!backend_->host_visible()) {  // the host backend's host lane reads the slot in place
      backend_->wait(Lane::kDown, backend_->record(Lane::kCompute));
      backend_->copy_down(ring_.host_slot(slot.host) + kSlotHeaderBytes,
                          ring_.device_slot(slot.device) + kSlotHeaderBytes, b.packed_bytes);
      ring_.set_copied(slot.device, backend_->record(Lane::kDown));
    }
    b.early_slot = slot.host;
    b.early_device_slot = slot.device;
  }
  const size_t index = static_cast<size_t>(&b - buckets_.data());
  bucket_early_[index] = 1;
  early_buckets_.push_back(index);
  add_saturating(bytes_down_, static_cast<int64_t>(b.packed_bytes));
}

void Engine::release_early_buckets(const StepScalars* scalars) {
  // The early slots' headers, from the step's scalars: one copy each on the compute lane into
  // its device slot (two early buckets that shared a device slot get the same header), then
  // down (the scalars themselves are the next step's to overwrite; a device slot is reused
  // only after its last copy down), then their accumulates, which wait for the headers'
  // event: it was recorded on the down lane after the bodies, so it covers both copies.
  if (early_buckets_.empty()) return;
  if (closing_into_upload_) {  // packed into U: the fused update reads them, after one header
    early_buckets_.clear();
    return;
  }
  for (size_t index : early_buckets_)
    backend_->copy_device(ring_.device_slot(buckets_[index].early_device_slot), &scalars->grad_scale,
                          sizeof(SlotHeader));
  Event copied;
  if (!backend_->host_visible()) {
    backend_->wait(Lane::kDown, backend_->record(Lane::kCompute));
    for (size_t index : early_buckets_)
      backend_->copy_down(ring_.host_slot(buckets_[index].early_slot),
                          ring_.device_slot(buckets_[index].early_device_slot), sizeof(SlotHeader));
    copied = backend_->record(Lane::kDown);
    for (size_t index : early_buckets_) ring_.set_copied(buckets_[index].early_device_slot, copied);
  }
  for (size_t index : early_buckets_) {
    Bucket& b = buckets_[index];
    ring_.set_job(b.early_slot, submit_slot_accumulate(b, b.early_slot, copied));
  }
  early_buckets_.clear();
}

void Engine::cancel_early_buckets() {
  early_ = false;
  closing_into_upload_ = false;  // what a failed step left in U is never read
  early_buckets_.clear();
  bucket_early_.assign(buckets_.size(), 0);
  // The step is over (taken, refused or dropped): nothing of its gradients is held.
  bucket_released_.clear();
  releases_pending_.clear();
  held_gradient_bytes_ = 0;
}

void Engine::hold_gradient_bytes(int64_t bytes) {
  held_gradient_bytes_ += bytes;
  held_gradient_bytes_peak_ = std::max(held_gradient_bytes_peak_, held_gradient_bytes_);
}

void Engine::release_bucket(Bucket& b) {
  // Only a bucket whose deferred columns are packed already (or that has none), in a step
  // that is not a selection step (the selection, hence which columns are selected, is made
  // at end_step), and with every matrix's k columns selected (the compact layout's).
  const size_t index = static_cast<size_t>(&b - buckets_.data());
  if (!releasing() || split_select_ || bucket_released_.size() != buckets_.size() || bucket_released_[index]) return;
  if (b.packed_bytes > 0 && !bucket_early_[index]) return;
  for (size_t i = b.first; i < b.last; ++i)
    if (static_cast<int64_t>(matrices_[i].selected.size()) != matrices_[i].k) return;
  if (b.selected_elements > 0) {
    bind_gradients(b, submitted_.data());
    backend_->pack(*b.selected_pack, b.matrix_tensors.data(), b.deferred_ptrs.data(),
                   arena_.base() + b.compact_grad_offset);
  }
  bucket_released_[index] = 1;
  // One engine read the gradients on the compute lane (the caller's stream): reported at
  // once, as memory freed to a stream-ordered allocator on that stream is reused only after
  // the reads enqueued before (on CUDA, a wait for completion here would report nothing
  // until the device caught up with backward). Data parallel read them on the reduction
  // lane: reported once its event completes.
  const Event read = parallel() ? backend_->record(Lane::kCompute) : nullptr;
  releases_pending_.push_back(Release{index, read});
  hold_gradient_bytes(-static_cast<int64_t>(b.gradient_bytes));
}

bool Engine::gradient_released(size_t index) const {
  if (bucket_released_.empty() || index >= params_.size() || !params_[index].matrix) return false;
  return bucket_released_[matrices_[params_[index].index].bucket] != 0;
}

void Engine::take_released(std::vector<size_t>* out) {
  // Events of one lane complete in order: the first one not done ends the report.
  size_t reported = 0;
  for (; reported < releases_pending_.size(); ++reported) {
    const Release& r = releases_pending_[reported];
    if (!backend_->done(r.read)) break;
    const Bucket& b = buckets_[r.bucket];
    for (size_t i = b.first; i < b.last; ++i) out->push_back(param_name(matrices_[i].param));
  }
  releases_pending_.erase(releases_pending_.begin(), releases_pending_.begin() + static_cast<ptrdiff_t>(reported));
}

std::shared_ptr<WorkJob> Engine::submit_slot_accumulate(Bucket& b, size_t slot, const Event& copied) {
  uint8_t* host_slot = ring_.host_slot(slot);
  const int acc = window_.filling();
  Backend* backend = backend_.get();
  const int64_t pass_elements = host_deferred_elements_;
  // The lane, not lane_: the engine's destructor nulls lane_ before the lane lets its
  // running chunk finish.
  HostLane* lane = lane_.get();
  return lane_->submit_accumulate([this, &b, host_slot, acc, backend, lane, copied, pass_elements](ThreadPool& pool) {
    lane->wait([&] { backend->host_wait(copied); });
    SlotHeader h;
    std::memcpy(&h, host_slot, sizeof(h));
    if (h.skip) return;
    // A window's first accumulate of a matrix writes its accumulator (as adding into zeros
    // would) without reading it: the update before left it unzeroed.
    const size_t count = b.last - b.first;
    b.overwrite.resize(count);
    int64_t read = 0, written = 0;
    const size_t element = zf_dtype_size(b.dtype);
    for (size_t i = 0; i < count; ++i) {
      Matrix& m = matrices_[b.first + i];
      b.overwrite[i] = m.acc_fresh[acc];
      const int64_t deferred = m.rows * m.own_deferred();
      if (deferred == 0) continue;
      m.acc_fresh[acc] = 0;
      read += deferred * static_cast<int64_t>(element) + (b.overwrite[i] ? 0 : 4 * deferred);
      written += 4 * deferred;
    }
    b.accumulate.run(pool, b.acc_tensors[acc].data(), host_slot + kSlotHeaderBytes, h.grad_scale, b.overwrite.data(),
                     pass_elements);
    host_bytes_read_.fetch_add(read, std::memory_order_relaxed);
    host_bytes_written_.fetch_add(written, std::memory_order_relaxed);
  });
}

size_t Engine::find_nonfinite(const zf_tensor* grads) const {
  // Rare path (host backend): one statistics pass per parameter to name the first
  // non-finite one. A released gradient is not read again: its statistics pass's flag names
  // it (the flag of the range it was submitted with, at the range's first parameter).
  for (size_t i = 0; i < params_.size(); ++i) {
    if (gradient_released(i)) {
      if (device_int(flags_offset_)[i] != 0) return i;
      continue;
    }
    ColumnStatsPlan plan({ColumnStatsMatrix{params_[i].rows, params_[i].cols, params_[i].tensor.dtype}});
    std::vector<float> col_sq(static_cast<size_t>(params_[i].cols));
    float* col = col_sq.data();
    const void* grad = grads[i].data;
    float total = 0.0f;
    int32_t nonfinite = 0;
    plan.run(backend_->host_pool(), &grad, &col, &total, &nonfinite, false);
    if (nonfinite) return i;
  }
  return 0;
}

bool Engine::read_scalars_now() const {
  // The host backend reads them for free. On CUDA the training thread waits for them only
  // when the next host decision needs them: dynamic loss scaling (the scale of the next
  // step, and whether this one is skipped).
  return backend_->host_visible() || config_.loss_scaling == ZF_LOSS_SCALING_DYNAMIC;
}

StepScalars Engine::readback_scalars(double* stall) {
  return scalar_readback_.read_now(*backend_, reinterpret_cast<const StepScalars*>(arena_.base() + scalars_offset_),
                                   stall);
}

void Engine::record_scalars_for_later() {
  // CUDA without loss scaling: the step goes on without its scalars; a later call looks at
  // them (scalar_readback.hpp).
  scalar_readback_.record(
      *backend_, reinterpret_cast<const StepScalars*>(arena_.base() + scalars_offset_),
      arena_.base() + scalar_ring_offset_, schedule_.step() + 1,
      [this](const StepScalars& s, int64_t step) { on_recorded_scalars(s, step); }, &stall_readback_);
}

void Engine::check_recorded_scalars(bool wait) {
  scalar_readback_.consume_ready(
      *backend_, wait, [this](const StepScalars& s, int64_t step) { on_recorded_scalars(s, step); }, &stall_readback_);
}

void Engine::on_recorded_scalars(const StepScalars& s, int64_t step) {
  if (s.nonfinite) {
    scalar_readback_.clear();
    fail_sticky(ZF_ERROR_INVALID_VALUE,
                "grads: a non-finite gradient (Inf or NaN) at step " + std::to_string(step) +
                    ", found after the step on the device: the step wrote nothing, but the engine's schedule "
                    "moved on, so the engine refuses steps until it loads a state");
  }
  last_norm_ = std::sqrt(static_cast<double>(s.total_sq)) / gradient_divisor();
}

const float* Engine::col_sq_on_host(double* stall) {
  const float* device = device_float(col_sq_offset_);
  if (backend_->host_visible()) return device;
  const auto start = Clock::now();
  download(col_sq_host_.data(), device, col_sq_floats_ * 4);
  if (stall != nullptr) *stall += seconds_since(start);
  return col_sq_host_.data();
}

void Engine::run_step(const zf_tensor* grads, const double* lrs, bool stats_done) {
  // Data parallel: a host-lane failure found mid-step is raised at the next agreement, where
  // every rank learns of it.
  const ParallelStepScope scope(*this);
  run_guarded([&] {
    step_statistics(grads, stats_done);
    int64_t due = 0, counted = 0;
    if (step_update(grads, lrs, &due, &counted)) {
      step_close(due, counted);
      if (start_decision_due()) {
        double sums[2];
        start_signal_sums(sums);
        decide_start(sums);
      }
    }
  });
  cancel_early_buckets();  // released by the step; this only clears the bookkeeping
}

template <class Visit>
void Engine::for_each_host_column(Visit&& visit) {
  // Matrix by matrix, deferred column by deferred column: a fixed order, so sums and rewrites
  // do not depend on the thread count. Columns that never stepped have no moments to read.
  const double beta1 = hparams_.beta1, beta2 = hparams_.beta2;
  for (Matrix& m : matrices_) {
    if (m.exp_avg.empty()) continue;
    for (int64_t j = 0; j < m.own_deferred(); ++j) {
      const int32_t steps = m.steps[static_cast<size_t>(j)];
      if (steps <= 0) continue;
      const double bc1 = 1.0 - adam_beta_power(beta1, steps), bc2 = 1.0 - adam_beta_power(beta2, steps);
      visit(m.exp_avg.data() + j * m.rows, m.exp_avg_sq.data() + j * m.rows, m.rows, bc1, bc2);
    }
  }
}

void Engine::start_signal_sums(double* sums) {
  // After a warm-up step's synchronous close the host lane is idle and every column's moments
  // are on the host (nothing is selected during warm-up).
  double m_hat_sq = 0.0, v_hat = 0.0;
  for_each_host_column([&](const float* avg, const float* avg_sq, int64_t rows, double bc1, double bc2) {
    double column_m = 0.0, column_v = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      column_m += static_cast<double>(avg[r]) * static_cast<double>(avg[r]);
      column_v += static_cast<double>(avg_sq[r]);
    }
    m_hat_sq += column_m / (bc1 * bc1);
    v_hat += column_v / bc2;
  });
  sums[0] = m_hat_sq;
  sums[1] = v_hat;
  if (parallel() && !matrices_.empty()) {
    // Every rank holds its columns' moments: the sums go through the collectives as float32
    // (the decision needs a few digits; every rank receives the same bits).
    float shared[2] = {static_cast<float>(m_hat_sq), static_cast<float>(v_hat)};
    uint8_t* at = arena_.base() + exchange_offset_;
    upload(at, shared, sizeof(shared));
    all_reduce(at, 2, ZF_DTYPE_F32, &collective_stats_bytes_);
    download(shared, at, sizeof(shared));
    sums[0] = shared[0];
    sums[1] = shared[1];
  }
}

void Engine::moments_to_windows() {
  const int64_t span = config_.update_interval;
  if (config_.window_scaling == ZF_WINDOW_SCALING_NONE || span <= 1) return;
  // v_hat <- m_hat^2 + max(0, v_hat - m_hat^2) / S per element, on the columns the host
  // holds: the deferred ones (this runs after the window's selection; the selected columns'
  // moments went to the device as they were).
  const double inverse_span = 1.0 / static_cast<double>(span);
  for_each_host_column([&](const float* avg, float* avg_sq, int64_t rows, double bc1, double bc2) {
    for (int64_t r = 0; r < rows; ++r) {
      const double m_hat = static_cast<double>(avg[r]) / bc1;
      const double signal = m_hat * m_hat;
      const double noise = std::max(0.0, static_cast<double>(avg_sq[r]) / bc2 - signal);
      avg_sq[r] = static_cast<float>((signal + noise * inverse_span) * bc2);
    }
  });
}

void Engine::decide_start(const double* sums) {
  schedule_.decide_start(start_signal_share(sums[0], sums[1], schedule_.step(), hparams_.beta1) >=
                         Schedule::kFromScratchShare);
}

void Engine::run_guarded(const std::function<void()>& phase) {
  try {
    phase();
  } catch (const std::bad_alloc&) {
    cancel_early_buckets();
    throw;
  } catch (const Error& e) {
    cancel_early_buckets();  // a failed step: its early copies are never accumulated
    // A device that failed mid-step leaves the step half done: refuse further steps.
    if (e.status() == ZF_ERROR_CUDA && !sticky_) {
      sticky_ = true;
      sticky_status_ = e.status();
      sticky_message_ =
          std::string("engine device failure (the engine refuses steps until it loads a state): ") + e.what();
    }
    throw;
  }
}

void Engine::step_statistics(const zf_tensor* grads, bool stats_done) {
  // The end of a data-parallel split step (its statistics taken at submit) raises a failure
  // of this rank's (a host-lane job found failed while its last buckets were reduced) at its
  // folded agreement, with the others, not here, where they would wait for it in the
  // statistics' all-reduce.
  const bool end_of_split_step = parallel() && stats_done;
  if (!end_of_split_step) check_usable();
  initialize_state();
  // 1. statistics of every gradient (a split step has them from its submits): column sums of
  // squares and a non-finite flag per pass.
  // Data parallel: the gradients are reduced first (every column at a selection step), and
  // the statistics are of the reduced gradient, shared by every rank.
  // A split step reduced its buckets and took their statistics during backward.
  if (end_of_split_step) {
    reduce_dense(grads);
    dense_statistics(grads);
  } else if (parallel()) {
    reduce_gradients(grads, next_step_selects());
  }
  if (!stats_done) {
    backend_->fill_device_zero(arena_.base() + flags_offset_, flag_count() * 4);
    backend_->column_stats(*stats_plan_, grads, col_sq_tensors_.data(), device_float(total_sink_offset_),
                           device_int(flags_offset_), arena_.base() + stats_workspace_offset_, stats_workspace_bytes_);
  }
  if (parallel()) share_statistics(end_of_split_step, nullptr);
  // One engine of a group over several devices: its partial, which the group exchanges.
  if (part_.count > 1)
    backend_->scalar_partial(partial(part_.index), device_float(col_sq_offset_), static_cast<int64_t>(col_sq_floats_),
                             device_int(flags_offset_), static_cast<int64_t>(flag_count()),
                             reinterpret_cast<double*>(arena_.base() + chunk_sums_offset_));
}

void Engine::fail_nonfinite_gradient(size_t name) {
  fail(ZF_ERROR_INVALID_VALUE, "grads[", name,
       "]: non-finite gradient (Inf or NaN); the step was skipped and nothing was written");
}

bool Engine::step_update(const zf_tensor* grads, const double* lrs, int64_t* due, int64_t* counted) {
  // 2. the total, the gradient scale and the skip flag, on the device. The gradient is the
  // ranks' sum: the divisor is the loss scale times the world size.
  StepScalars* scalars = reinterpret_cast<StepScalars*>(arena_.base() + scalars_offset_);
  if (part_.count > 1) {
    backend_->combine_scalars(scalars, partial(0), static_cast<int64_t>(part_.count), gradient_divisor(),
                              config_.max_grad_norm);
  } else {
    backend_->step_scalars(scalars, device_float(col_sq_offset_), static_cast<int64_t>(col_sq_floats_),
                           device_int(flags_offset_), static_cast<int64_t>(flag_count()),
                           reinterpret_cast<double*>(arena_.base() + chunk_sums_offset_), gradient_divisor(),
                           config_.max_grad_norm);
  }
  // what the host needs of them
  if (read_scalars_now()) {
    const StepScalars s = readback_scalars(&stall_readback_);
    if (s.nonfinite) {
      if (config_.loss_scaling == ZF_LOSS_SCALING_DYNAMIC) {
        ++skipped_steps_;  // an overflow is part of the run; without loss scaling it is bad input
        growth_tracker_ = 0;
        // DeepSpeed's hysteresis: the first hysteresis - 1 overflows (since the scale last grew,
        // or in a row with consecutive_hysteresis) are skipped at the same scale; from the
        // hysteresis-th on, every overflow backs off until a refill.
        if (hysteresis_count_ + 1 < config_.hysteresis) {
          ++hysteresis_count_;
          return false;
        }
        // Kept within fp32's normal range, as torch keeps its fp32 scale: the gradient scale,
        // an fp32, is its inverse (a run that overflowed a few hundred steps in a row would
        // otherwise reach an infinite gradient scale, and then 0 * inf). min_loss_scale is
        // DeepSpeed's floor.
        const double floor = std::max(config_.min_loss_scale, double{std::numeric_limits<float>::min()});
        loss_scale_ = std::max(loss_scale_ * config_.backoff_factor, floor);
        return false;
      }
      if (parallel())
        fail(ZF_ERROR_INVALID_VALUE,
             "grads: a non-finite gradient (Inf or NaN) after the reduction over the ranks; the step was skipped "
             "and nothing was written but the gradients (reduced in place)");
      fail_nonfinite_gradient(param_name(find_nonfinite(grads)));
    }
    last_norm_ = std::sqrt(static_cast<double>(s.total_sq)) / gradient_divisor();
  } else {
    record_scalars_for_later();
  }
  if (config_.loss_scaling == ZF_LOSS_SCALING_DYNAMIC && config_.consecutive_hysteresis != 0)
    hysteresis_count_ = 0;  // a good step refills the hysteresis
  if (config_.loss_scaling == ZF_LOSS_SCALING_DYNAMIC && ++growth_tracker_ >= config_.growth_interval) {
    // Takes effect from the next step, as GradScaler.update(), which also keeps the old scale
    // when the grown one is not a finite fp32 (a run whose gradients never overflow: zeros).
    const double grown = loss_scale_ * config_.growth_factor;
    if (grown <= double{std::numeric_limits<float>::max()}) loss_scale_ = grown;
    growth_tracker_ = 0;
    hysteresis_count_ = 0;  // growth refills the hysteresis (DeepSpeed's rule)
  }
  step_lrs_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) step_lrs_[g] = lrs ? lrs[g] : groups_[g].lr;

  step_kind_ = schedule_.begin_step();
  ++step_count_bound_;  // checked below INT32_MAX before the step (check_counters_have_room)
  // 3. selection (after a flush), the lossless exchange (never in a step that started early)
  if (step_kind_.select) select_columns();
  // The first window after steps that updated every column (a synchronous start, or a
  // loaded state of plain AdamW's steps): the deferred columns' second moments go over to
  // windows' (docs/design.md section 3).
  if (step_kind_.window_start && schedule_.window() == 1 && schedule_.step() > 1) moments_to_windows();

  // 4. AdamW of the selected columns and the dense parameters
  device_pointers_.resize(device_plan_params_.size());
  for (size_t e = 0; e < device_plan_params_.size(); ++e) {
    const Param& p = params_[device_plan_params_[e]];
    AdamwSelectedPointers& ptr = device_pointers_[e];
    ptr.param = p.tensor.data;
    ptr.grad = grads[device_plan_params_[e]].data;
    ptr.grad_compact = false;
    ptr.lr = step_lrs_[static_cast<size_t>(p.group)];
    ptr.weight_decay = groups_[static_cast<size_t>(p.group)].weight_decay;
    if (p.matrix) {
      Matrix& m = matrices_[p.index];
      if (gradient_released(device_plan_params_[e])) {  // the compact copy of its selected columns
        ptr.grad = arena_.base() + m.dev_compact_grad;
        ptr.grad_compact = true;
      }
      ptr.selected = device_int(m.dev_selected);
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
  if (!device_pointers_.empty()) {
    device_plan_->set_hparams(hparams_);  // this step's betas and eps
    backend_->adamw_selected(*device_plan_, device_pointers_.data(), scalars);
  }
  // 5. deferred columns through the staging ring into the host accumulator: the buckets
  // packed at submit get their headers, then the others go
  release_early_buckets(scalars);
  for (Bucket& b : buckets_) {
    if (bucket_early_.empty() || !bucket_early_[static_cast<size_t>(&b - buckets_.data())]) defer_bucket(b, grads);
  }
  if (closing_into_upload_) write_closing_header(scalars);
  if (!buckets_.empty()) {
    window_.add_step(step_lrs_, groups_, hparams_);  // its host update runs with its last step's values
  }
  // 6. window bookkeeping (a group sums every device's counts before the close)
  window_bookkeeping(step_kind_.warm_up, due, counted);
  return true;
}

void Engine::step_close(int64_t due, int64_t counted) {
  const bool closes = schedule_.end_step(due, counted);
  // The closing step's pack into U was decided from the schedule before the step; a window
  // that stayed open would lose that step's gradient.
  require(closes || !closing_into_upload_, ZF_ERROR_INTERNAL,
          "step: the schedule kept open a window whose closing step was packed into the upload buffer");
  if (closes) {
    close_window(step_kind_.warm_up);
  } else if (config_.overlap_step && !step_kind_.warm_up && schedule_.update_lands()) {
    finish_update(&stall_close_);  // the previous window's result goes up update_lag steps in
  }
}

void Engine::window_bookkeeping(bool warm_up, int64_t* due, int64_t* counted) {
  if (warm_up) return;
  const bool window_scores = config_.selection_score == ZF_SCORE_WINDOW;
  const bool auto_interval = schedule_.auto_interval();
  if (!window_scores && !auto_interval) return;
  const float* col_sq_all = col_sq_on_host(&stall_readback_);
  // Data parallel, the column sums are of the ranks' summed gradient: the window entries keep
  // those of the mean (as one engine would), so a checkpoint resumes on any world size.
  const float per_rank = 1.0f / static_cast<float>(world_ * world_);
  // The auto rule sums column norms (sqrt c): the norm of the mean gradient is the summed
  // gradient's over the world size.
  const double per_rank_norm = 1.0 / static_cast<double>(world_);
  for (Matrix& m : matrices_) {
    const size_t n = static_cast<size_t>(m.cols);
    const float* col_sq = col_sq_all + m.col_offset;
    if (window_scores) {
      float* current = m.window_score.data() + n;
      for (size_t j = 0; j < n; ++j) current[j] += col_sq[j] * per_rank;
    }
    if (!auto_interval) continue;
    const MatrixEnergy probe{0.0, 0.0, static_cast<int64_t>(m.selected.size()), m.cols};
    if (!Schedule::counted(probe)) continue;
    double selected_sum = 0.0, deferred_sum = 0.0;
    size_t s = 0;
    for (size_t j = 0; j < n; ++j) {
      const double norm = std::sqrt(static_cast<double>(col_sq[j]));
      if (s < m.selected.size() && static_cast<size_t>(m.selected[s]) == j) {
        selected_sum += norm;
        ++s;
      } else {
        deferred_sum += norm;
      }
    }
    m.energy[0] = static_cast<float>(m.energy[0] + selected_sum * per_rank_norm);
    m.energy[1] = static_cast<float>(m.energy[1] + deferred_sum * per_rank_norm);
    ++*counted;
    if (Schedule::matrix_due(MatrixEnergy{m.energy[0], m.energy[1], probe.k, probe.n}, schedule_.window_steps()))
      ++*due;
  }
}

void Engine::defer_bucket(Bucket& b, const zf_tensor* grads) {
  if (b.packed_bytes == 0) return;
  if (closing_into_upload_) {
    pack_into_upload(b, grads);
  } else {
    const StagingRing::Slot slot = pack_into_next_slot(b, grads);
    uint8_t* at = ring_.device_slot(slot.device);
    const auto* scalars = reinterpret_cast<const StepScalars*>(arena_.base() + scalars_offset_);
    backend_->copy_device(at, &scalars->grad_scale, sizeof(SlotHeader));
    Event copied;
    if (!backend_->host_visible()) {  // the host backend's host lane reads the slot in place
      backend_->wait(Lane::kDown, backend_->record(Lane::kCompute));
      backend_->copy_down(ring_.host_slot(slot.host), at, kSlotHeaderBytes + b.packed_bytes);
      copied = backend_->record(Lane::kDown);
      ring_.set_copied(slot.device, copied);
    }
    ring_.set_job(slot.host, submit_slot_accumulate(b, slot.host, copied));
  }
  add_saturating(bytes_down_, static_cast<int64_t>(b.packed_bytes));
}

int Engine::upload_copies_needed() const {
  // One upload copy serves every closing step when the last result has always landed by
  // then: overlap off (a result lands in its own close), or fixed windows of S >= 2 whose
  // result lands 1 <= L < S steps into the next. Otherwise (overlapped windows of one step,
  // a landing at the next close, adaptive windows) a closing step can find the last result
  // still owed in its copy: a second copy takes the closing step and the next result.
  if (config_.overlap_step == 0) return 1;
  const int64_t interval = config_.update_interval, lag = config_.update_lag;
  return interval >= 2 && lag >= 1 && lag < interval ? 1 : 2;
}

bool Engine::closing_step_into_upload() const {
  // An upload copy is free from the landing of its result until the next update writes it:
  // the closing step takes the copy the next result goes to (next_upload_copy). Either way
  // the update computes the same bits: only the host lane's passes differ.
  return fuse_window_close_ && !buckets_.empty() && (!window_.pending() || upload_copies_ == 2) &&
         schedule_.next_step_closes();
}

void Engine::pack_into_upload(Bucket& b, const zf_tensor* grads) {
  // The window's closing step: the bucket's deferred columns go where its window's result is
  // written, in U's layout (the staging slot's), and the window update reads each element
  // there before writing its result over it: no accumulate reads the slot and writes A, and
  // the update does not read A back for this step (issue 29's floor).
  bind_gradients(b, grads);
  const int buffer = next_upload_copy();
  uint8_t* in_upload = upload_copy(buffer) + b.upload_offset;
  if (backend_->host_visible()) {  // the host backend's "device" memory is the host's
    backend_->pack(*b.pack, b.matrix_tensors.data(), b.selected_ptrs.data(), in_upload);
    return;
  }
  const size_t device = ring_.next_device();
  backend_->wait(Lane::kCompute, ring_.copied(device));  // its last copy down has read it
  uint8_t* at = ring_.device_slot(device) + kSlotHeaderBytes;
  backend_->pack(*b.pack, b.matrix_tensors.data(), b.selected_ptrs.data(), at);
  backend_->wait(Lane::kDown, backend_->record(Lane::kCompute));
  // The last result's copies up have read U (implied today: the compute lane waited for each
  // before its scatter, and the pack above follows those; explicit, so as not to rest on it).
  backend_->wait(Lane::kDown, window_.uploaded(buffer));
  backend_->copy_down(in_upload, at, b.packed_bytes);
  ring_.set_copied(device, backend_->record(Lane::kDown));
}

void Engine::write_closing_header(const StepScalars* scalars) {
  // One header for every bucket of the step (they share its scalars), after every pack's copy
  // down on the down lane: its event covers them all.
  const int buffer = next_upload_copy();
  uint8_t* device_header = arena_.base() + closing_header_offset_ + static_cast<size_t>(buffer) * kSlotHeaderBytes;
  backend_->copy_device(device_header, &scalars->grad_scale, sizeof(SlotHeader));
  closing_copied_ = nullptr;
  if (backend_->host_visible()) return;
  backend_->wait(Lane::kDown, backend_->record(Lane::kCompute));
  backend_->copy_down(closing_header(buffer), device_header, sizeof(SlotHeader));
  closing_copied_ = backend_->record(Lane::kDown);
}

uint8_t* Engine::closing_header(int buffer) const {
  const size_t at = static_cast<size_t>(buffer) * kSlotHeaderBytes;
  return backend_->host_visible() ? arena_.base() + closing_header_offset_ + at
                                  : upload_.data() + closing_header_at_ + at;
}

void Engine::quiesce_host_lane() {
  // The accumulates of the last step's slots complete the open window's sums; the running
  // update completes the pending host result (its job is then done: the next close applies
  // it without waiting). Nothing is closed or applied, so the run goes on unchanged.
  double ignored = 0.0;
  wait_all_slots(&ignored);
  if (window_.job()) wait_job(window_.job(), &ignored);
  check_recorded_scalars(true);
}

void Engine::wait_all_slots(double* stall) {
  // Each job leaves the ring once waited for: a failure (raised here) leaves the rest in it.
  for (size_t slot = 0; slot < ring_.host_slots(); ++slot) {
    const std::shared_ptr<WorkJob> job = ring_.jobs()[slot];
    if (!job) continue;
    wait_job(job, stall);
    ring_.set_job(slot, nullptr);
  }
}

// ---- windows ----

void Engine::start_update(bool fused) {
  // The host AdamW of the deferred columns on A / steps_accumulated, one chunk per update
  // group (consecutive matrices of a bucket), writing the upload copy U. A is not zeroed: the
  // window's first accumulate overwrites it (acc_fresh), which saves a write per element
  // here and a read there. Fused, the closing step's packed gradient is in U: the update adds
  // it to A (or to zeros, in a window whose A holds nothing) as that step's accumulate would
  // have, in registers.
  std::vector<WorkQueue::Chunk> chunks;
  // Fused, this is the copy the closing step was packed into: nothing between the packs and
  // here writes a result (a selection's flush lands its own before them).
  const int buffer = next_upload_copy();
  const uint8_t* header = fused ? closing_header(buffer) : nullptr;
  const Event header_copied = closing_copied_;
  const int acc = window_.filling();
  const float scale = 1.0f / static_cast<float>(window_.steps());
  bool any_deferred = false;
  for (const Matrix& m : matrices_) any_deferred = any_deferred || m.selected.size() < static_cast<size_t>(m.cols);
  const zf_adam_hparams hparams = window_.hparams();
  Backend* backend = backend_.get();
  const Event uploaded = window_.uploaded(buffer);  // its last result is copied up until then
  const int64_t pass_elements = host_deferred_elements_;
  HostLane* lane = lane_.get();  // as in submit_slot_accumulate
  for (Bucket& b : buckets_) {
    const zf_dtype out_dtype = b.dtype;
    for (UpdateGroup& update : b.update_groups) {
      // Per matrix, its parameter group's values; the span is the window's, the same for all.
      std::vector<double> lrs, wds;
      int32_t span = 1;
      for (const size_t i : update.matrices) {
        const size_t group = static_cast<size_t>(params_[matrices_[i].param].group);
        const WindowStepValues step_values = window_step_values(
            config_.window_scaling, window_.steps(), window_.lr(group), window_.weight_decay(group), hparams.mode);
        lrs.push_back(step_values.lr);
        wds.push_back(step_values.weight_decay);
        span = step_values.span;
      }
      uint8_t* out = upload_copy(buffer) + update.upload_offset;
      chunks.push_back([this, &update, acc, scale, lrs = std::move(lrs), wds = std::move(wds), span, out, out_dtype,
                        hparams, backend, lane, uploaded, header, header_copied, pass_elements](ThreadPool& pool) {
        lane->wait([&] { backend->host_wait(uploaded); });
        AdamRunValues values{lrs.data(), wds.data(), hparams, scale, ZF_CPU_ADAMW_INCREMENT_STEPS};
        values.step_span = span;
        values.pass_elements = pass_elements;
        SlotHeader h{};
        if (header != nullptr) {
          lane->wait([&] { backend->host_wait(header_copied); });
          std::memcpy(&h, header, sizeof(h));
        }
        const bool fuse = header != nullptr && !h.skip;
        const size_t count = update.matrices.size();
        std::vector<const float*> accumulators(count);
        std::vector<zf_tensor> grads(count);
        // Per deferred element: A (or, fused, the packed gradient and A unless fresh),
        // master, m, v read and written back but A; the upload copy written in the weights'
        // dtype; per column its step count.
        int64_t read = 0, written = 0;
        const auto out_bytes = static_cast<int64_t>(zf_dtype_size(out_dtype));
        for (size_t g = 0; g < count; ++g) {
          Matrix& m = matrices_[update.matrices[g]];
          const int64_t columns = m.own_deferred();
          const int64_t deferred = m.rows * columns;
          accumulators[g] = m.acc_fresh[acc] ? nullptr : m.acc[acc].data();
          grads[g] = update.states[g].exp_avg;
          grads[g].data = m.acc[acc].data();
          const int64_t gradient_read =
              fuse ? deferred * out_bytes + (accumulators[g] != nullptr ? 4 * deferred : 0) : 4 * deferred;
          read += gradient_read + 4 * deferred * 3 + 4 * columns;
          written += 4 * deferred * 3 + deferred * out_bytes + 4 * columns;
        }
        if (fuse) {
          ColumnStepPointers pointers{update.states.data(), nullptr, out, out};
          pointers.fuse_accumulate = true;
          pointers.accumulators = accumulators.data();
          values.accumulate_scale = h.grad_scale;
          update.fused_update_plan.run(pool, pointers, values);
        } else {
          update.update_plan.run(pool, ColumnStepPointers{update.states.data(), grads.data(), nullptr, out}, values);
        }
        for (const size_t i : update.matrices) matrices_[i].acc_fresh[acc] = 1;
        host_bytes_read_.fetch_add(read, std::memory_order_relaxed);
        host_bytes_written_.fetch_add(written, std::memory_order_relaxed);
      });
    }
  }
  // Data parallel: a rank with no deferred column of its own still joins the all-gathers.
  const bool pending = parallel() ? any_deferred : !chunks.empty();
  window_.close(chunks.empty() ? nullptr : lane_->submit_update(std::move(chunks)), pending, buffer);
}

void Engine::finish_update(double* stall) {
  if (!window_.pending()) return;
  const std::shared_ptr<WorkJob> job = window_.take_for_upload();
  if (job) wait_job(job, stall);
  if (parallel()) {
    for (Bucket& b : buckets_) gather_upload(b);
    window_.set_uploaded(window_.result_buffer(), backend_->record(Lane::kUp));
    return;
  }
  // Upload U bucket by bucket: copy up (after the previous bucket's scatter has read the
  // upload buffer), then scatter into W[:, unselected] after the copy.
  // The host backend scatters straight from U (its "device" is the host).
  uint8_t* device_upload = arena_.base() + upload_buffer_offset_;
  for (Bucket& b : buckets_) {
    if (b.packed_bytes == 0) continue;
    const uint8_t* from = upload_copy(window_.result_buffer()) + b.upload_offset;
    if (!backend_->host_visible()) {
      if (last_scatter_) backend_->wait(Lane::kUp, last_scatter_);
      backend_->copy_up(device_upload, from, b.packed_bytes);
      backend_->wait(Lane::kCompute, backend_->record(Lane::kUp));
      from = device_upload;
    }
    bind_weights(b);
    backend_->scatter(*b.pack, b.matrix_tensors.data(), b.selected_ptrs.data(), from);
    last_scatter_ = backend_->record(Lane::kCompute);
    add_saturating(bytes_up_, static_cast<int64_t>(b.packed_bytes));
  }
  window_.set_uploaded(window_.result_buffer(), backend_->record(Lane::kUp));
}

void Engine::close_window(bool warm_up) {
  const bool had_steps = window_.steps() > 0;
  if (config_.overlap_step && !warm_up) {
    finish_update(&stall_close_);  // window w-1's result goes up now
    if (had_steps) start_update(closing_into_upload_);
  } else if (had_steps) {
    start_update(closing_into_upload_);
    finish_update(&stall_close_);
  }
  if (!warm_up && had_steps) add_saturating(windows_, 1);
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
  if (window_.steps() > 0) {
    start_update(false);
    if (!schedule_.warm_up(schedule_.step())) add_saturating(windows_, 1);
    finish_update(&ignored);
  }
  wait_all_slots(&ignored);
  check_recorded_scalars(true);
  stall_flush_ += seconds_since(start);
}

void Engine::flush() {
  agree(Agreement::kFlush, [&] {
    require(!in_split_step_, ZF_ERROR_INVALID_VALUE, "flush: a split step is open");
    poll_host_lane();
  });
  if (!initialized_) return;
  flush_on_every_rank();
}

void Engine::flush_on_every_rank() {
  // Data parallel, the flush's all-gathers run on every rank: a host-lane failure found in
  // it waits for the next agreement, as in a step.
  const ParallelStepScope scope(*this);
  flush_internal();
}

void Engine::bind_gradients(Bucket& b, const zf_tensor* grads) {
  for (size_t i = b.first; i < b.last; ++i) b.matrix_tensors[i - b.first] = grads[matrices_[i].param];
}

void Engine::bind_weights(Bucket& b) {
  for (size_t i = b.first; i < b.last; ++i) b.matrix_tensors[i - b.first] = params_[matrices_[i].param].tensor;
}

}  // namespace zf
