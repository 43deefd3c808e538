// What a zf_engine handle holds (docs/design.md section 7, "Several devices"): the engine
// over the caller's parameters. Parameters on one device (or on the CPU) make one Engine and
// every call goes straight to it. Parameters on several CUDA devices of one process make one
// Engine per device, each with its own backend (its streams, events, device memory and
// pinned buffers) and host lane, driven in lock step by this class, which adds only what the
// devices must agree on:
//   - the step's scalars: each device forms the partial of its parameters (sum of squares,
//     non-finite flag); the partials are copied to every device (peer copies ordered by
//     events, no host round trip), and each device combines them in device order, so the
//     norm, the clip coefficient and the skip flag are the same bits everywhere;
//   - the auto update interval's counts, summed over the devices before each close;
//   - argument checks on every device before any device changes anything.
// The schedule, selection, windows and loss scale then follow identically on every device;
// nothing else is exchanged. The parameters' order is the caller's: a device's engine sees
// its parameters in that order, and every index in an error message or a checkpoint entry
// is the caller's.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "engine/readiness.hpp"

namespace zf {

class EngineGroup {
 public:
  // parts_for_testing: the part of each parameter (parts 0..N-1, each used), to run a group
  // over CPU parameters on host backends; nullptr: the parameters' devices decide.
  EngineGroup(const zf_tensor* params, const int32_t* param_groups, size_t param_count, const zf_engine_group* groups,
              size_t group_count, const zf_engine_config& config,
              const std::vector<size_t>* parts_for_testing = nullptr);

  // ---- devices: index d in [0, device_count()), in increasing device index ----
  size_t device_count() const { return engines_.size(); }
  zf_device device(size_t d) const;
  size_t device_memory_bytes(size_t d) const;
  void attach_device_memory(size_t d, void* memory, size_t bytes);
  void set_stream(size_t d, zf_stream stream);
  // The one device's engine, for the calls that name no device (`call` names the call).
  Engine& single(const char* call);
  const Engine& single(const char* call) const;
  Engine& engine(size_t d) { return *engines_[d]; }
  const Engine& engine(size_t d) const { return *engines_[d]; }
  // Testing: the next host-lane chunk of every device throws with `message`.
  void inject_host_lane_fault_for_testing(const std::string& message);

  void set_collectives(const zf_engine_collectives* collectives);

  void step(const zf_tensor* grads, size_t count, const double* lrs, size_t lr_count);
  void begin_step(const double* lrs, size_t lr_count);
  void submit(size_t first, const zf_tensor* grads, size_t count);
  void end_step();
  void abort_step();
  // zf_engine_mark_ready / zf_engine_end_step_with: readiness (readiness.hpp) in the caller's
  // parameter order; the runs go to submit().
  void mark_ready(size_t index, const zf_tensor* grad);
  void end_step_with(const zf_tensor* grads, size_t count);
  // zf_engine_take_released: every device's released parameters (the caller's indices), at
  // most `capacity`; the rest wait for the next call.
  void take_released(size_t* indices, size_t capacity, size_t* count);
  // zf_engine_check_params: the parameters' memory is where it was at creation.
  void check_param_data(const void* const* data, size_t count) const;
  void flush();
  // zf_engine_set_hyperparameters: every device's engine, after every one's checks.
  void set_hyperparameters(double beta1, double beta2, double eps, const double* weight_decays, size_t group_count);
  // zf_engine_refuse: data parallel (one device) only; a no-op otherwise.
  void refuse(zf_engine_call call);

  zf_engine_stats stats() const;
  double loss_scale() const { return engines_[0]->loss_scale(); }

  std::vector<zf_engine_state_entry> state_layout() const;
  void save_state(const zf_tensor* buffers, size_t count, int64_t* counters, double* loss_scale);
  void load_state(const zf_tensor* buffers, size_t count, const int64_t* counters, double loss_scale);

 private:
  // Every device's refuse_capture (engine.hpp): before an entry point changes anything.
  void refuse_capture(const char* call) const;

  bool several() const { return engines_.size() > 1; }
  // Device d's engine; INVALID_VALUE naming `device` when d is out of range.
  Engine& at(size_t d);
  const Engine& at(size_t d) const;
  void check_usable() const;
  // Runs the three phases of a step on every device (inputs: each device's gradients).
  void run_step(const std::vector<Engine::StepInputs>& inputs);
  void exchange_partials();
  void fail_sticky_from(size_t d, const std::exception& error);
  void check_buffer_count(size_t count, const void* buffers) const;
  // submit() without the readiness bookkeeping.
  void submit_to_devices(size_t first, const zf_tensor* grads, size_t count);

  std::vector<std::unique_ptr<Engine>> engines_;
  size_t param_count_ = 0;
  std::vector<size_t> part_of_, local_of_;       // per parameter: its device's part, index there
  std::vector<std::vector<size_t>> params_of_;   // per part: the caller's index of each parameter
  std::vector<std::vector<size_t>> buffers_of_;  // per part: the caller's index of each buffer
  size_t buffer_count_ = 0;
  std::vector<Event> partials_read_;     // per part: it has read every partial of the last step
  std::vector<const void*> param_data_;  // per parameter: its data at creation
  ReadyRuns ready_;                      // the open split step's readiness (size 0: none open)
  std::vector<size_t> released_;         // released parameters not yet taken (take_released)
  std::vector<zf_tensor> ready_grads_;   // per parameter: the gradient mark_ready gave
  std::vector<double> split_lrs_;        // begin_step's learning rates (a retaken step uses them)
  bool sticky_ = false;
  zf_status sticky_status_ = ZF_SUCCESS;
  std::string sticky_message_;
};

}  // namespace zf
