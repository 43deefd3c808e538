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
// exchange), checkpoint.cpp, stats.cpp, engine_group.cpp (one engine per device, in lock step),
// engine_api.cpp (the C ABI).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/host_memory.hpp"
#include "common/thread_pool.hpp"
#include "engine/backend.hpp"
#include "engine/device_arena.hpp"
#include "engine/host_lane.hpp"
#include "engine/host_window.hpp"
#include "engine/scalar_readback.hpp"
#include "engine/schedule.hpp"
#include "engine/staging_ring.hpp"
#include "ops/cpu_adamw_plan.hpp"
#include "zenflow/engine.h"

namespace zf {

// Every region of the engine's device memory starts 256-byte aligned.
inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Adds `amount` (>= 0) to a statistics counter (>= 0) that stops at INT64_MAX instead of
// overflowing: a byte count of a long run must not wrap to a negative one (docs/design.md
// section 8, "Counters").
inline void add_saturating(int64_t& counter, int64_t amount) {
  counter = amount > INT64_MAX - counter ? INT64_MAX : counter + amount;
}

// One engine's place in a group over several devices (engine_group.hpp): device `index` of
// `count`, and the group's indices of its parameters and checkpoint buffers, which its error
// messages name. The default is an engine of its own.
struct EnginePart {
  size_t index = 0, count = 1;
  std::vector<size_t> param_names, buffer_names;  // empty: the engine's own indices
};

// The automatic thread counts of an engine with this configuration (0 in the config: auto):
// the compute lane's and the host lane's.
void automatic_thread_counts(const zf_engine_config& config, int* compute_threads, int* host_threads);
// zf_engine_thread_plan_for (engine.h): the one rule for every thread count of the engine and
// the framework beside it.
zf_engine_thread_plan thread_plan(const zf_engine_config& config);
// Refuses a bad configuration with the field's name (zf_engine_create's checks).
void validate_config(const zf_engine_config& config);
// The engine's rule of which parameters are matrices (their columns selected and deferred):
// two or more dimensions, outside a dense group. The rest take plain AdamW every step.
inline bool is_matrix(const zf_tensor& param, bool dense_group) { return param.ndim >= 2 && !dense_group; }
// The state entries of one parameter (zf_engine_state_layout's, in order) with k selected
// columns, named `name`.
std::vector<zf_engine_state_entry> param_state_entries(size_t name, const zf_tensor& param, bool matrix, int64_t k);

class Engine {
 public:
  Engine(const zf_tensor* params, const int32_t* param_groups, size_t param_count, const zf_engine_group* groups,
         size_t group_count, const zf_engine_config& config, EnginePart part = EnginePart());
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  size_t device_memory_bytes() const { return arena_.bytes(); }
  void attach_device_memory(void* memory, size_t bytes);

  void step(const zf_tensor* grads, size_t count, const double* lrs, size_t lr_count);
  // Data parallel: begin_step agrees with the other ranks (its refusal fails every rank
  // there); submit's refusals wait for end_step, whose agreement rides on the statistics'
  // all-reduce; abort_step of an open split step joins end_step's collectives as refused.
  void begin_step(const double* lrs, size_t lr_count);
  void submit(size_t first, const zf_tensor* grads, size_t count);
  void end_step();
  void abort_step();
  // Readiness (engine_group.cpp): parameter `index`, already submitted in this split step,
  // got more gradient. Data parallel reads a submitted gradient when its bucket is reduced:
  // before that the new one is simply read (its descriptor replaces the submitted one);
  // after, the step cannot be taken from it, and end_step refuses it on every rank.
  void late_gradient(size_t index, const zf_tensor& grad);
  bool data_parallel() const { return parallel(); }
  void flush();
  // zf_engine_set_hyperparameters: the checks, then the values of later steps.
  void check_hyperparameters(double beta1, double beta2, double eps, const double* weight_decays,
                             size_t group_count) const;
  void set_hyperparameters(double beta1, double beta2, double eps, const double* weight_decays, size_t group_count);
  // zf_engine_refuse: joins `call`'s agreement as refused (data parallel; else nothing).
  void refuse(zf_engine_call call);
  // The calls that start with an agreement (zf_engine_call's values): their collectives follow
  // it, so every rank must be in the same one (a rank flushing while another steps would run
  // other collectives).
  // kSplitStep: begin_step in data parallel. A rank in a plain step meets it as one call
  // (step() then goes through the split form: the ranks' collectives are the split step's).
  enum class Agreement : int32_t { kStep = 1, kFlush = 2, kSave = 3, kLoad = 4, kSplitStep = 5 };

