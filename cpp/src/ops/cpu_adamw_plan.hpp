// The host optimizer (zenflow/cpu_adamw.h) as plans: what a call's structure decides --
// shapes, dtypes, the selected columns, hence the packed layout and the runs of unselected
// columns -- is validated and laid out once by build(); run() then takes fresh data
// pointers and the per-step values (lr, weight decay, gradient scale, flags) and does the
// work, with no validation, no string and no allocation beyond the plan's own vectors
// (which keep their capacity from run to run).
//
// The C entry points build a plan and run it once. The engine builds one per selection and
// runs it every step of the window (docs/design.md section 2, steps 4 to 6): it checks the
// per-step values itself, with the check_* functions below, whenever they change.
//
// Work split. A call's work is a list of contiguous pieces (one per tensor, or one per run
// of unselected columns sharing a step count), concatenated and cut into one contiguous
// range per pool thread, at multiples of 16 elements. Every element's result is the same
// wherever the cuts fall (simd/kernels_adam_impl.hpp), so results do not depend on the
// thread count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/adam_math.hpp"
#include "common/packed_layout.hpp"
#include "common/thread_pool.hpp"
#include "zenflow/cpu_adamw.h"

namespace zf {

// ---- per-step values: checked by the caller of run() ----

// beta1, beta2 in [0, 1), eps >= 0, all finite; a known mode.
void check_adam_hparams(const zf_adam_hparams* hparams);
// `count` learning rates and weight decays, finite and >= 0 (arrays non-NULL when count > 0).
void check_lr_and_weight_decay(const double* lr, const double* weight_decay, size_t count);
// A finite scale (grad_scale, the accumulate scale).
void check_scale(float scale, const char* name);
// Only bits of `allowed`.
void check_flags(uint32_t flags, uint32_t allowed);

// ---- the work split ----

// Below this many elements a call runs on the calling thread: waking the pool costs more
// than a second thread saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// One contiguous stretch of work: `length` elements of matrix (or tensor) `matrix`.
struct Piece {
  int64_t work_begin;  // position in the concatenated work
  int64_t length;
  size_t matrix;
  int64_t state_offset;  // element offset into the state (param, moments, accumulator)
  int64_t grad_offset;   // into the gradient (the matrix's own, or the packed buffer)
  int64_t out_offset;    // into the output (the matrix's own, or the packed buffer)
  int32_t scalars;       // index into the run's StepScalarTable (steps only)
};

class PieceList {
 public:
  void clear() {
    pieces_.clear();
    total_ = 0;
  }
  void reserve(size_t count) { pieces_.reserve(count); }
  void add(size_t matrix, int64_t state_offset, int64_t grad_offset, int64_t out_offset, int64_t length,
           int32_t scalars) {
    if (length == 0) return;
    pieces_.push_back(Piece{total_, length, matrix, state_offset, grad_offset, out_offset, scalars});
    total_ += length;
  }
  int64_t total() const { return total_; }

  // Runs body(piece, offset_in_piece, count) over all the work: on the caller for a small
  // call or a one-thread pool, else one contiguous range per thread of `pool`.
  template <class Body>
  void run(ThreadPool& pool, const Body& body) const {
    if (total_ == 0) return;
    if (total_ < kParallelMinElements || pool.size() == 1) {
      run_range(0, total_, body);
      return;
    }
    // Cuts at multiples of a cache line of fp32 elements: no two threads write one line.
    constexpr int64_t kGranule = 16;
    const int64_t granules = (total_ + kGranule - 1) / kGranule;
    pool.run([&](int thread, int threads) {
      int64_t first, last;
      split_range(0, granules, thread, threads, &first, &last);
      run_range(first * kGranule, std::min(total_, last * kGranule), body);
    });
  }

 private:
  template <class Body>
  void run_range(int64_t begin, int64_t end, const Body& body) const {
    if (begin >= end) return;
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), begin,
                               [](int64_t position, const Piece& p) { return position < p.work_begin; });
    for (--it; it != pieces_.end() && it->work_begin < end; ++it) {
      const int64_t lo = std::max(begin, it->work_begin);
      const int64_t hi = std::min(end, it->work_begin + it->length);
      body(*it, lo - it->work_begin, hi - lo);
    }
  }

  std::vector<Piece> pieces_;
  int64_t total_ = 0;
};

// The step scalars (adam_math.hpp) of every distinct (lr, weight decay, step) of a run,
// each computed once: an open-addressing table whose storage is kept across runs.
class StepScalarTable {
 public:
  // Forgets every entry and sets the hyper-parameters that all entries share (span:
  // AdamHyperParams::span).
  void reset(const zf_adam_hparams& hparams, int32_t span = 1);
  // Index of the scalars of (lr, weight_decay, step), computed on first use.
  int32_t index_of(double lr, double weight_decay, int64_t step);
  const AdamStepScalars& operator[](int32_t index) const { return scalars_[static_cast<size_t>(index)]; }

