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

#include <algorithm>
#include <cstdint>
#include <map>
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

  void set_stream(zf_stream stream) { backend_->set_stream(stream); }

  // Testing: the next host-lane chunk throws with `message`.
  void inject_host_lane_fault_for_testing(const std::string& message) { lane_->inject_fault_for_testing(message); }
  int compute_threads() const { return compute_threads_; }
  int host_threads() const { return lane_->threads(); }
  // Testing: runs the engine on `backend` (the simulated asynchronous backend of the tests);
  // before the first step or load, with no device memory attached.
  void replace_backend_for_testing(std::unique_ptr<Backend> backend);
  void synchronize_backend() { backend_->synchronize(); }
  // Testing: the buckets as [first matrix, last matrix), dtype, bytes with nothing selected.
  struct BucketSpan {
    size_t first, last;
    zf_dtype dtype;
    size_t max_bytes;
  };
  std::vector<BucketSpan> buckets_for_testing() const {
    std::vector<BucketSpan> out;
    for (const Bucket& b : buckets_) out.push_back(BucketSpan{b.first, b.last, b.dtype, b.max_bytes});
    return out;
  }

 private:
  struct Param {
    zf_tensor tensor;
    int32_t group;
    bool matrix;
    int64_t rows, cols, numel;
    size_t index;  // into matrices_ or dense_
  };
  // A staging slot starts with a SlotHeader (step_scalars.hpp), copied down with the packed
  // gradient: the host accumulate applies its scale, or adds nothing when it says skip.
  static constexpr size_t kSlotHeaderBytes = 256;
  // Step scalars copied down for a later look (CUDA without loss scaling): the ring's size.
  static constexpr size_t kScalarRecords = 8;
  struct Matrix {
    size_t param;
    int64_t rows, cols, k;
    bool has_master;                // fp32 master of the selected columns on the device
    std::vector<int32_t> selected;  // current selection: empty, or k ascending columns
    size_t dev_selected = 0;        // device copy of `selected` (k i32)
    size_t col_offset = 0;          // this matrix's column sums in the col_sq region (floats)
    // host layout [cols, rows]
    std::vector<float> master, exp_avg, exp_avg_sq, acc[2];
    std::vector<int32_t> steps;
    size_t dev_master = 0, dev_exp_avg = 0, dev_exp_avg_sq = 0, dev_steps = 0;  // device offsets
    size_t compact_bytes = 0;
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
  };
  struct Bucket {
    size_t first, last;  // matrices [first, last)
    zf_dtype dtype;
    size_t max_bytes;  // packed bytes with nothing selected
    size_t upload_offset;
    std::unique_ptr<PackPlan> pack;
    AccumulatePlan accumulate;
    size_t packed_bytes = 0;                                  // with the current selection
    size_t early_slot = 0;                                    // the staging slot it took at submit (split steps)
    std::vector<zf_tensor> acc_tensors[2], selected_tensors;  // host
    std::vector<zf_tensor> matrix_tensors;                    // per step: gradients or parameters
    std::vector<const int32_t*> selected_ptrs;                // device copies of the selections
  };

  // engine.cpp
  void setup_buckets_and_memory();
  void create_backend(int compute_threads);
  void ensure_device_memory();
  void on_device_memory();
  void initialize_state();
  void check_usable() const;
  void check_grad(const zf_tensor& grad, size_t index) const;
  void check_lrs(const double* lrs, size_t lr_count) const;
  void run_step(const zf_tensor* grads, const double* lrs, bool stats_done);
  void run_step_unguarded(const zf_tensor* grads, const double* lrs, bool stats_done);
  size_t find_nonfinite(const zf_tensor* grads) const;
  void defer_bucket(Bucket& bucket, const zf_tensor* grads);
  void defer_bucket_early(Bucket& bucket);
  // Claims the next staging slot (waiting for the host to free it: back-pressure) and packs
  // the bucket's deferred gradient columns into it; returns the slot.
  size_t pack_into_next_slot(Bucket& bucket, const zf_tensor* grads);
  void release_early_buckets(const StepScalars* scalars);
  void cancel_early_buckets();
  ColumnStatsPlan& range_stats_plan(size_t first, size_t count);
  std::shared_ptr<WorkJob> submit_slot_accumulate(Bucket& bucket, size_t slot, const Event& copied);
  void wait_job(const std::shared_ptr<WorkJob>& job, double* stall);
  void poll_host_lane();
  void wait_all_slots(double* stall);
  // The step's scalars on the host: at once (read_scalars_now), or later from the ring.
  bool read_scalars_now() const;
  StepScalars readback_scalars(double* stall);
  void record_scalars_for_later();
  void check_recorded_scalars(bool wait);
  void consume_scalars(size_t count);
  const float* col_sq_on_host(double* stall);
  // Blocking copies for the rare paths (selection, initialisation, checkpoints): ordered
  // after everything enqueued before them; complete when they return.
  void download(void* host, const void* device, size_t bytes);
  void upload(void* device, const void* host, size_t bytes);
  std::vector<uint8_t> download_param(size_t index);
  void close_window(bool warm_up);
  void start_update();
  void finish_update(double* stall);
  void flush_internal();
  void window_bookkeeping(bool warm_up, int64_t* due, int64_t* counted);
  void fail_sticky(zf_status status, const std::string& message);
  // Non-finite flags: one slot per parameter (a statistics pass writes the slot of its first).
  size_t flag_count() const { return std::max<size_t>(1, params_.size()); }
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

  // device memory (attached, or owned)
  size_t device_bytes_ = 0, staging_offset_ = 0, slot_stride_ = 0, slot_bytes_ = 0, upload_buffer_offset_ = 0,
         device_state_bytes_ = 0, col_sq_offset_ = 0, col_sq_floats_ = 0, scalars_offset_ = 0,
         stats_workspace_offset_ = 0, stats_workspace_bytes_ = 0, selected_offset_ = 0, selected_bytes_ = 0,
         flags_offset_ = 0, total_sink_offset_ = 0, chunk_sums_offset_ = 0, scalar_ring_offset_ = 0;
  uint8_t* device_ = nullptr;
  bool device_owned_ = false;
  bool initialized_ = false;

  // host buffers: the ones a copy lane touches are pinned
  PinnedBuffer host_slots_;  // staging_slots * slot_stride_
  PinnedBuffer upload_;      // U
  size_t upload_bytes_ = 0;
  PinnedBuffer scalar_records_;  // kScalarRecords StepScalars, then one for readbacks
  struct PendingScalars {
    size_t record;
    Event copied;
    int64_t step;
  };
  std::vector<PendingScalars> pending_scalars_;
  size_t next_record_ = 0;
  std::vector<float> col_sq_host_;  // host copy of the col_sq region (CUDA)
  Event last_scatter_;              // the upload buffer is free once it completes
  Event uploads_done_;              // U is free once it completes
  std::vector<std::shared_ptr<WorkJob>> slot_jobs_;
  std::vector<Event> slot_copied_;  // per slot: its last copy down (the device slot is free after it)
  size_t next_slot_ = 0;
  std::shared_ptr<WorkJob> inflight_;  // the host update whose result is not uploaded yet
  int acc_current_ = 0;
  int64_t steps_accumulated_ = 0;
  std::vector<double> last_lr_;  // per group, of the last accumulated step

  // per-step scratch (kept for capacity)
  std::unique_ptr<ColumnStatsPlan> stats_plan_;
  std::vector<zf_tensor> col_sq_tensors_;  // per parameter, in the device col_sq region
  std::unique_ptr<AdamwSelectedPlan> device_plan_;
  std::vector<size_t> device_plan_params_;
  std::vector<AdamwSelectedPointers> device_pointers_;
  std::vector<double> step_lrs_;

  // split form. A split step that is not a selection step starts its work at submit: the
  // statistics of each submitted range, and the pack and copy down of each bucket whose
  // matrices are all submitted (at most staging_slots buckets: a slot is not reused within
  // the step before end_step). Their host accumulates are queued by end_step, after the
  // slots' headers (the step's scale is known only then); abort_step drops them.
  bool early_ = false;
  std::vector<size_t> bucket_pending_;  // per bucket: matrices not submitted yet
  std::vector<uint8_t> bucket_early_;   // per bucket: packed and copied at submit
  std::vector<size_t> early_buckets_;   // those buckets, in the order they went
  std::map<std::pair<size_t, size_t>, std::unique_ptr<ColumnStatsPlan>> range_plans_;
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
  double last_norm_ = 0.0, stall_close_ = 0.0, stall_back_pressure_ = 0.0, stall_flush_ = 0.0, stall_readback_ = 0.0;
};

}  // namespace zf