  // ---- one step in phases, for a group over several devices (engine_group.cpp) ----
  // step(): the checks, then run_step, which runs the three phases back to back inside
  // run_guarded. A group runs each phase on every device before the next, exchanging the
  // scalar partials after the statistics and summing the window counts before the close.
  void check_step_arguments(const zf_tensor* grads, size_t count, const double* lrs, size_t lr_count);
  void check_submit_arguments(size_t first, const zf_tensor* grads, size_t count) const;
  void check_end_step_arguments() const;
  struct StepInputs {
    const zf_tensor* grads;
    const double* lrs;
    bool stats_done;
  };
  StepInputs close_split_step();  // after check_end_step_arguments: what run_step gets
  void run_guarded(const std::function<void()>& phase);
  void step_statistics(const zf_tensor* grads, bool stats_done);
  // false: the step was skipped (an overflow under dynamic loss scaling); no close follows.
  bool step_update(const zf_tensor* grads, const double* lrs, int64_t* due, int64_t* counted);
  void step_close(int64_t due, int64_t counted);
  // auto_warm_up_rounds (schedule.hpp): after step_close, whether the synchronous start is
  // decided now; this engine's sums of the matrices' bias-corrected moments (m_hat^2, v_hat),
  // summed over the ranks (data parallel); and the decision from the sums of every engine of
  // a group (the same on every device and rank).
  bool start_decision_due() const { return schedule_.start_decision_due(); }
  void start_signal_sums(double* sums);
  void decide_start(const double* sums);
  // At the first window after per-step updates of every column (section 3 of
  // docs/design.md): each host column's second moment becomes that of the mean of S steps'
  // gradients (window_scaling sqrt or linear, a fixed update_interval S > 1).
  void moments_to_windows();
  // visit(exp_avg, exp_avg_sq, rows, 1 - beta1^s, 1 - beta2^s) for each host column of this
  // rank that has stepped (s its step count), in a fixed order.
  template <class Visit>
  void for_each_host_column(Visit&& visit);
  void finish_step() { cancel_early_buckets(); }
  // The partial exchange: this engine's compute lane copies device `slot`'s partial from that
  // device's engine (the group orders the copy after the peer's event with wait_compute).
  Event record_compute() { return backend_->record(Lane::kCompute); }
  void wait_compute(const Event& event) { backend_->wait(Lane::kCompute, event); }
  void copy_partial_from(const Engine& peer, size_t slot) {
    backend_->copy_from_peer(partial(slot), *peer.backend_, peer.partial(slot), sizeof(ScalarPartial));
  }
  // The host backend only (memory read in place): whether this engine's partial flags a
  // non-finite gradient, and the group's index of its first non-finite gradient.
  bool host_visible() const { return backend_->host_visible(); }
  bool own_partial_nonfinite() const { return partial(part_.index)->nonfinite != 0; }
  size_t first_nonfinite(const zf_tensor* grads) const { return param_name(find_nonfinite(grads)); }
  [[noreturn]] static void fail_nonfinite_gradient(size_t name);
  void set_buffer_names(std::vector<size_t> names) { part_.buffer_names = std::move(names); }
  bool in_split_step() const { return in_split_step_; }
  // zf_engine_take_released: the group's indices of the parameters released since the last
  // call (those whose last read has completed), appended to `out`.
  void take_released(std::vector<size_t>* out);
  // Whether parameter `index`'s gradient (any gradient) was released in this split step.
  bool gradient_released(size_t index) const;
  bool released_any() const {
    return std::find(bucket_released_.begin(), bucket_released_.end(), 1) != bucket_released_.end();
  }
  const zf_engine_config& config() const { return config_; }
  void check_load_arguments(const zf_tensor* buffers, size_t count, const int64_t* counters, double loss_scale) const;
  void apply_load(const zf_tensor* buffers, const int64_t* counters, double loss_scale);
  zf_device device() const { return backend_->device(); }
  // Selected and all columns of the matrices (a group's selected_fraction).
  void column_counts(int64_t* selected, int64_t* columns) const;

  zf_engine_stats stats() const;
  double loss_scale() const { return loss_scale_; }

  std::vector<zf_engine_state_entry> state_layout() const;
  void save_state(const zf_tensor* buffers, size_t count, int64_t* counters, double* loss_scale);
  void check_save_arguments(const zf_tensor* buffers, size_t count, const int64_t* counters, const double* loss_scale);
  void write_state(const zf_tensor* buffers, int64_t* counters, double* loss_scale);
  void load_state(const zf_tensor* buffers, size_t count, const int64_t* counters, double loss_scale);