 private:
  // Values by bit pattern: -0.0 and 0.0 are separate keys, each with its own scalars.
  struct Key {
    uint64_t lr_bits;
    uint64_t weight_decay_bits;
    int64_t step;
    bool operator==(const Key& o) const {
      return lr_bits == o.lr_bits && weight_decay_bits == o.weight_decay_bits && step == o.step;
    }
  };
  static size_t hash(const Key& key);
  void grow();

  zf_adam_hparams hparams_{};
  int32_t span_ = 1;
  std::vector<Key> keys_;
  std::vector<AdamStepScalars> scalars_;
  std::vector<int32_t> slots_;  // power-of-two size, -1 for empty, at most half full
  Key last_key_{};
  int32_t last_index_ = -1;  // consecutive pieces mostly share a key
};

// The per-step values of both step plans.
struct AdamRunValues {
  const double* lr;            // [count], per tensor or matrix
  const double* weight_decay;  // [count]
  zf_adam_hparams hparams;
  float grad_scale;
  uint32_t flags;  // ZF_CPU_ADAMW_ZERO_GRAD, ZF_CPU_ADAMW_INCREMENT_STEPS (column step only)
  // A fused column step (ColumnStepPointers::fuse_accumulate): the packed gradient's own scale
  // in the accumulate (the window's last step's gradient scale); grad_scale then applies to
  // the sum.
  float accumulate_scale = 1.0f;
  // The training steps the update stands for (AdamHyperParams::span; column step only, with
  // ZF_CPU_ADAMW_INCREMENT_STEPS, which then advances each count by it).
  int32_t step_span = 1;
  // The elements of the whole pass this run is one part of (the engine's window update runs
  // one per matrix), or 0 for this run's own: whether a 16-bit output copy bypasses the
  // cache depends on the pass, not on the part.
  int64_t pass_elements = 0;
};

// ---- zf_cpu_adamw_step: whole tensors ----

// Data of one dense step: arrays of `count` descriptors of which run() reads only `data`.
struct AdamwStepPointers {
  const zf_tensor* params;
  const zf_tensor* exp_avgs;
  const zf_tensor* exp_avg_sqs;
  const zf_tensor* grads;
  const zf_tensor* out_params;  // nullptr unless the plan was built with out_params
};

class AdamwStepPlan {
 public:
  // Validates the structure of `count` tensors (CPU, contiguous, aligned; params, exp_avgs,
  // exp_avg_sqs f32; grads and out_params f32, bf16 or f16; equal element counts) and lays
  // out the work. Throws zf::Error naming the argument. out_params may be nullptr.
  void build(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs, const zf_tensor* grads,
             const zf_tensor* out_params, size_t count);
  size_t count() const { return tensors_.size(); }
  bool has_out_params() const { return has_out_params_; }

  // One step of every tensor. Requires tensors of the built shapes and dtypes, steps[i] >= 1,
  // values checked (check_adam_hparams, check_lr_and_weight_decay, check_scale, flags 0 or
  // ZF_CPU_ADAMW_ZERO_GRAD) and no buffer overlapping another.
  void run(ThreadPool& pool, const AdamwStepPointers& pointers, const int64_t* steps, const AdamRunValues& values);

 private:
  struct Tensor {
    int64_t elements;
    zf_dtype grad_dtype;
    zf_dtype out_dtype;
  };
  std::vector<Tensor> tensors_;
  bool has_out_params_ = false;
  PieceList pieces_;  // rebuilt by each run with that run's scalars
  StepScalarTable scalars_;
};

// ---- zf_cpu_adamw_step_flat: whole tensors, state in flat buffers ----

// Data of one flat-state step; run() reads only the descriptors' `data`.
struct AdamwFlatStepPointers {
  const zf_tensor* params;      // [count] fp32 weights updated in place, or nullptr (master given)
  float* master;                // the flat fp32 masters, or nullptr (params given)
  float* exp_avg;               // flat m
  float* exp_avg_sq;            // flat v
  const zf_tensor* grads;       // [count]
  const zf_tensor* out_params;  // [count], or nullptr unless the plan was built with out_params
};

class AdamwFlatStepPlan {
 public:
  // Validates the structure (zf_cpu_adamw_step_flat's rules: exactly one of params and
  // master; f32 flat buffers of one size; offsets ascending, in range, not overlapping;
  // per-tensor descriptors as AdamwStepPlan) and lays out the work. Throws zf::Error.
  void build(const zf_tensor* params, const zf_tensor* master, const zf_tensor* exp_avg, const zf_tensor* exp_avg_sq,
             const int64_t* offsets, const int64_t* sizes, const zf_tensor* grads, const zf_tensor* out_params,
             size_t count);
  size_t count() const { return tensors_.size(); }

  // One step of every tensor; the same requirements as AdamwStepPlan::run.
  void run(ThreadPool& pool, const AdamwFlatStepPointers& pointers, const int64_t* steps, const AdamRunValues& values);

 private:
  struct Tensor {
    int64_t elements;
    int64_t offset;  // into the flat state buffers
    zf_dtype grad_dtype;
    zf_dtype out_dtype;
  };
  std::vector<Tensor> tensors_;
  bool has_out_params_ = false;
  bool flat_master_ = false;
  PieceList pieces_;
  StepScalarTable scalars_;
};

