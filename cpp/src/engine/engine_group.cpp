// The engine over parameters on one or several devices (engine_group.hpp).
#include "engine/engine_group.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "engine/config_table.hpp"

namespace zf {
namespace {

// A gradient's bytes (readiness buckets count what the caller hands over).
size_t gradient_bytes(const zf_tensor& grad) {
  size_t n = zf_dtype_size(grad.dtype);
  for (int d = 0; d < grad.ndim && d < ZF_MAX_DIMS; ++d)
    n *= grad.shape[d] > 0 ? static_cast<size_t>(grad.shape[d]) : 0;
  return n;
}

// The part of each parameter, from its device: parts in increasing device index. Empty when
// every parameter is on one device (or there are none).
std::vector<size_t> parts_by_device(const zf_tensor* params, size_t param_count) {
  if (param_count == 0 || params == nullptr) return {};
  std::map<int32_t, size_t> cuda_devices;
  for (size_t i = 0; i < param_count; ++i) {
    const ArgName name("params", i);
    check_descriptor(&params[i], name);
    const zf_device& device = params[i].device;
    require(device.type == params[0].device.type, ZF_ERROR_INVALID_VALUE, name, ": on ", describe_device(device),
            " while params[0] is on ", describe_device(params[0].device),
            " (an engine's parameters are all CPU tensors or all CUDA tensors)");
    if (device.type == ZF_DEVICE_CUDA) cuda_devices.emplace(device.index, 0);
  }
  if (cuda_devices.size() <= 1) return {};
  size_t next = 0;
  for (auto& entry : cuda_devices) entry.second = next++;
  std::vector<size_t> parts(param_count);
  for (size_t i = 0; i < param_count; ++i) parts[i] = cuda_devices.at(params[i].device.index);
  return parts;
}

// Each part's entries of a caller's array: out[d][j] = all[indices[d][j]].
template <class T>
std::vector<std::vector<T>> gather_parts(const T* all, const std::vector<std::vector<size_t>>& indices) {
  std::vector<std::vector<T>> out(indices.size());
  for (size_t d = 0; d < indices.size(); ++d)
    for (size_t i : indices[d]) out[d].push_back(all[i]);
  return out;
}

zf_engine_stats add_stats(zf_engine_stats total, const zf_engine_stats& s) {
  // Counts of the schedule (steps, skips) and the norm are the same on every device (windows
  // and reselections on every device with matrices); time and memory add up (the training
  // thread waits on each device in turn).
  using S = zf_engine_stats;
  for (double S::*seconds :
       {&S::stall_seconds_window_close, &S::stall_seconds_back_pressure, &S::stall_seconds_flush,
        &S::stall_seconds_readback, &S::host_update_seconds, &S::accumulate_seconds, &S::host_lane_wait_seconds})
    total.*seconds += s.*seconds;
  for (int64_t S::*bytes :
       {&S::bytes_down, &S::bytes_up, &S::device_state_bytes, &S::host_state_bytes, &S::device_bytes,
        &S::pinned_host_bytes, &S::host_lane_bytes_read, &S::host_lane_bytes_written, &S::held_gradient_bytes_peak})
    total.*bytes += s.*bytes;
  return total;
}

}  // namespace

EngineGroup::EngineGroup(const zf_tensor* params, const int32_t* param_groups, size_t param_count,
                         const zf_engine_group* groups, size_t group_count, const zf_engine_config& config,
                         const std::vector<size_t>* parts_for_testing)
    : param_count_(param_count) {
  check_config_table(config);  // before the thread plan reads it
  for (size_t i = 0; params != nullptr && i < param_count; ++i) param_data_.push_back(params[i].data);
  std::vector<size_t> parts = parts_for_testing != nullptr ? *parts_for_testing : parts_by_device(params, param_count);
  if (parts.empty()) {
    engines_.push_back(std::make_unique<Engine>(params, param_groups, param_count, groups, group_count, config));
    return;
  }
  require(parts.size() == param_count && params != nullptr && param_groups != nullptr, ZF_ERROR_INVALID_VALUE,
          "params: one part per parameter");
  const size_t count = *std::max_element(parts.begin(), parts.end()) + 1;
  params_of_.assign(count, {});
  part_of_ = parts;
  local_of_.resize(param_count);
  for (size_t i = 0; i < param_count; ++i) {
    local_of_[i] = params_of_[parts[i]].size();
    params_of_[parts[i]].push_back(i);
  }
  // Each device's host lane gets its share of the automatic host threads: the devices'
  // host updates run at the same time. The compute lanes run one device after the other on
  // the training thread, so each keeps the whole count.
  zf_engine_config part_config = config;
  if (config.host_threads == 0) {
    int compute = 1, host = 1;
    automatic_thread_counts(config, &compute, &host);
    part_config.host_threads = std::max(1, host / static_cast<int>(count));
  }
  const std::vector<std::vector<zf_tensor>> part_params = gather_parts(params, params_of_);
  const std::vector<std::vector<int32_t>> part_groups = gather_parts(param_groups, params_of_);
  for (size_t d = 0; d < count; ++d) {
    require(!params_of_[d].empty(), ZF_ERROR_INVALID_VALUE, "params: part ", d, " has no parameter");
    EnginePart part;
    part.index = d;
    part.count = count;
    part.param_names = params_of_[d];
    engines_.push_back(std::make_unique<Engine>(part_params[d].data(), part_groups[d].data(), part_params[d].size(),
                                                groups, group_count, part_config, std::move(part)));
  }
  // The checkpoint's buffers: every parameter's entries in the caller's parameter order.
  buffers_of_.assign(count, {});
  std::vector<std::vector<zf_engine_state_entry>> layouts;
  for (const auto& e : engines_) layouts.push_back(e->state_layout());
  std::vector<size_t> cursor(count, 0);
  for (size_t i = 0; i < param_count; ++i) {
    const size_t d = part_of_[i];
    while (cursor[d] < layouts[d].size() && static_cast<size_t>(layouts[d][cursor[d]].param) == i) {
      buffers_of_[d].push_back(buffer_count_++);
      ++cursor[d];
    }
  }
  for (size_t d = 0; d < count; ++d) engines_[d]->set_buffer_names(buffers_of_[d]);
  partials_read_.assign(count, nullptr);
}

// ---- devices ----

const Engine& EngineGroup::at(size_t d) const {
  require(d < engines_.size(), ZF_ERROR_INVALID_VALUE, "device: ", d, " is not in [0, ", engines_.size(), ")");
  return *engines_[d];
}

Engine& EngineGroup::at(size_t d) { return const_cast<Engine&>(static_cast<const EngineGroup*>(this)->at(d)); }

zf_device EngineGroup::device(size_t d) const { return at(d).device(); }

size_t EngineGroup::device_memory_bytes(size_t d) const { return at(d).device_memory_bytes(); }

void EngineGroup::attach_device_memory(size_t d, void* memory, size_t bytes) {
  at(d).attach_device_memory(memory, bytes);
}

void EngineGroup::set_stream(size_t d, zf_stream stream) { at(d).set_stream(stream); }

void EngineGroup::inject_host_lane_fault_for_testing(const std::string& message) {
  for (auto& e : engines_) e->inject_host_lane_fault_for_testing(message);
}

Engine& EngineGroup::single(const char* call) {
  require(!several(), ZF_ERROR_INVALID_VALUE, call, ": the parameters are on ", engines_.size(),
          " devices; give each device its own (the *_at calls, with zf_engine_device_count)");
  return *engines_[0];
}

const Engine& EngineGroup::single(const char* call) const { return const_cast<EngineGroup*>(this)->single(call); }

void EngineGroup::set_collectives(const zf_engine_collectives* collectives) {
  require(!several() || collectives == nullptr || collectives->world_size == 1, ZF_ERROR_NOT_SUPPORTED,
          "collectives: data parallel with parameters on several devices in one process is not supported (run one "
          "process per device)");
  for (auto& e : engines_) e->set_collectives(collectives);
}

// ---- the step ----

void EngineGroup::check_usable() const {
  if (sticky_) throw Error(sticky_status_, sticky_message_);
}

void EngineGroup::refuse_capture(const char* call) const {
  for (const auto& e : engines_) e->refuse_capture(call);
}

void EngineGroup::step(const zf_tensor* grads, size_t count, const double* lrs, size_t lr_count) {
  refuse_capture("step");
  if (!several()) return engines_[0]->step(grads, count, lrs, lr_count);
  check_usable();
  require(count == param_count_, ZF_ERROR_INVALID_VALUE, "grads: ", count, " gradients for ", param_count_,
          " parameters");
  require(count == 0 || grads != nullptr, ZF_ERROR_INVALID_VALUE, "grads: NULL");
  // Every device's checks before any device does anything: bad input changes nothing.
  const std::vector<std::vector<zf_tensor>> parts = gather_parts(grads, params_of_);
  for (size_t d = 0; d < engines_.size(); ++d)
    engines_[d]->check_step_arguments(parts[d].data(), parts[d].size(), lrs, lr_count);
  std::vector<Engine::StepInputs> inputs;
  for (const auto& part : parts) inputs.push_back(Engine::StepInputs{part.data(), lrs, false});
  run_step(inputs);
}

void EngineGroup::begin_step(const double* lrs, size_t lr_count) {
  refuse_capture("begin_step");
  if (several()) {
    check_usable();
    for (size_t d = 0; d < engines_.size(); ++d) {
      try {
        engines_[d]->begin_step(lrs, lr_count);
      } catch (...) {
        for (size_t o = 0; o < d; ++o) engines_[o]->abort_step();
        throw;
      }
    }
  } else {
    engines_[0]->begin_step(lrs, lr_count);
  }
  ready_.reset(param_count_);
  ready_grads_.assign(param_count_, zf_tensor{});
  released_.clear();
  split_lrs_.assign(lrs, lrs + (lrs != nullptr ? lr_count : 0));
}

void EngineGroup::mark_ready(size_t index, const zf_tensor* grad) {
  refuse_capture("mark_ready");
  require(engines_[0]->in_split_step() && ready_.size() == param_count_, ZF_ERROR_INVALID_VALUE,
          "mark_ready: no split step is open (call begin_step)");
  require(index < param_count_, ZF_ERROR_INVALID_VALUE, "mark_ready: parameter ", index, " out of range (",
          param_count_, " parameters)");
  require(grad != nullptr, ZF_ERROR_INVALID_VALUE, "grad: NULL");
  // Data parallel reads a submitted gradient when its bucket is reduced: the engine takes a
  // later one, or refuses the step on every rank when its bucket was reduced already.
  if (engines_[0]->data_parallel() && ready_.is_submitted(index)) engines_[0]->late_gradient(index, *grad);
  ready_grads_[index] = *grad;
  // Releasing gradients, each is submitted at once, so that a bucket is consumed (and its
  // gradients released) as soon as its last matrix's gradient arrives.
  const size_t threshold = engines_[0]->config().release_gradients ? 0 : engines_[0]->config().bucket_bytes;
  const ReadyRuns::Range run = ready_.mark(index, gradient_bytes(*grad), threshold);
  if (run.empty()) return;
  submit(run.first, ready_grads_.data() + run.first, run.stop - run.first);
}

void EngineGroup::end_step_with(const zf_tensor* grads, size_t count) {
  refuse_capture("end_step");
  require(engines_[0]->in_split_step() && ready_.size() == param_count_, ZF_ERROR_INVALID_VALUE,
          "end_step: no split step is open (call begin_step)");
  require(count == param_count_, ZF_ERROR_INVALID_VALUE, "grads: ", count, " gradients for ", param_count_,
          " parameters");
  require(count == 0 || grads != nullptr, ZF_ERROR_INVALID_VALUE, "grads: NULL");
  if (ready_.arrived_after_submit() < param_count_ && !engines_[0]->data_parallel()) {
    if (std::any_of(engines_.begin(), engines_.end(), [](const auto& e) { return e->released_any(); })) {
      // Gradients of this step were released already: the step cannot be retaken from what
      // autograd accumulated. Refused whole; nothing of it was applied.
      const size_t index = ready_.arrived_after_submit();
      abort_step();
      fail(ZF_ERROR_INVALID_VALUE, "grads[", index,
           "]: its gradient arrived again after it was submitted (a parameter used in two backward passes of one "
           "step, as reentrant activation checkpointing does with a shared one); with release_gradients the "
           "engine has released what it read, so the step cannot be retaken from the accumulated gradient: use "
           "non-reentrant checkpointing, or release_gradients off. The step was not taken");
    }
    // A gradient grew after its run was submitted (a parameter used twice in backward:
    // shared weights, reentrant checkpointing). What was submitted is not the gradient
    // autograd accumulated: the step is taken again, whole, from the final gradients (a
    // split step equals the whole step bit for bit, so nothing of the first try shows).
    const std::vector<double> lrs = split_lrs_;
    abort_step();
    return step(grads, count, lrs.empty() ? nullptr : lrs.data(), lrs.size());
  }
  for (const ReadyRuns::Range& run : ready_.unsubmitted()) submit(run.first, grads + run.first, run.stop - run.first);
  end_step();
}

void EngineGroup::check_param_data(const void* const* data, size_t count) const {
  require(count == param_data_.size(), ZF_ERROR_INVALID_VALUE, "params: ", count, " data pointers for ",
          param_data_.size(), " parameters");
  require(count == 0 || data != nullptr, ZF_ERROR_INVALID_VALUE, "params: NULL");
  for (size_t i = 0; i < count; ++i)
    require(data[i] == param_data_[i], ZF_ERROR_INVALID_VALUE, "params[", i,
            "]: its memory moved since the engine was created (now at ", data[i], ", was at ", param_data_[i],
            "): the engine writes the weights where they were. Move or reload the model (to(), "
            "load_state_dict(assign=True), param.data = ...) before creating the optimizer, or create a new one");
}

void EngineGroup::submit(size_t first, const zf_tensor* grads, size_t count) {
  submit_to_devices(first, grads, count);
  if (ready_.size() == param_count_ && first <= param_count_ && count <= param_count_ - first)
    ready_.submitted(first, first + count);
}

void EngineGroup::submit_to_devices(size_t first, const zf_tensor* grads, size_t count) {
  refuse_capture("submit");
  if (!several()) return engines_[0]->submit(first, grads, count);
  require(engines_[0]->in_split_step(), ZF_ERROR_INVALID_VALUE, "submit: no split step is open (call begin_step)");
  require(first <= param_count_ && count <= param_count_ - first, ZF_ERROR_INVALID_VALUE, "submit: parameters [", first,
          ", ", first + count, ") out of range (", param_count_, " parameters)");
  require(count == 0 || grads != nullptr, ZF_ERROR_INVALID_VALUE, "grads: NULL");
  // A run of the caller's parameters is a run of each device's (its parameters keep the
  // caller's order): each device gets its part, after every part passed its checks.
  std::vector<size_t> local_first(engines_.size(), 0);
  std::vector<std::vector<zf_tensor>> parts(engines_.size());
  for (size_t j = 0; j < count; ++j) {
    const size_t d = part_of_[first + j];
    if (parts[d].empty()) local_first[d] = local_of_[first + j];
    parts[d].push_back(grads[j]);
  }
  for (size_t d = 0; d < engines_.size(); ++d)
    engines_[d]->check_submit_arguments(local_first[d], parts[d].data(), parts[d].size());
  for (size_t d = 0; d < engines_.size(); ++d) {
    if (!parts[d].empty()) engines_[d]->submit(local_first[d], parts[d].data(), parts[d].size());
  }
}

void EngineGroup::end_step() {
  refuse_capture("end_step");
  ready_.reset(0);
  released_.clear();
  if (!several()) return engines_[0]->end_step();
  check_usable();
  for (const auto& e : engines_) e->check_end_step_arguments();
  std::vector<Engine::StepInputs> inputs;
  for (const auto& e : engines_) inputs.push_back(e->close_split_step());
  run_step(inputs);
}

void EngineGroup::take_released(size_t* indices, size_t capacity, size_t* count) {
  // What did not fit last time first, then every device's new releases.
  for (auto& e : engines_) e->take_released(&released_);
  const size_t n = std::min(capacity, released_.size());
  std::copy(released_.begin(), released_.begin() + static_cast<ptrdiff_t>(n), indices);
  released_.erase(released_.begin(), released_.begin() + static_cast<ptrdiff_t>(n));
  *count = n;
}

void EngineGroup::abort_step() {
  for (auto& e : engines_) e->abort_step();
  ready_.reset(0);
  released_.clear();
  ready_grads_.clear();
  split_lrs_.clear();
}

void EngineGroup::run_step(const std::vector<Engine::StepInputs>& inputs) {
  const size_t count = engines_.size();
  auto finish_all = [&] {
    for (auto& e : engines_) e->finish_step();
  };
  // 1. Statistics and partials. Nothing is written but the statistics, which the next step
  // overwrites: a failure here leaves the group as it was.
  try {
    for (size_t d = 0; d < count; ++d) {
      Engine& e = *engines_[d];
      e.run_guarded([&] {
        // Its partial is rewritten only after every device has read the last one.
        for (size_t o = 0; o < count; ++o) {
          if (o != d) e.wait_compute(partials_read_[o]);
        }
        e.step_statistics(inputs[d].grads, inputs[d].stats_done);
      });
    }
  } catch (...) {
    finish_all();
    throw;
  }
  try {
    exchange_partials();
  } catch (const std::exception& error) {
    finish_all();
    fail_sticky_from(0, error);
  }
  // On the host backend the partials are read in place, so a non-finite gradient is named
  // (by the caller's index) before any device writes, as one engine does.
  if (engines_[0]->host_visible() && engines_[0]->config().loss_scaling != ZF_LOSS_SCALING_DYNAMIC) {
    for (size_t d = 0; d < count; ++d) {
      if (!engines_[d]->own_partial_nonfinite()) continue;
      finish_all();
      Engine::fail_nonfinite_gradient(engines_[d]->first_nonfinite(inputs[d].grads));
    }
  }
  size_t failing = 0;
  // 2. The update on every device, then 3. the close, with the window counts of all.
  try {
    int64_t due = 0, counted = 0;
    bool proceed = true;
    for (failing = 0; failing < count; ++failing) {
      Engine& e = *engines_[failing];
      int64_t device_due = 0, device_counted = 0;
      e.run_guarded(
          [&] { proceed = e.step_update(inputs[failing].grads, inputs[failing].lrs, &device_due, &device_counted); });
      due += device_due;
      counted += device_counted;
    }
    if (proceed) {
      for (failing = 0; failing < count; ++failing) {
        Engine& e = *engines_[failing];
        e.run_guarded([&] { e.step_close(due, counted); });
      }
      // The synchronous start's decision from every device's sums, added in device order.
      if (engines_[0]->start_decision_due()) {
        double sums[2] = {0.0, 0.0};
        for (failing = 0; failing < count; ++failing) {
          Engine& e = *engines_[failing];
          double device_sums[2];
          e.run_guarded([&] { e.start_signal_sums(device_sums); });
          sums[0] += device_sums[0];
          sums[1] += device_sums[1];
        }
        for (failing = 0; failing < count; ++failing) engines_[failing]->decide_start(sums);
      }
    }
  } catch (const std::exception& error) {
    finish_all();
    fail_sticky_from(failing, error);
  }
  finish_all();
}

void EngineGroup::exchange_partials() {
  // Every device copies every other device's partial into its own array (a 16-byte peer
  // copy on its compute lane after the owner's event), then combines the array in order.
  const size_t count = engines_.size();
  std::vector<Event> ready(count);
  for (size_t d = 0; d < count; ++d) ready[d] = engines_[d]->record_compute();
  for (size_t d = 0; d < count; ++d) {
    Engine& e = *engines_[d];
    e.run_guarded([&] {
      for (size_t o = 0; o < count; ++o) {
        if (o == d) continue;
        e.wait_compute(ready[o]);
        e.copy_partial_from(*engines_[o], o);
      }
      partials_read_[d] = e.record_compute();
    });
  }
}

void EngineGroup::fail_sticky_from(size_t d, const std::exception& error) {
  // A step that failed part way (a device error, a host-lane failure) has updated some
  // devices and not others: the group refuses steps until a state is loaded.
  const auto* status = dynamic_cast<const Error*>(&error);
  sticky_ = true;
  sticky_status_ = status != nullptr ? status->status() : ZF_ERROR_INTERNAL;
  sticky_message_ =
      "engine over " + std::to_string(engines_.size()) + " devices: the step failed on " +
      describe_device(engines_[std::min(d, engines_.size() - 1)]->device()) +
      " after other devices had begun it (the engine refuses steps until it loads a state): " + error.what();
  throw Error(sticky_status_, sticky_message_);
}

void EngineGroup::flush() {
  refuse_capture("flush");
  if (several()) check_usable();
  for (auto& e : engines_) e->flush();
}

void EngineGroup::set_hyperparameters(double beta1, double beta2, double eps, const double* weight_decays,
                                      size_t group_count) {
  for (const auto& e : engines_) e->check_hyperparameters(beta1, beta2, eps, weight_decays, group_count);
  for (auto& e : engines_) e->set_hyperparameters(beta1, beta2, eps, weight_decays, group_count);
}

void EngineGroup::refuse(zf_engine_call call) {
  require(call >= ZF_ENGINE_CALL_STEP && call <= ZF_ENGINE_CALL_LOAD, ZF_ERROR_INVALID_VALUE,
          "call: ", static_cast<int>(call), " is not a zf_engine_call");
  if (!several()) engines_[0]->refuse(call);
}

zf_engine_stats EngineGroup::stats() const {
  zf_engine_stats total = engines_[0]->stats();
  if (!several()) return total;
  int64_t selected = 0, columns = 0;
  for (size_t d = 0; d < engines_.size(); ++d) {
    if (d == 0) continue;
    const zf_engine_stats s = engines_[d]->stats();
    total = add_stats(total, s);
    // A device without matrices runs no host update, so it counts no windows.
    total.windows = std::max(total.windows, s.windows);
    total.reselections = std::max(total.reselections, s.reselections);
  }
  for (size_t d = 0; d < engines_.size(); ++d) {
    int64_t s = 0, c = 0;
    engines_[d]->column_counts(&s, &c);
    selected += s;
    columns += c;
  }
  total.selected_fraction = columns > 0 ? static_cast<double>(selected) / static_cast<double>(columns) : 0.0;
  return total;
}

// ---- checkpoint: the caller's layout, each device's entries at their parameters' places ----

std::vector<zf_engine_state_entry> EngineGroup::state_layout() const {
  if (!several()) return engines_[0]->state_layout();
  std::vector<zf_engine_state_entry> out(buffer_count_);
  for (size_t d = 0; d < engines_.size(); ++d) {
    const std::vector<zf_engine_state_entry> layout = engines_[d]->state_layout();
    for (size_t e = 0; e < layout.size(); ++e) out[buffers_of_[d][e]] = layout[e];
  }
  return out;
}

void EngineGroup::check_buffer_count(size_t count, const void* buffers) const {
  require(count == buffer_count_, ZF_ERROR_INVALID_VALUE, "buffers: ", count, " buffers for a state of ", buffer_count_,
          " entries");
  require(count == 0 || buffers != nullptr, ZF_ERROR_INVALID_VALUE, "buffers: NULL");
}

void EngineGroup::save_state(const zf_tensor* buffers, size_t count, int64_t* counters, double* loss_scale) {
  refuse_capture("save_state");
  if (!several()) return engines_[0]->save_state(buffers, count, counters, loss_scale);
  check_usable();
  check_buffer_count(count, buffers);
  const std::vector<std::vector<zf_tensor>> parts = gather_parts(buffers, buffers_of_);
  for (size_t d = 0; d < engines_.size(); ++d)
    engines_[d]->check_save_arguments(parts[d].data(), parts[d].size(), counters, loss_scale);
  // The counters and the loss scale are the same on every device: the first one's are kept.
  int64_t other_counters[ZF_ENGINE_STATE_COUNTERS];
  double other_scale = 0.0;
  for (size_t d = 0; d < engines_.size(); ++d) {
    engines_[d]->save_state(parts[d].data(), parts[d].size(), d == 0 ? counters : other_counters,
                            d == 0 ? loss_scale : &other_scale);
    require(
        d == 0 || (std::memcmp(counters, other_counters, sizeof(other_counters)) == 0 && other_scale == *loss_scale),
        ZF_ERROR_INTERNAL, "save_state: the schedules of ", describe_device(engines_[0]->device()), " and ",
        describe_device(engines_[d]->device()), " differ");
  }
}

void EngineGroup::load_state(const zf_tensor* buffers, size_t count, const int64_t* counters, double loss_scale) {
  refuse_capture("load_state");
  if (!several()) return engines_[0]->load_state(buffers, count, counters, loss_scale);
  check_buffer_count(count, buffers);
  const std::vector<std::vector<zf_tensor>> parts = gather_parts(buffers, buffers_of_);
  for (size_t d = 0; d < engines_.size(); ++d)
    engines_[d]->check_load_arguments(parts[d].data(), parts[d].size(), counters, loss_scale);
  try {
    for (size_t d = 0; d < engines_.size(); ++d) engines_[d]->apply_load(parts[d].data(), counters, loss_scale);
  } catch (const std::exception& error) {
    fail_sticky_from(0, error);
  }
  sticky_ = false;
  partials_read_.assign(engines_.size(), nullptr);  // apply_load synchronized every device
}

}  // namespace zf