  // The compute lane's stream; refused while `stream` is capturing a CUDA graph.
  void set_stream(zf_stream stream);
  // Refuses (ZF_ERROR_NOT_SUPPORTED, naming `call`) while the compute stream is capturing a
  // CUDA graph: every call that enqueues work checks this before it changes anything.
  void refuse_capture(const char* call) const;
  // Data parallel (parallel.cpp): rank `rank` of `world_size`; before device memory and the
  // first step.
  void set_collectives(const zf_engine_collectives* collectives);

  // Testing: the next host-lane chunk throws with `message`.
  void inject_host_lane_fault_for_testing(const std::string& message) { lane_->inject_fault_for_testing(message); }
  int compute_threads() const { return compute_threads_; }
  int host_threads() const { return lane_->threads(); }
  // Testing: runs the engine on `backend` (the simulated asynchronous backend of the tests);
  // before the first step or load, with no device memory attached.
  void replace_backend_for_testing(std::unique_ptr<Backend> backend);
  void synchronize_backend() { backend_->synchronize(); }
  // Testing: false makes every closing step accumulate as any other step (the unfused form).
  void set_fuse_window_close_for_testing(bool fuse) { fuse_window_close_ = fuse; }
  // Testing: the capacity of the host state and the pinned buffers, in bytes.
  size_t host_memory_capacity() const;
  // Testing: where every host array the host lane streams starts (each matrix's master,
  // moments and accumulators, each staging slot's packed columns, each upload copy), once
  // the host memory exists.
  std::vector<const void*> host_stream_bases_for_testing() const;
  // Testing: the blocks of host memory the engine allocated for the host lane to stream, as
  // (start, bytes): each host state array (its capacity), the upload copies' buffer and, on a
  // backend whose device memory is host memory, its allocated arena (the staging slots).
  std::vector<std::pair<const void*, size_t>> host_stream_blocks_for_testing() const;
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
  void open_split_step(const double* lrs, size_t lr_count);
  // Waits for the host lane's accumulates and running update without applying anything (save).
  void quiesce_host_lane();
  // The host state (this rank's columns) and the pinned buffers, allocated at first use and
  // released when the plan changes (set_collectives, a new backend).
  void ensure_host_memory();
  void release_host_memory();
  bool host_memory_ready_ = false;
  // The host lane, its thread bound to this engine's backend (Backend::bind_engine_thread).
  std::unique_ptr<HostLane> make_host_lane(int threads);