// ---- zf_cpu_adamw_step_skip_columns: the unselected columns of host-layout matrices ----

// Data of one column step; run() reads only the descriptors' `data`.
struct ColumnStepPointers {
  const zf_column_state* state;  // [count]: master, exp_avg, exp_avg_sq, steps
  const zf_tensor* grads;        // [count] host-layout gradients, or nullptr for a packed-gradient plan
  void* packed_grads;            // the packed gradient, or nullptr for a host-layout-gradient plan
  void* packed_out;              // the packed output copy, or nullptr when the plan has none
  // The window's last accumulate fused into its update (the engine; packed-gradient plans
  // only): the gradient of an element is fma(packed, values.accumulate_scale, accumulator),
  // with accumulators[i] matrix i's accumulator (fp32, the host layout, as the state; read
  // only) or nullptr for +0.0f, and then times values.grad_scale: the bits of the accumulate
  // storing it and a plain step reading it. packed_grads may be packed_out itself.
  bool fuse_accumulate = false;
  const float* const* accumulators = nullptr;
};

class ColumnStepPlan {
 public:
  // Validates the structure of a call -- state[i] in the host layout (CPU, f32 exp_avg 2-D
  // [n_i, m_i], master and exp_avg_sq with n_i * m_i elements, master present unless empty,
  // steps i32 [n_i]), selected (check_selected; nullptr for none), exactly one gradient form
  // (grads[i] f32/bf16/f16 with n_i * m_i elements, or packed_grads 1-D f32/bf16/f16 of the
  // packed size), packed_out (nullptr, or as packed_grads) -- and lays out the runs of
  // unselected columns. Reads the selected indices; keeps no pointer. Throws zf::Error.
  void build(const zf_column_state* state, const zf_tensor* selected, size_t count, const zf_tensor* grads,
             const zf_tensor* packed_grads, const zf_tensor* packed_out);
  size_t count() const { return layout_.size(); }
  const PackedLayout& layout() const { return layout_; }
  bool packed_grads() const { return packed_grads_; }
  bool has_packed_out() const { return has_packed_out_; }

  // Checks the counts that a run with `flags` reads, those of the unselected columns: >= 1,
  // or with ZF_CPU_ADAMW_INCREMENT_STEPS in [0, INT32_MAX). Throws zf::Error.
  void check_step_counts(const zf_column_state* state, uint32_t flags) const;

  // One step of the unselected columns. Requires data of the built shapes and dtypes, step
  // counts accepted by check_step_counts, values checked as for AdamwStepPlan::run (flags
  // may add ZF_CPU_ADAMW_INCREMENT_STEPS) and no buffer overlapping another (but a fused
  // step's packed gradient and output, which may be one).
  void run(ThreadPool& pool, const ColumnStepPointers& pointers, const AdamRunValues& values);

 private:
  // A maximal run of unselected columns of one matrix.
  struct ColumnRun {
    size_t matrix;
    int64_t first_column;
    int64_t columns;
    int64_t packed_column;  // position of first_column among the matrix's unselected columns
  };
  PackedLayout layout_;
  std::vector<ColumnRun> runs_;
  std::vector<zf_dtype> grad_dtypes_;  // per matrix (all the packed dtype for a packed gradient)
  bool packed_grads_ = false;
  bool has_packed_out_ = false;
  zf_dtype packed_out_dtype_ = ZF_DTYPE_F32;
  PieceList pieces_;  // rebuilt by each run: runs_ cut where the step count changes
  StepScalarTable scalars_;
};

// ---- zf_cpu_accumulate ----

class AccumulatePlan {
 public:
  // Validates `count` accumulators (CPU f32, contiguous; host layout [n_i, m_i] with
  // selected, any shape without), selected (check_selected, or nullptr) and the packed
  // buffer (1-D f32/bf16/f16 of the packed size), and lays out the work. Throws zf::Error.
  void build(const zf_tensor* accumulators, const zf_tensor* selected, size_t count, const zf_tensor* packed);
  size_t count() const { return layout_.size(); }
  const PackedLayout& layout() const { return layout_; }

  // accumulators += scale * packed on the unselected columns. Requires accumulators of the
  // built shapes (only their `data` is read), a packed buffer of the built dtype and size,
  // a finite scale and no overlap. overwrite (nullptr: none): per matrix, nonzero where
  // its accumulator is to be written as if it were zero, not read (a window's first step).
  // pass_elements: as AdamRunValues::pass_elements (the engine accumulates bucket by bucket).
  void run(ThreadPool& pool, const zf_tensor* accumulators, const void* packed, float scale,
           const uint8_t* overwrite = nullptr, int64_t pass_elements = 0) const;

 private:
  PackedLayout layout_;
  zf_dtype packed_dtype_ = ZF_DTYPE_F32;
  PieceList pieces_;  // fixed by the selection: state_offset into the accumulator, grad_offset into packed
};

}  // namespace zf
