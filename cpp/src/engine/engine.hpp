// The engine's state machine (docs/design.md sections 2, 3 and 7): one step, in order,
// on top of a Backend (device-side ops and copies) and the HostLane (host-side work).
//
//   step t: validate -> column statistics of every gradient (dense included) -> global norm,
//   clip coefficient, skip flag -> [selection step: flush, top-k, lossless exchange] ->
//   AdamW of the selected columns and the dense parameters -> deferred columns, bucket by
//   bucket: pack the raw gradient into a device staging slot (waiting for the slot if the
//   host still holds it: back-pressure), copy it down with a header (scale, skip), and let
//   the host lane accumulate it into A (scale = clip / loss scale) -> [window close: the
//   host AdamW of the deferred columns on A / steps, writing the upload copy U; uploaded at
//   once (overlap off, warm-up) or at the next close (overlap on)].
//
// Files: engine.cpp (setup, checks), step.cpp (the step, windows, flush), selection.cpp (top-k and the
// exchange), checkpoint.cpp, stats.cpp, engine_api.cpp (the C ABI).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/thread_pool.hpp"
#include "engine/backend.hpp"
#include "engine/host_lane.hpp"
#include "engine/schedule.hpp"
#include "ops/cpu_adamw_plan.hpp"
#include "zenflow/engine.h"