  struct Param {
    zf_tensor tensor;
    int32_t group;
    bool matrix;
    int64_t rows, cols, numel;
    size_t index;           // into matrices_ or dense_
    size_t col_offset = 0;  // its column sums in the col_sq region (floats)
  };
  // A staging slot starts with a SlotHeader (step_scalars.hpp), copied down with the packed
  // gradient: the host accumulate applies its scale, or adds nothing when it says skip.
  static constexpr size_t kSlotHeaderBytes = StagingRing::kHeaderBytes;
  struct Matrix {
    size_t param;
    int64_t rows, cols, k;
    bool has_master;                // fp32 master of the selected columns on the device
    std::vector<int32_t> selected;  // current selection: empty, or k ascending columns
    size_t dev_selected = 0;        // device copy of `selected` (k i32)
    size_t col_offset = 0;          // this matrix's column sums in the col_sq region (floats)
    // The deferred host layout: this rank's deferred columns (its columns minus own_selected),
    // ascending, each column's rows contiguous: [own_deferred(), rows], the layout of the
    // packed gradient and the upload copy, so that the window's passes stream every array
    // with no gaps. Allocated for all [own_cols, rows]; a selection moves the columns that
    // stay deferred to their new places (relayout_deferred).
    // Each array starts on a cache line, as the staging slots and the upload copies do.
    StreamedVector<float> master, exp_avg, exp_avg_sq, acc[2];
    // The five arrays above, for what is done to each alike (allocate, release, account).
    std::array<StreamedVector<float>*, 5> host_arrays() { return {&master, &exp_avg, &exp_avg_sq, &acc[0], &acc[1]}; }
    std::array<const StreamedVector<float>*, 5> host_arrays() const {
      return {&master, &exp_avg, &exp_avg_sq, &acc[0], &acc[1]};
    }
    // Per accumulator: 1 while it holds nothing of an open window (the next accumulate
    // writes it instead of adding; the update that consumes it does not zero it). Touched
    // by the host lane's jobs only (one thread), and by the training thread only while the
    // lane is idle (rebuild_plans).
    uint8_t acc_fresh[2] = {1, 1};
    std::vector<int32_t> steps;  // per deferred column, in the same order
    size_t dev_master = 0, dev_exp_avg = 0, dev_exp_avg_sq = 0, dev_steps = 0;  // device offsets
    size_t compact_bytes = 0;
    std::vector<float> window_score;  // [2, cols]: previous, current window
    float energy[2] = {0.0f, 0.0f};   // auto interval: selected, deferred column-norm sums this window
    size_t bucket = 0;
    size_t upload_offset = 0;  // bytes into U (this matrix's packed columns, param dtype)
    // The columns this rank owns, [own_lo, own_lo + own_cols): all of them on one engine. The
    // host state covers only them; own_selected are the selected ones among them, minus
    // own_lo, and the host state holds the others (own_deferred() columns).
    int64_t own_lo = 0, own_cols = 0;
    std::vector<int32_t> own_selected;
    int64_t own_deferred() const { return own_cols - static_cast<int64_t>(own_selected.size()); }
    // Data parallel, device lists: the unselected columns (the selected ones' pack skips
    // them), and per rank q a skip list of every column outside q's deferred chunk (n i32 each).
    size_t dev_deferred = 0, dev_rank_skip = 0;
    std::vector<int64_t> rank_skip_count;
    // release_gradients: the device copy of this step's gradient's selected columns, [k, rows]
    // (pack.h's layout), inside its bucket's compact region.
    size_t dev_compact_grad = 0;
  };
  // Consecutive matrices of a bucket whose window update runs as one chunk of the host lane
  // (one region of its pool): at least kUpdateChunkElements deferred elements, or the rest of
  // the bucket. Built by rebuild_plans.
  struct UpdateGroup {
    std::vector<size_t> matrices;         // into matrices_, each with deferred columns
    std::vector<zf_column_state> states;  // their host states (host_state)
    size_t upload_offset = 0;             // bytes into U of the first one
    ColumnStepPlan update_plan;           // from the accumulators A
    // The window update with its last accumulate fused in: the packed gradient read from U,
    // where the closing step's pack left it, and the result written back over it.
    ColumnStepPlan fused_update_plan;
  };
  // A chunk's size: the high-priority accumulates of the next steps wait for at most one
  // (about 10 ms at 50 GB/s), and a chunk per matrix cost the update its regions' start and
  // end (wake-ups, the slower thread's tail) 40 times a window at 40 x [1024, 2048].
  static constexpr int64_t kUpdateChunkElements = int64_t{1} << 24;
  struct Dense {
    size_t param;
    bool has_master;
    size_t dev_master = 0, dev_exp_avg = 0, dev_exp_avg_sq = 0, dev_steps = 0;
  };
  // Data parallel: the matrices of a bucket that one pass of collectives reduces (and
  // all-gathers), so that the reduction scratch is a rank's share of a bucket, not a whole
  // one (plan_reduction_groups: at most bucket_bytes / world of gradient, or one matrix).
  // rank_pack[q]: rank q's deferred chunk of the group's matrices; selected_pack: their
  // selected columns; whole_pack: every column. chunk_elements: the chunk every rank pads to
  // (the same on all ranks).
  struct ReductionGroup {
    size_t first, last;  // matrices [first, last), inside the bucket's
    std::vector<std::unique_ptr<PackPlan>> rank_pack;
    std::unique_ptr<PackPlan> selected_pack, whole_pack;
    size_t chunk_elements = 0, selected_elements = 0, deferred_elements = 0;  // current selection, all ranks
    size_t own_elements = 0;  // this rank's deferred elements (the first of its chunk)
  };
  struct Bucket {
    size_t first, last;  // matrices [first, last)
    zf_dtype dtype;
    size_t max_bytes;      // packed bytes with nothing selected (all ranks: it decides the buckets)
    size_t own_max_bytes;  // the same for this rank's columns (its staging slot and U)
    size_t upload_offset;
    std::unique_ptr<PackPlan> pack;
    AccumulatePlan accumulate;
    std::vector<uint8_t> overwrite;             // host lane: per matrix, this accumulate writes (acc_fresh)
    size_t packed_bytes = 0;                    // with the current selection
    size_t early_slot = 0;                      // the host staging slot it took at submit (split steps)
    size_t early_device_slot = 0;               // and its device slot (the same on the host backend)
    size_t compact_grad_offset = 0;             // release_gradients: its matrices' compact gradients (device)
    size_t gradient_bytes = 0;                  // its matrices' whole gradients, in bytes
    std::vector<zf_tensor> acc_tensors[2];      // host, deferred layout
    std::vector<UpdateGroup> update_groups;     // the window update's chunks
    std::vector<zf_tensor> matrix_tensors;      // per step: gradients or parameters
    std::vector<const int32_t*> selected_ptrs;  // device: what `pack` skips
    // The bucket's selected columns (selected_pack, skipping the deferred ones: data
    // parallel's all-reduce of them, release_gradients' compact copy) and, data parallel,
    // each matrix's device skip lists: rank q's (rank_skip_ptrs[q]), the deferred columns'
    // (deferred_ptrs), none (no_skip_ptrs).
    std::unique_ptr<PackPlan> selected_pack;
    std::vector<std::vector<const int32_t*>> rank_skip_ptrs;
    std::vector<const int32_t*> deferred_ptrs, no_skip_ptrs;
    size_t selected_elements = 0;        // current selection, all ranks
    std::vector<ReductionGroup> groups;  // data parallel
  };

  // engine.cpp
  void setup_buckets_and_memory();
  void create_backend(int compute_threads);
  void ensure_device_memory();
  void on_device_memory();
  void initialize_state();
  void check_usable() const;
  // Refuses a step, before it changes anything, when a counter it advances has no room left:
  // an Adam step count (step_count_bound_), the schedule's counters, the skipped steps.
  void check_counters_have_room() const;
  void check_grad(const zf_tensor& grad, size_t index) const;
  void check_lrs(const double* lrs, size_t lr_count) const;
  void run_step(const zf_tensor* grads, const double* lrs, bool stats_done);
  std::vector<zf_engine_state_entry> layout_entries(bool group_names) const;
  size_t param_name(size_t local) const { return part_.param_names.empty() ? local : part_.param_names[local]; }
  size_t buffer_name(size_t local) const { return part_.buffer_names.empty() ? local : part_.buffer_names[local]; }
  ScalarPartial* partial(size_t slot) const {
    return reinterpret_cast<ScalarPartial*>(arena_.base() + partials_offset_) + slot;
  }
  size_t find_nonfinite(const zf_tensor* grads) const;
  // release_gradients (step.cpp): a bucket whose gradients are all consumed (statistics
  // taken, deferred columns packed) copies its selected columns into its compact region and
  // releases its gradients: recorded with the event after its last read of them.
  bool releasing() const { return config_.release_gradients != 0; }
  void release_bucket(Bucket& b);
  void hold_gradient_bytes(int64_t bytes);
  void defer_bucket(Bucket& bucket, const zf_tensor* grads);
  void defer_bucket_early(Bucket& bucket);
  // Claims the next host staging slot (waiting for the host to free it: back-pressure) and
  // the next device slot (the compute lane waits for its last copy down), and packs the
  // bucket's deferred gradient columns into the device slot. On the host backend the two are
  // one slot (device == host).
  StagingRing::Slot pack_into_next_slot(Bucket& bucket, const zf_tensor* grads);
  // The window's closing step (docs/design.md section 5, "Host lane traffic"): its deferred
  // columns go into the upload copy the next result goes to (next_upload_copy), where the
  // window's update reads them in place, with no accumulate. Decided once per step, before
  // its first pack: the schedule says the step closes its window, and that copy is free (no
  // result is owed, or a second copy holds it).
  bool closing_step_into_upload() const;
  // The upload copies the schedule needs (upload_copies_), and the one the next result goes
  // to: the copy not holding the last result.
  int upload_copies_needed() const;
  int next_upload_copy() const { return upload_copies_ == 2 ? 1 - window_.result_buffer() : 0; }
  void pack_into_upload(Bucket& bucket, const zf_tensor* grads);
  // The step's header (gradient scale, skip flag) for the fused update, after its packs: one
  // per upload copy, as the last result's update may still read its own while the next
  // closing step writes.
  void write_closing_header(const StepScalars* scalars);
  uint8_t* closing_header(int buffer) const;
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
  // A recorded step's scalars, looked at: its norm, or a sticky failure if non-finite.
  void on_recorded_scalars(const StepScalars& scalars, int64_t step);
  const float* col_sq_on_host(double* stall);
  // Blocking copies for the rare paths (selection, initialisation, checkpoints): ordered
  // after everything enqueued before them; complete when they return.
  void download(void* host, const void* device, size_t bytes);
  void upload(void* device, const void* host, size_t bytes);
  std::vector<uint8_t> download_param(size_t index);
  void close_window(bool warm_up);
  // The result goes to next_upload_copy(); `fused`: the window's closing step was packed
  // there (closing_into_upload_).
  void start_update(bool fused);
  void finish_update(double* stall);
  void flush_internal();
  void flush_on_every_rank();
  // A bucket's matrices, for a pack or scatter: their gradients, or the parameters.
  void bind_gradients(Bucket& b, const zf_tensor* grads);
  void bind_weights(Bucket& b);
  // Data parallel: while it lives, a host-lane failure waits for the next agreement instead
  // of being raised mid-step (the ranks are inside the step's collectives).
  class ParallelStepScope {
   public:
    explicit ParallelStepScope(Engine& engine) : engine_(engine) { engine_.in_parallel_step_ = engine_.parallel(); }
    ~ParallelStepScope() { engine_.in_parallel_step_ = false; }
    ParallelStepScope(const ParallelStepScope&) = delete;
    ParallelStepScope& operator=(const ParallelStepScope&) = delete;