namespace zf {

class Engine {
 public:
  Engine(const zf_tensor* params, const int32_t* param_groups, size_t param_count, const zf_engine_group* groups,
         size_t group_count, const zf_engine_config& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  size_t device_memory_bytes() const { return device_bytes_; }
  void attach_device_memory(void* memory, size_t bytes);

  void step(const zf_tensor* grads, size_t count, const double* lrs, size_t lr_count);
  void begin_step(const double* lrs, size_t lr_count);
  void submit(size_t first, const zf_tensor* grads, size_t count);
  void end_step();
  void abort_step();
  void flush();

  zf_engine_stats stats() const;
  double loss_scale() const { return loss_scale_; }

  std::vector<zf_engine_state_entry> state_layout() const;
  void save_state(const zf_tensor* buffers, size_t count, int64_t* counters, double* loss_scale);
  void load_state(const zf_tensor* buffers, size_t count, const int64_t* counters, double loss_scale);

  // Testing: the next host-lane chunk throws with `message`.
  void inject_host_lane_fault_for_testing(const std::string& message) { lane_->inject_fault_for_testing(message); }
  int compute_threads() const { return compute_threads_; }
  int host_threads() const { return lane_->threads(); }

 private:
  struct Param {
    zf_tensor tensor;
    int32_t group;
    bool matrix;
    int64_t rows, cols, numel;
    size_t index;  // into matrices_ or dense_
  };
  // A staging-slot header, written with the packed gradient and copied down with it.
  struct SlotHeader {
    float grad_scale;  // clip / loss_scale, applied by the host accumulate
    int32_t skip;      // 1: the step overflowed; the host adds nothing
  };
  static constexpr size_t kSlotHeaderBytes = 256;
  struct Matrix {
    size_t param;
    int64_t rows, cols, k;
    bool has_master;                // fp32 master of the selected columns on the device
    std::vector<int32_t> selected;  // current selection: empty, or k ascending columns
    // host layout [cols, rows]
    std::vector<float> master, exp_avg, exp_avg_sq, acc[2];
    std::vector<int32_t> steps;
    size_t dev_master = 0, dev_exp_avg = 0, dev_exp_avg_sq = 0, dev_steps = 0;  // device offsets
    size_t compact_bytes = 0;
    std::vector<float> col_sq;
    std::vector<float> window_score;  // [2, cols]: previous, current window
    float energy[2] = {0.0f, 0.0f};   // auto interval: selected, deferred sums this window
    size_t bucket = 0;
    size_t upload_offset = 0;  // bytes into U (this matrix's packed columns, param dtype)
    ColumnStepPlan update_plan;
  };
  struct Dense {
    size_t param;
    bool has_master;
    size_t dev_master = 0, dev_exp_avg = 0, dev_exp_avg_sq = 0, dev_steps = 0;
    std::vector<float> col_sq;
  };
  struct Bucket {
    size_t first, last;  // matrices [first, last)
    zf_dtype dtype;
    size_t max_bytes;  // packed bytes with nothing selected
    size_t upload_offset;
    std::unique_ptr<PackPlan> pack;
    AccumulatePlan accumulate;
    size_t packed_bytes = 0;  // with the current selection
    std::vector<zf_tensor> acc_tensors[2], selected_tensors;
    std::vector<void*> grad_ptrs, param_ptrs;
    std::vector<const int32_t*> selected_ptrs;
  };

  // engine.cpp
  void setup_buckets_and_memory();
  void ensure_device_memory();
  void initialize_state();
  void check_usable() const;
  void check_grad(const zf_tensor& grad, size_t index) const;
  void check_lrs(const double* lrs, size_t lr_count) const;
  void run_step(const zf_tensor* grads, const double* lrs);
  size_t find_nonfinite(const zf_tensor* grads) const;
  void defer_bucket(Bucket& bucket, const zf_tensor* grads, float grad_scale);
  void wait_job(const std::shared_ptr<WorkJob>& job, double* stall);
  void poll_host_lane();
  void wait_all_slots(double* stall);
  void close_window(bool warm_up);
  void start_update();
  void finish_update(double* stall);
  void flush_internal();
  void window_bookkeeping(bool warm_up, int64_t* due, int64_t* counted);
  float* device_float(size_t offset) const { return reinterpret_cast<float*>(device_ + offset); }
  int32_t* device_int(size_t offset) const { return reinterpret_cast<int32_t*>(device_ + offset); }
  zf_column_state host_state(Matrix& m, bool with_master);
  // selection.cpp
  void select_columns();
  void exchange_columns(Matrix& m, const std::vector<int32_t>& new_selected);
  void rebuild_plans();

  zf_engine_config config_;
  zf_adam_hparams hparams_;
  std::vector<zf_engine_group> groups_;
  std::vector<Param> params_;
  std::vector<Matrix> matrices_;
  std::vector<Dense> dense_;
  std::vector<Bucket> buckets_;
  Schedule schedule_;

  // lanes: the compute lane's pool lives in the backend; the host lane has its own
  int compute_threads_ = 1;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<HostLane> lane_;

  // device memory (attached, or owned on the host backend)
  size_t device_bytes_ = 0, staging_offset_ = 0, slot_stride_ = 0, slot_bytes_ = 0, upload_buffer_offset_ = 0,
         scratch_offset_ = 0, device_state_bytes_ = 0;
  uint8_t* device_ = nullptr;
  bool device_owned_ = false;
  bool initialized_ = false;

  // host buffers
  std::vector<uint8_t> host_slots_;  // staging_slots * slot_stride_
  std::vector<uint8_t> upload_;      // U
  std::vector<std::shared_ptr<WorkJob>> slot_jobs_;
  size_t next_slot_ = 0;
  std::shared_ptr<WorkJob> inflight_;  // the host update whose result is not uploaded yet
  int acc_current_ = 0;
  int64_t steps_accumulated_ = 0;
  std::vector<double> last_lr_;  // per group, of the last accumulated step

  // per-step scratch (kept for capacity)
  std::unique_ptr<ColumnStatsPlan> stats_plan_;
  std::vector<const void*> grad_ptrs_;
  std::vector<float*> col_sq_ptrs_;
  std::unique_ptr<AdamwSelectedPlan> device_plan_;
  std::vector<size_t> device_plan_params_;
  std::vector<AdamwSelectedPointers> device_pointers_;
  std::vector<double> step_lrs_;

  // split form
  bool in_split_step_ = false;
  std::vector<zf_tensor> submitted_;
  std::vector<uint8_t> submitted_flags_;
  std::vector<double> split_lrs_;
  bool split_has_lrs_ = false;

  // loss scaling and faults
  double loss_scale_ = 1.0;
  int64_t growth_tracker_ = 0;
  bool sticky_ = false;
  zf_status sticky_status_ = ZF_SUCCESS;
  std::string sticky_message_;

  // stats
  int64_t windows_ = 0, reselections_ = 0, skipped_steps_ = 0, bytes_down_ = 0, bytes_up_ = 0;
  double last_norm_ = 0.0, stall_close_ = 0.0, stall_back_pressure_ = 0.0, stall_flush_ = 0.0;
};

}  // namespace zf