   private:
    Engine& engine_;
  };
  void window_bookkeeping(bool warm_up, int64_t* due, int64_t* counted);
  void fail_sticky(zf_status status, const std::string& message);
  // Non-finite flags: one slot per parameter (a statistics pass writes the slot of its first).
  size_t flag_count() const { return std::max<size_t>(1, params_.size()); }
  // Data parallel: end_step's agreement, one slot per rank after the flags (share_statistics).
  size_t agreement_slots() const { return parallel() ? static_cast<size_t>(world_) : 0; }
  float* device_float(size_t offset) const { return reinterpret_cast<float*>(arena_.base() + offset); }
  int32_t* device_int(size_t offset) const { return reinterpret_cast<int32_t*>(arena_.base() + offset); }
  // Matrix m's host state in the deferred host layout, [own_deferred(), rows].
  zf_column_state host_state(Matrix& m, bool with_master);
  // A loaded pending host result: matrix m's upload copy from its host master.
  void write_upload_from_master(Matrix& m);
  // parallel.cpp (data parallel; each a no-op on one engine)
  bool parallel() const { return world_ > 1; }
  void set_ownership();
  // The regions data parallel (and release_gradients' deferred lists) add to the layout.
  void parallel_memory();
  // own_selected from `selected` (this rank's columns), then the device lists.
  void upload_selection(Matrix& m);
  static void set_own_selected(Matrix& m);
  // Runs `checks` (argument checks, polling the host lane) and agrees with the other ranks on
  // whether any failed and whether all are in the same call: a local failure is rethrown,
  // another rank's raises naming it, and ranks in different calls all raise (nothing ran).
  // Returns whether another rank is in a split step while this one steps plainly (or the
  // reverse), which agree() counts as the same call.
  bool agree(Agreement call, const std::function<void()>& checks);
  // After an exchange of one slot per rank (call * 4 + 0, 1 refused, 2 sticky): rethrows
  // `local`, else raises if ranks are in different calls or one failed. Returns as agree().
  bool judge_agreement(Agreement call, const std::vector<int32_t>& slots, const std::exception_ptr& local);
  // Splits each bucket into reduction groups (data parallel; the same on every rank).
  void plan_reduction_groups();
  void rebuild_parallel_plans(Bucket& b, const std::vector<zf_dtype>& dtypes);
  // The pack of a bucket's selected columns (skipping its deferred ones): data parallel's
  // all-reduce of them, and release_gradients' compact copy.
  void rebuild_selected_pack(Bucket& b, const std::vector<zf_dtype>& dtypes);
  // In place in the gradients: the dense ones, and a bucket's matrices (whole: every column
  // all-reduced). grads nullptr: this rank adds zeros and keeps nothing (a refused rank that
  // joins the collectives the others run).
  void reduce_gradients(const zf_tensor* grads, bool whole);
  void reduce_dense(const zf_tensor* grads);
  void reduce_bucket(Bucket& b, const zf_tensor* grads, bool whole);
  // One group's pass (selected: its selected columns too, when the bucket's did not fit
  // the scratch at once).
  void reduce_group(Bucket& b, ReductionGroup& g, bool zeros, bool whole, bool selected);
  // In place in `tensors`: the columns `plan` packs (skipping `skip`), `elements` of them,
  // all-reduced through the scratch; zeros (and nothing kept) for a rank without gradients.
  void all_reduce_columns(const PackPlan& plan, zf_tensor* tensors, const int32_t* const* skip, size_t elements,
                          zf_dtype dtype, bool zeros);
  // The matrices' column sums, then the flags, all-reduced. At the end of a split step the
  // flags carry its agreement (one slot per rank after them), judged here: `local` (this
  // rank's refusal, or none) is rethrown, another rank's failure raised.
  void share_statistics(bool end_of_split_step, std::exception_ptr local);
  // The split step's in-backward reductions: buckets in a fixed order every rank follows
  // (the last first: backward's), each on the reduction lane once its matrices are all
  // submitted (reduce_ready_buckets) or at end_step (reduce_remaining_buckets).
  Bucket& bucket_in_reduce_order(size_t n) { return buckets_[buckets_.size() - 1 - n]; }
  void reduce_ready_buckets();
  void reduce_remaining_buckets(bool zeros);
  void reduce_bucket_in_backward(Bucket& b, bool zeros);
  void bucket_statistics(const Bucket& b, const zf_tensor* grads);
  void dense_statistics(const zf_tensor* grads);
  // A rank that refuses the end of its split step still runs the collectives the others run
  // (zeros), then the folded agreement, which raises on every rank.
  [[noreturn]] void end_split_step_refused(const std::exception_ptr& local);
  void step_as_split(const zf_tensor* grads, const double* lrs, size_t lr_count);
  // A split step's bookkeeping of its buckets (the early path's and data parallel's), and its
  // non-finite flags and agreement slots zeroed.
  void start_split_reductions();
  // Whether the next step is a selection step (a peek: the schedule does not move).
  bool next_step_selects() const {
    Schedule peek = schedule_;
    return peek.begin_step().select;
  }
  void drop_split_step();
  void gather_upload(Bucket& b);
  // Sums `array_count` float arrays of `floats_each` and `steps` over the ranks (selection).
  void share_entering_columns(float* const* arrays, size_t array_count, size_t floats_each, int32_t* steps,
                              size_t steps_count);
  void all_reduce(void* data, size_t count, zf_dtype dtype, int64_t* bytes);
  void collective_failed(const char* what, zf_status status);
  double gradient_divisor() const { return loss_scale_ * static_cast<double>(world_); }
  // selection.cpp
  void select_columns();
  void exchange_columns(Matrix& m, const std::vector<int32_t>& new_selected);
  // The host state's deferred columns that stay deferred from `old_own_selected` to
  // m.own_selected, moved to their places in the new deferred layout (the columns that
  // enter the selection were gathered from it first; those that leave it are scattered
  // into it next).
  void relayout_deferred(Matrix& m, const std::vector<int32_t>& old_own_selected);
  void rebuild_plans();

  zf_engine_config config_;
  EnginePart part_;
  Schedule::StepKind step_kind_{};  // of the step between step_update and step_close
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
  size_t staging_offset_ = 0, slot_bytes_ = 0, upload_buffer_offset_ = 0, device_state_bytes_ = 0, col_sq_offset_ = 0,
         col_sq_floats_ = 0, matrix_col_floats_ = 0, scalars_offset_ = 0, stats_workspace_offset_ = 0,
         stats_workspace_bytes_ = 0, selected_offset_ = 0, selected_bytes_ = 0, flags_offset_ = 0,
         total_sink_offset_ = 0, chunk_sums_offset_ = 0, scalar_ring_offset_ = 0, partials_offset_ = 0,
         closing_header_offset_ = 0;
  DeviceArena arena_;  // every device region below lives in its one block
  bool initialized_ = false;

  // host buffers: the ones a copy lane touches are pinned
  // The upload copies U[0] and, where a closing step can find the last result still owed,
  // U[1] (upload_copies_), upload_stride_ bytes apart, then (CUDA) the closing steps'
  // headers, one per copy, at closing_header_at_.
  PinnedBuffer upload_;
  size_t upload_bytes_ = 0, upload_stride_ = 0, closing_header_at_ = 0;
  int upload_copies_ = 1;
  uint8_t* upload_copy(int buffer) const { return upload_.data() + static_cast<size_t>(buffer) * upload_stride_; }
  ScalarReadback scalar_readback_;  // the step scalars on their way to the host
  std::vector<float> col_sq_host_;  // host copy of the col_sq region (CUDA)
  Event last_scatter_;              // the upload buffer is free once it completes
  // The staging ring (staging_ring.hpp): staging_slots device slots, and as many host slots
  // or (release_gradients) one per bucket, so that every bucket of a step can be consumed
  // during backward while the device keeps staging_slots.
  StagingRing ring_;
  // The open window (its accumulator, steps, its update's values) and the closed window's
  // update in flight (host_window.hpp).
  HostWindow window_;

  // per-step scratch (kept for capacity)
  std::unique_ptr<ColumnStatsPlan> stats_plan_;
  std::vector<zf_tensor> col_sq_tensors_;  // per parameter, in the device col_sq region
  std::unique_ptr<AdamwSelectedPlan> device_plan_;
  std::vector<size_t> device_plan_params_;
  std::vector<AdamwSelectedPointers> device_pointers_;
  std::vector<double> step_lrs_;

  // split form. A split step that is not a selection step starts its work at submit: the
  // statistics of each submitted range, and the pack and copy down of each bucket whose
  // matrices are all submitted (at most ring_.host_slots() buckets: a host slot is not reused
  // within the step before end_step). Their host accumulates are queued by end_step, after the
  // slots' headers (the step's scale is known only then); abort_step drops them.
  bool early_ = false;
  // This step closes its window and packs into U (closing_step_into_upload); the header's
  // copy down, which the fused update waits for (CUDA).
  bool closing_into_upload_ = false;
  bool fuse_window_close_ = true;
  Event closing_copied_;
  std::vector<size_t> bucket_pending_;  // per bucket: matrices not submitted yet
  std::vector<uint8_t> bucket_early_;   // per bucket: packed and copied at submit
  std::vector<size_t> early_buckets_;   // those buckets, in the order they went
  std::map<std::pair<size_t, size_t>, std::unique_ptr<ColumnStatsPlan>> range_plans_;
  bool in_split_step_ = false;
  std::vector<zf_tensor> submitted_;
  std::vector<uint8_t> submitted_flags_;
  std::vector<double> split_lrs_;
  bool split_has_lrs_ = false;
  // release_gradients: per bucket, released in this split step; the releases take_released
  // has not reported yet (each with the event after the bucket's last read of its gradients
  // on the reduction lane, data parallel; nullptr when read on the compute lane);
  // the caller's gradient bytes held now (submitted, not released) and the most ever.
  struct Release {
    size_t bucket;
    Event read;
  };
  std::vector<uint8_t> bucket_released_;
  std::vector<Release> releases_pending_;
  int64_t held_gradient_bytes_ = 0, held_gradient_bytes_peak_ = 0;

  // An upper bound on every Adam step count of this engine (each column's, on either side,
  // and each dense parameter's): the largest count loaded (0 when fresh) plus the steps taken
  // since. A count grows by at most one per step that is not skipped (on the device at the
  // step, on the host at most once per window of at least one step), so while this stays below
  // INT32_MAX no int32 count can pass it; the engine refuses the step that would (CUDA counts
  // are never read back to check them one by one).
  int64_t step_count_bound_ = 0;

  // loss scaling and faults
  double loss_scale_ = 1.0;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_count_ = 0;  // overflows the hysteresis absorbed (ZF_COUNTER_HYSTERESIS)
  bool sticky_ = false;
  zf_status sticky_status_ = ZF_SUCCESS;
  std::string sticky_message_;

  // data parallel
  zf_engine_collectives comm_{};
  int world_ = 1, rank_ = 0;
  bool in_parallel_step_ = false;  // mid-step: a host-lane failure waits for the next agreement
  // Data parallel: the first refusal of submit (or a late gradient), raised at end_step's
  // agreement (on every rank) instead of on this rank alone, which would leave the others
  // waiting there.
  std::exception_ptr deferred_split_error_;
  // Data parallel split step: its buckets are reduced as they fill (reduce_ready_buckets);
  // split_select_: it is a selection step (every column all-reduced); buckets_reduced_: how
  // many, in bucket_in_reduce_order; bucket_reduced_: per bucket (a late gradient there is
  // refused).
  bool split_select_ = false;
  size_t buckets_reduced_ = 0;
  std::vector<uint8_t> bucket_reduced_;
  size_t reduce_offset_ = 0, reduce_bytes_ = 0, shard_offset_ = 0, shard_bytes_ = 0, health_offset_ = 0,
         exchange_offset_ = 0, exchange_bytes_ = 0, lists_offset_ = 0;
  int64_t collective_stats_bytes_ = 0, collective_gradient_bytes_ = 0, collective_upload_bytes_ = 0;

  // stats
  int64_t windows_ = 0, reselections_ = 0, skipped_steps_ = 0, bytes_down_ = 0, bytes_up_ = 0;
  double last_norm_ = 0.0, stall_close_ = 0.0, stall_back_pressure_ = 0.0, stall_flush_ = 0.0, stall_readback_ = 0.0;
  // The host lane's traffic (zf_engine_stats): added by its jobs, read by stats().
  std::atomic<int64_t> host_bytes_read_{0}, host_bytes_written_{0};
  // This rank's deferred elements (rebuild_plans): the size of the host lane's passes, which
  // run bucket by bucket and matrix by matrix, for their choice of stores (pass_elements).
  int64_t host_deferred_elements_ = 0;
};

}  // namespace zf
