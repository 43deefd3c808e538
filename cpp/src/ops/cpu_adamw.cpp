// The host optimizer (zenflow/cpu_adamw.h): the plans of cpu_adamw_plan.hpp (validation
// and layout once, then runs of the SIMD kernels over contiguous pieces) and the C entry
// points, each of which validates the whole call, builds a plan and runs it once on the
// process-wide pool. Nothing is written before every check has passed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/adam_math.hpp"
#include "common/column_checks.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "ops/cpu_adamw_plan.hpp"
#include "simd/kernels.hpp"
#include "zenflow/cpu_adamw.h"

namespace zf {
namespace {

// From this many elements of a pass on, a bf16/f16 output copy is written with non-temporal
// stores: it no longer fits in cache, and is next read by the upload, not by this core. A
// window's first accumulate (write-only) streams its accumulators from the same size on.
// Decided by the whole pass (AdamRunValues::pass_elements): the engine's window update runs
// matrix by matrix, and with the decision per matrix the upload copy of matrices under 4M
// deferred elements took normal stores (a read for ownership of every line), 5-10% of the
// update's time at 40 x [1024, 2048].
constexpr int64_t kStreamOutMinElements = int64_t{1} << 22;

// What every piece of a step over `elements` elements shares, decided once per run: whether
// the gradient is zeroed, the gradient scale, and the output's stores (above).
simd::AdamStepArgs shared_step_args(int64_t elements, const AdamRunValues& values) {
  simd::AdamStepArgs args{};
  args.zero_grad = (values.flags & ZF_CPU_ADAMW_ZERO_GRAD) != 0;
  args.stream_out = std::max(elements, values.pass_elements) >= kStreamOutMinElements;
  args.grad_scale = values.grad_scale;
  return args;
}

// Bytes per element of the float dtypes the kernels take (f32, bf16, f16).
inline int64_t float_dtype_size(zf_dtype dtype) { return dtype == ZF_DTYPE_F32 ? 4 : 2; }

inline void* element_pointer(void* base, zf_dtype dtype, int64_t element) {
  return static_cast<char*>(base) + element * float_dtype_size(dtype);
}

inline const void* element_pointer(const void* base, zf_dtype dtype, int64_t element) {
  return static_cast<const char*>(base) + element * float_dtype_size(dtype);
}

// A CPU tensor of one of `dtypes`, contiguous (and, by check_descriptor, aligned).
// The layouts of docs/design.md section 4, as the layout checks name them.
constexpr const char* kHostLayout = "the host layout (column-major: W [m, n] transposed)";
constexpr const char* kListLayout = "the packed host list layout (one run of m values per column)";

void check_host_tensor(const zf_tensor* t, const ArgName& name, std::initializer_list<zf_dtype> dtypes) {
  check_descriptor(t, name);
  check_cpu(*t, name);
  check_dtype(*t, name, dtypes);
  check_contiguous(*t, name);
}

// A packed buffer: 1-D f32/bf16/f16 on the CPU, of exactly the layout's size.
void check_packed(const zf_tensor* t, const ArgName& name, const PackedLayout& layout) {
  check_host_tensor(t, name, {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
  check_ndim(*t, name, 1);
  require(t->shape[0] == layout.total(), ZF_ERROR_INVALID_VALUE, name, ": has ", t->shape[0],
          " elements; the packed unselected columns of the matrices take ", layout.total());
}

// Calls visit(begin, end, packed_column) for every maximal run [begin, end) of the columns
// of [0, cols) that are not in `selected` (k ascending indices; nullptr when k == 0), in
// order; packed_column is the position of `begin` among the unselected columns.
template <class Visit>
void for_each_unselected_run(const int32_t* selected, int64_t k, int64_t cols, const Visit& visit) {
  int64_t begin = 0, packed_column = 0;
  for (int64_t s = 0; s <= k; ++s) {
    const int64_t end = s < k ? static_cast<int64_t>(selected[s]) : cols;
    if (end > begin) {
      visit(begin, end, packed_column);
      packed_column += end - begin;
    }
    begin = end + 1;
  }
}

}  // namespace

// ---- per-step values ----

void check_adam_hparams(const zf_adam_hparams* h) {
  require(h != nullptr, ZF_ERROR_INVALID_VALUE, "hparams: is NULL");
  require(std::isfinite(h->beta1) && h->beta1 >= 0.0 && h->beta1 < 1.0, ZF_ERROR_INVALID_VALUE,
          "hparams.beta1: must be in [0, 1), got ", h->beta1);
  require(std::isfinite(h->beta2) && h->beta2 >= 0.0 && h->beta2 < 1.0, ZF_ERROR_INVALID_VALUE,
          "hparams.beta2: must be in [0, 1), got ", h->beta2);
  require(std::isfinite(h->eps) && h->eps >= 0.0, ZF_ERROR_INVALID_VALUE, "hparams.eps: must be finite and >= 0, got ",
          h->eps);
  // Read as the integer a C caller stored: loading an out-of-range value as a zf_adam_mode
  // would be undefined behaviour.
  static_assert(sizeof(h->mode) == sizeof(int), "zf_adam_mode is stored as an int");
  int mode;
  std::memcpy(&mode, &h->mode, sizeof(mode));
  require(mode == ZF_ADAM_MODE_ADAMW || mode == ZF_ADAM_MODE_ADAM, ZF_ERROR_INVALID_VALUE,
          "hparams.mode: unknown mode ", mode);
}

void check_lr_and_weight_decay(const double* lr, const double* weight_decay, size_t count) {
  require(count == 0 || lr != nullptr, ZF_ERROR_INVALID_VALUE, "lr: NULL array with count=", count);
  require(count == 0 || weight_decay != nullptr, ZF_ERROR_INVALID_VALUE, "weight_decay: NULL array with count=", count);
  for (size_t i = 0; i < count; ++i) {
    require(std::isfinite(lr[i]) && lr[i] >= 0.0, ZF_ERROR_INVALID_VALUE, "lr[", i, "]: must be finite and >= 0, got ",
            lr[i]);
    require(std::isfinite(weight_decay[i]) && weight_decay[i] >= 0.0, ZF_ERROR_INVALID_VALUE, "weight_decay[", i,
            "]: must be finite and >= 0, got ", weight_decay[i]);
  }
}

void check_scale(float scale, const char* name) {
  require(std::isfinite(scale), ZF_ERROR_INVALID_VALUE, name, ": must be finite, got ", scale);
}

void check_flags(uint32_t flags, uint32_t allowed) {
  require((flags & ~allowed) == 0, ZF_ERROR_INVALID_VALUE, "flags: unknown or unsupported bits ", flags & ~allowed);
}

// ---- StepScalarTable ----

void StepScalarTable::reset(const zf_adam_hparams& hparams, int32_t span) {
  hparams_ = hparams;
  span_ = span;
  keys_.clear();
  scalars_.clear();
  std::fill(slots_.begin(), slots_.end(), -1);
  last_index_ = -1;
}

size_t StepScalarTable::hash(const Key& key) {
  // The splitmix64 finaliser over the three words: every input bit reaches the low bits
  // the slot mask keeps.
  uint64_t h = key.lr_bits;
  h = ((h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull) ^ key.weight_decay_bits;
  h = ((h ^ (h >> 27)) * 0x94d049bb133111ebull) ^ static_cast<uint64_t>(key.step);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return static_cast<size_t>(h ^ (h >> 31));
}

void StepScalarTable::grow() {
  slots_.assign(std::max<size_t>(16, slots_.size() * 2), -1);
  const size_t mask = slots_.size() - 1;
  for (size_t index = 0; index < keys_.size(); ++index) {
    size_t slot = hash(keys_[index]) & mask;
    while (slots_[slot] >= 0) slot = (slot + 1) & mask;
    slots_[slot] = static_cast<int32_t>(index);
  }
}

int32_t StepScalarTable::index_of(double lr, double weight_decay, int64_t step) {
  Key key{0, 0, step};
  std::memcpy(&key.lr_bits, &lr, sizeof(lr));
  std::memcpy(&key.weight_decay_bits, &weight_decay, sizeof(weight_decay));
  if (last_index_ >= 0 && key == last_key_) return last_index_;
  if ((keys_.size() + 1) * 2 > slots_.size()) grow();
  const size_t mask = slots_.size() - 1;
  size_t slot = hash(key) & mask;
  while (slots_[slot] >= 0 && !(keys_[static_cast<size_t>(slots_[slot])] == key)) slot = (slot + 1) & mask;
  if (slots_[slot] < 0) {
    slots_[slot] = static_cast<int32_t>(keys_.size());
    keys_.push_back(key);
    AdamHyperParams hyper;
    hyper.lr = lr;
    hyper.beta1 = hparams_.beta1;
    hyper.beta2 = hparams_.beta2;
    hyper.eps = hparams_.eps;
    hyper.weight_decay = weight_decay;
    hyper.decoupled = hparams_.mode == ZF_ADAM_MODE_ADAMW;
    hyper.span = span_;
    scalars_.push_back(adam_step_scalars(hyper, step));
  }
  last_key_ = key;
  last_index_ = slots_[slot];
  return last_index_;
}

namespace {

// A piece's kernel arguments for the per-tensor steps (AdamwStepPlan, AdamwFlatStepPlan),
// `offset` elements into tensor i: everything but the state pointers, where they differ.
simd::AdamStepArgs tensor_piece_args(const simd::AdamStepArgs& shared, const zf_tensor& grad, const zf_tensor* out,
                                     zf_dtype grad_dtype, zf_dtype out_dtype, int64_t offset,
                                     const AdamStepScalars& scalars) {
  simd::AdamStepArgs args = shared;
  args.grad = element_pointer(grad.data, grad_dtype, offset);
  args.grad_dtype = grad_dtype;
  args.out = out != nullptr ? element_pointer(out->data, out_dtype, offset) : nullptr;
  args.out_dtype = out_dtype;
  args.scalars = scalars;
  return args;
}

}  // namespace

// ---- AdamwStepPlan ----

void AdamwStepPlan::build(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs,
                          const zf_tensor* grads, const zf_tensor* out_params, size_t count) {
  require(count == 0 || (params != nullptr && exp_avgs != nullptr && exp_avg_sqs != nullptr && grads != nullptr),
          ZF_ERROR_INVALID_VALUE, "params/exp_avgs/exp_avg_sqs/grads: NULL array with count=", count);
  std::vector<Tensor> tensors;
  tensors.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    check_host_tensor(&params[i], ArgName("params", i), {ZF_DTYPE_F32});
    const int64_t elements = numel(params[i]);
    check_host_tensor(&exp_avgs[i], ArgName("exp_avgs", i), {ZF_DTYPE_F32});
    check_numel(exp_avgs[i], ArgName("exp_avgs", i), elements);
    check_same_layout(exp_avgs[i], ArgName("exp_avgs", i), params[i], ArgName("params", i));
    check_host_tensor(&exp_avg_sqs[i], ArgName("exp_avg_sqs", i), {ZF_DTYPE_F32});
    check_numel(exp_avg_sqs[i], ArgName("exp_avg_sqs", i), elements);
    check_same_layout(exp_avg_sqs[i], ArgName("exp_avg_sqs", i), params[i], ArgName("params", i));
    check_host_tensor(&grads[i], ArgName("grads", i), {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
    check_numel(grads[i], ArgName("grads", i), elements);
    check_same_layout(grads[i], ArgName("grads", i), params[i], ArgName("params", i));
    zf_dtype out_dtype = ZF_DTYPE_F32;
    if (out_params != nullptr) {
      check_host_tensor(&out_params[i], ArgName("out_params", i), {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
      check_numel(out_params[i], ArgName("out_params", i), elements);
      check_same_layout(out_params[i], ArgName("out_params", i), params[i], ArgName("params", i));
      out_dtype = out_params[i].dtype;
    }
    tensors.push_back(Tensor{elements, grads[i].dtype, out_dtype});
  }
  tensors_ = std::move(tensors);
  has_out_params_ = out_params != nullptr;
  pieces_.clear();
  pieces_.reserve(count);
}

void AdamwStepPlan::run(ThreadPool& pool, const AdamwStepPointers& pointers, const int64_t* steps,
                        const AdamRunValues& values) {
  scalars_.reset(values.hparams);
  pieces_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    pieces_.add(i, 0, 0, 0, tensors_[i].elements, scalars_.index_of(values.lr[i], values.weight_decay[i], steps[i]));
  }
  const simd::KernelTable& kernels = simd::active_kernels();
  const simd::AdamStepArgs shared = shared_step_args(pieces_.total(), values);
  pieces_.run(pool, [&](const Piece& piece, int64_t offset, int64_t length) {
    const size_t i = piece.matrix;
    const Tensor& tensor = tensors_[i];
    simd::AdamStepArgs args =
        tensor_piece_args(shared, pointers.grads[i], has_out_params_ ? &pointers.out_params[i] : nullptr,
                          tensor.grad_dtype, tensor.out_dtype, offset, scalars_[piece.scalars]);
    args.param = static_cast<float*>(pointers.params[i].data) + offset;
    args.exp_avg = static_cast<float*>(pointers.exp_avgs[i].data) + offset;
    args.exp_avg_sq = static_cast<float*>(pointers.exp_avg_sqs[i].data) + offset;
    kernels.adam_step(args, length);
  });
}

// ---- AdamwFlatStepPlan ----

void AdamwFlatStepPlan::build(const zf_tensor* params, const zf_tensor* master, const zf_tensor* exp_avg,
                              const zf_tensor* exp_avg_sq, const int64_t* offsets, const int64_t* sizes,
                              const zf_tensor* grads, const zf_tensor* out_params, size_t count) {
  require(exp_avg != nullptr && exp_avg_sq != nullptr, ZF_ERROR_INVALID_VALUE, "exp_avg/exp_avg_sq: NULL");
  require(count == 0 || (grads != nullptr && offsets != nullptr && sizes != nullptr), ZF_ERROR_INVALID_VALUE,
          "grads/offsets/sizes: NULL array with count=", count);
  require(params == nullptr || master == nullptr, ZF_ERROR_INVALID_VALUE,
          "params/master: give one of them (per-tensor fp32 weights or the flat fp32 masters), not both");
  require(count == 0 || params != nullptr || master != nullptr, ZF_ERROR_INVALID_VALUE,
          "params/master: one must be given (per-tensor fp32 weights or the flat fp32 masters) with count=", count);
  check_host_tensor(exp_avg, "exp_avg", {ZF_DTYPE_F32});
  const int64_t state_elements = numel(*exp_avg);
  check_host_tensor(exp_avg_sq, "exp_avg_sq", {ZF_DTYPE_F32});
  check_numel(*exp_avg_sq, "exp_avg_sq", state_elements);
  if (master != nullptr) {
    check_host_tensor(master, "master", {ZF_DTYPE_F32});
    check_numel(*master, "master", state_elements);
  }
  std::vector<Tensor> tensors;
  tensors.reserve(count);
  int64_t state_end = 0;  // end of the previous tensor's run
  for (size_t i = 0; i < count; ++i) {
    const int64_t elements = sizes[i];
    const int64_t offset = offsets[i];
    require(elements >= 0, ZF_ERROR_INVALID_VALUE, "sizes[", i, "]: must be >= 0, got ", elements);
    require(offset >= state_end, ZF_ERROR_INVALID_VALUE, "offsets[", i, "]: ", offset,
            " is below the end of the previous tensor's state (", state_end,
            "); offsets must ascend without overlapping runs");
    require(offset <= state_elements - elements, ZF_ERROR_INVALID_VALUE, "offsets[", i, "]: the run of sizes[", i,
            "] = ", elements, " elements from ", offset, " ends past the state buffers' ", state_elements, " elements");
    state_end = offset + elements;
    check_host_tensor(&grads[i], ArgName("grads", i), {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
    check_numel(grads[i], ArgName("grads", i), elements);
    if (params != nullptr) {
      check_host_tensor(&params[i], ArgName("params", i), {ZF_DTYPE_F32});
      check_numel(params[i], ArgName("params", i), elements);
      check_same_layout(grads[i], ArgName("grads", i), params[i], ArgName("params", i));
    }
    zf_dtype out_dtype = ZF_DTYPE_F32;
    if (out_params != nullptr) {
      check_host_tensor(&out_params[i], ArgName("out_params", i), {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
      check_numel(out_params[i], ArgName("out_params", i), elements);
      check_same_layout(out_params[i], ArgName("out_params", i), grads[i], ArgName("grads", i));
      out_dtype = out_params[i].dtype;
    }
    tensors.push_back(Tensor{elements, offset, grads[i].dtype, out_dtype});
  }
  tensors_ = std::move(tensors);
  has_out_params_ = out_params != nullptr;
  flat_master_ = master != nullptr;
  pieces_.clear();
  pieces_.reserve(count);
}

void AdamwFlatStepPlan::run(ThreadPool& pool, const AdamwFlatStepPointers& pointers, const int64_t* steps,
                            const AdamRunValues& values) {
  scalars_.reset(values.hparams);
  pieces_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    pieces_.add(i, tensors_[i].offset, 0, 0, tensors_[i].elements,
                scalars_.index_of(values.lr[i], values.weight_decay[i], steps[i]));
  }
  const simd::KernelTable& kernels = simd::active_kernels();
  const simd::AdamStepArgs shared = shared_step_args(pieces_.total(), values);
  pieces_.run(pool, [&](const Piece& piece, int64_t offset, int64_t length) {
    const size_t i = piece.matrix;
    const Tensor& tensor = tensors_[i];
    const int64_t state = piece.state_offset + offset;
    simd::AdamStepArgs args =
        tensor_piece_args(shared, pointers.grads[i], has_out_params_ ? &pointers.out_params[i] : nullptr,
                          tensor.grad_dtype, tensor.out_dtype, offset, scalars_[piece.scalars]);
    args.param = flat_master_ ? pointers.master + state : static_cast<float*>(pointers.params[i].data) + offset;
    args.exp_avg = pointers.exp_avg + state;
    args.exp_avg_sq = pointers.exp_avg_sq + state;
    kernels.adam_step(args, length);
  });
}

// ---- ColumnStepPlan ----

void ColumnStepPlan::build(const zf_column_state* state, const zf_tensor* selected, size_t count,
                           const zf_tensor* grads, const zf_tensor* packed_grads, const zf_tensor* packed_out) {
  require(count == 0 || state != nullptr, ZF_ERROR_INVALID_VALUE, "state: NULL array with count=", count);
  require(count == 0 || (grads == nullptr) != (packed_grads == nullptr), ZF_ERROR_INVALID_VALUE,
          "grads/packed_grads: exactly one must be given (the per-matrix gradients or one packed buffer), got ",
          grads == nullptr ? "neither" : "both");
  PackedLayout layout;
  layout.reserve(count);
  std::vector<ColumnRun> runs;
  std::vector<zf_dtype> grad_dtypes;
  grad_dtypes.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const ArgName exp_avg_name("state", i, "exp_avg");
    const zf_tensor& exp_avg = state[i].exp_avg;
    check_host_tensor(&exp_avg, exp_avg_name, {ZF_DTYPE_F32});
    check_ndim(exp_avg, exp_avg_name, 2);
    // Host layout [n, m]: n columns of m contiguous elements.
    const int64_t cols = exp_avg.shape[0], rows = exp_avg.shape[1];
    const int64_t elements = cols * rows;
    const bool has_master =
        check_master(state[i].master, ArgName("state", i, "master"), elements, exp_avg.device, exp_avg_name);
    require(has_master || elements == 0, ZF_ERROR_INVALID_VALUE, ArgName("state", i, "master"),
            ": is empty, but the host step updates the fp32 master (it is required)");
    check_matrix_layout(state[i].master, ArgName("state", i, "master"), cols, rows, kHostLayout, exp_avg_name);
    check_state_tensor(state[i].exp_avg_sq, ArgName("state", i, "exp_avg_sq"), ZF_DTYPE_F32, elements, exp_avg.device,
                       exp_avg_name);
    check_matrix_layout(state[i].exp_avg_sq, ArgName("state", i, "exp_avg_sq"), cols, rows, kHostLayout, exp_avg_name);
    check_state_tensor(state[i].steps, ArgName("state", i, "steps"), ZF_DTYPE_I32, cols, exp_avg.device, exp_avg_name);
    int64_t k = 0;
    const int32_t* indices = nullptr;
    if (selected != nullptr) {
      k = check_selected(&selected[i], ArgName("selected", i), cols, exp_avg.device, exp_avg_name);
      indices = static_cast<const int32_t*>(selected[i].data);
    }
    if (grads != nullptr) {
      check_host_tensor(&grads[i], ArgName("grads", i), {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
      check_numel(grads[i], ArgName("grads", i), elements);
      // The gradient of W [m, n] itself (row-major) is the commonest mistake here.
      check_matrix_layout(grads[i], ArgName("grads", i), cols, rows, kHostLayout, exp_avg_name);
      grad_dtypes.push_back(grads[i].dtype);
    }
    layout.add(rows, cols, k, "state");
    for_each_unselected_run(indices, k, cols, [&](int64_t begin, int64_t end, int64_t packed_column) {
      runs.push_back(ColumnRun{i, begin, end - begin, packed_column});
    });
  }
  if (packed_grads != nullptr) {
    check_packed(packed_grads, "packed_grads", layout);
    grad_dtypes.assign(count, packed_grads->dtype);
  }
  if (packed_out != nullptr) check_packed(packed_out, "packed_out", layout);

  layout_ = std::move(layout);
  runs_ = std::move(runs);
  grad_dtypes_ = std::move(grad_dtypes);
  packed_grads_ = packed_grads != nullptr;
  has_packed_out_ = packed_out != nullptr;
  packed_out_dtype_ = packed_out != nullptr ? packed_out->dtype : ZF_DTYPE_F32;
  pieces_.clear();
  pieces_.reserve(runs_.size());
}

void ColumnStepPlan::check_step_counts(const zf_column_state* state, uint32_t flags) const {
  // Incremented counts must stay representable; counts used as they are must be real steps.
  const bool increment = (flags & ZF_CPU_ADAMW_INCREMENT_STEPS) != 0;
  for (const ColumnRun& run : runs_) {
    const int32_t* counts = static_cast<const int32_t*>(state[run.matrix].steps.data);
    zf::check_step_counts(counts + run.first_column, run.columns, ArgName("state", run.matrix, "steps"),
                          increment ? 0 : 1, increment ? 1 : 0, run.first_column);
  }
}

void ColumnStepPlan::run(ThreadPool& pool, const ColumnStepPointers& pointers, const AdamRunValues& values) {
  // Serial pass over the unselected columns (a few per thousand elements of work): cut the
  // runs where the step count changes, find each stretch's scalars, and increment counts.
  const bool increment = (values.flags & ZF_CPU_ADAMW_INCREMENT_STEPS) != 0;
  scalars_.reset(values.hparams, values.step_span);
  pieces_.clear();
  for (const ColumnRun& run : runs_) {
    const size_t i = run.matrix;
    const PackedMatrix& matrix = layout_[i];
    int32_t* counts = static_cast<int32_t*>(pointers.state[i].steps.data);
    const int64_t end = run.first_column + run.columns;
    int64_t column = run.first_column;
    int64_t packed_column = run.packed_column;
    while (column < end) {
      const int32_t count = counts[column];
      int64_t stop = column + 1;
      while (stop < end && counts[stop] == count) ++stop;
      const int32_t step = increment ? adam_next_step_count(count, values.step_span) : count;
      if (increment) std::fill(counts + column, counts + stop, step);
      const int64_t packed_offset = layout_.index(i, packed_column, 0);
      pieces_.add(i, column * matrix.rows, packed_grads_ ? packed_offset : column * matrix.rows, packed_offset,
                  (stop - column) * matrix.rows, scalars_.index_of(values.lr[i], values.weight_decay[i], step));
      packed_column += stop - column;
      column = stop;
    }
  }

  const simd::KernelTable& kernels = simd::active_kernels();
  simd::AdamStepArgs shared = shared_step_args(pieces_.total(), values);
  // A fused step reading its gradient from the output copy itself has just brought each of
  // the copy's lines into the cache: a non-temporal store would evict them again. Measured
  // (40 x [1024, 2048], bf16, the engine's fused window close): the update at 68-83% of its
  // roof with them, 87-99% without (the slow memory state of a 2-core Zen 4 VM).
  if (pointers.packed_out != nullptr && pointers.packed_out == pointers.packed_grads) shared.stream_out = false;
  pieces_.run(pool, [&](const Piece& piece, int64_t offset, int64_t length) {
    const size_t i = piece.matrix;
    const zf_column_state& state = pointers.state[i];
    const int64_t element = piece.state_offset + offset;
    void* grad_base = packed_grads_ ? pointers.packed_grads : pointers.grads[i].data;
    simd::AdamStepArgs args = shared;
    args.param = static_cast<float*>(state.master.data) + element;
    args.exp_avg = static_cast<float*>(state.exp_avg.data) + element;
    args.exp_avg_sq = static_cast<float*>(state.exp_avg_sq.data) + element;
    args.grad = element_pointer(grad_base, grad_dtypes_[i], piece.grad_offset + offset);
    args.grad_dtype = grad_dtypes_[i];
    args.out =
        has_packed_out_ ? element_pointer(pointers.packed_out, packed_out_dtype_, piece.out_offset + offset) : nullptr;
    args.out_dtype = packed_out_dtype_;
    args.scalars = scalars_[piece.scalars];
    if (pointers.fuse_accumulate) {
      args.fuse_accumulate = true;
      args.accumulate_scale = values.accumulate_scale;
      args.accumulator = pointers.accumulators[i] != nullptr ? pointers.accumulators[i] + element : nullptr;
    }
    kernels.adam_step(args, length);
  });
}

// ---- AccumulatePlan ----

void AccumulatePlan::build(const zf_tensor* accumulators, const zf_tensor* selected, size_t count,
                           const zf_tensor* packed) {
  require(count == 0 || accumulators != nullptr, ZF_ERROR_INVALID_VALUE, "accumulators: NULL array with count=", count);
  PackedLayout layout;
  layout.reserve(count);
  PieceList pieces;
  pieces.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const ArgName name("accumulators", i);
    const zf_tensor& accumulator = accumulators[i];
    check_host_tensor(&accumulator, name, {ZF_DTYPE_F32});
    if (selected == nullptr) {
      // Every column unselected: the matrix's region is its elements in order, whatever
      // its shape (one column of numel elements has that layout).
      layout.add(numel(accumulator), 1, 0, "accumulators");
      pieces.add(i, 0, layout[i].offset, 0, numel(accumulator), 0);
      continue;
    }
    check_ndim(accumulator, name, 2);
    const int64_t cols = accumulator.shape[0], rows = accumulator.shape[1];
    const int64_t k = check_selected(&selected[i], ArgName("selected", i), cols, accumulator.device, name);
    layout.add(rows, cols, k, "accumulators");
    const int32_t* indices = static_cast<const int32_t*>(selected[i].data);
    for_each_unselected_run(indices, k, cols, [&](int64_t begin, int64_t end, int64_t packed_column) {
      pieces.add(i, begin * rows, layout.index(i, packed_column, 0), 0, (end - begin) * rows, 0);
    });
  }
  require(packed != nullptr, ZF_ERROR_INVALID_VALUE, "packed: is NULL");
  check_packed(packed, "packed", layout);

  layout_ = std::move(layout);
  pieces_ = std::move(pieces);
  packed_dtype_ = packed->dtype;
}

void AccumulatePlan::run(ThreadPool& pool, const zf_tensor* accumulators, const void* packed, float scale,
                         const uint8_t* overwrite, int64_t pass_elements) const {
  const simd::KernelTable& kernels = simd::active_kernels();
  // A window's first accumulate writes its accumulators without reading them; in a large
  // call they no longer fit in cache and are read next a step later: written with
  // non-temporal stores, as the step's output copy is (the same threshold).
  const bool stream = std::max(layout_.total(), pass_elements) >= kStreamOutMinElements;
  pieces_.run(pool, [&](const Piece& piece, int64_t offset, int64_t length) {
    const bool fresh = overwrite != nullptr && overwrite[piece.matrix] != 0;
    kernels.accumulate(static_cast<float*>(accumulators[piece.matrix].data) + piece.state_offset + offset,
                       element_pointer(packed, packed_dtype_, piece.grad_offset + offset), packed_dtype_, length, scale,
                       fresh, fresh && stream);
  });
}

namespace {

// ---- the C entry points: validate, build the plan, run it ----

// The per-step values of the whole-tensor steps (zf_cpu_adamw_step, zf_cpu_adamw_step_flat).
void check_step_values(size_t count, const int64_t* steps, const double* lr, const double* weight_decay,
                       const zf_adam_hparams* hparams, float grad_scale, uint32_t flags) {
  check_flags(flags, ZF_CPU_ADAMW_ZERO_GRAD);
  check_adam_hparams(hparams);
  check_lr_and_weight_decay(lr, weight_decay, count);
  check_scale(grad_scale, "grad_scale");
  require(count == 0 || steps != nullptr, ZF_ERROR_INVALID_VALUE, "steps: NULL array with count=", count);
  for (size_t i = 0; i < count; ++i) {
    require(steps[i] >= 1, ZF_ERROR_INVALID_VALUE, "steps[", i, "]: must be >= 1, got ", steps[i]);
  }
}

void adamw_step(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs,
                const zf_tensor* grads, const zf_tensor* out_params, size_t count, const int64_t* steps,
                const double* lr, const double* weight_decay, const zf_adam_hparams* hparams, float grad_scale,
                uint32_t flags) {
  check_step_values(count, steps, lr, weight_decay, hparams, grad_scale, flags);
  AdamwStepPlan plan;
  plan.build(params, exp_avgs, exp_avg_sqs, grads, out_params, count);

  const bool zero_grad = (flags & ZF_CPU_ADAMW_ZERO_GRAD) != 0;
  OverlapCheck overlap;
  overlap.reserve(5 * count);
  for (size_t i = 0; i < count; ++i) {
    overlap.add(params[i], ArgName("params", i), true);
    overlap.add(exp_avgs[i], ArgName("exp_avgs", i), true);
    overlap.add(exp_avg_sqs[i], ArgName("exp_avg_sqs", i), true);
    overlap.add(grads[i], ArgName("grads", i), zero_grad);
    if (out_params != nullptr) overlap.add(out_params[i], ArgName("out_params", i), true);
  }
  overlap.check();

  const std::shared_ptr<ThreadPool> pool = global_thread_pool();
  plan.run(*pool, AdamwStepPointers{params, exp_avgs, exp_avg_sqs, grads, out_params}, steps,
           AdamRunValues{lr, weight_decay, *hparams, grad_scale, flags});
}

void adamw_step_flat(const zf_tensor* params, const zf_tensor* master, const zf_tensor* exp_avg,
                     const zf_tensor* exp_avg_sq, const int64_t* offsets, const int64_t* sizes, const zf_tensor* grads,
                     const zf_tensor* out_params, size_t count, const int64_t* steps, const double* lr,
                     const double* weight_decay, const zf_adam_hparams* hparams, float grad_scale, uint32_t flags) {
  check_step_values(count, steps, lr, weight_decay, hparams, grad_scale, flags);
  AdamwFlatStepPlan plan;
  plan.build(params, master, exp_avg, exp_avg_sq, offsets, sizes, grads, out_params, count);

  const bool zero_grad = (flags & ZF_CPU_ADAMW_ZERO_GRAD) != 0;
  OverlapCheck overlap;
  overlap.reserve(3 * count + 3);
  if (master != nullptr) overlap.add(*master, "master", true);
  overlap.add(*exp_avg, "exp_avg", true);
  overlap.add(*exp_avg_sq, "exp_avg_sq", true);
  for (size_t i = 0; i < count; ++i) {
    if (params != nullptr) overlap.add(params[i], ArgName("params", i), true);
    overlap.add(grads[i], ArgName("grads", i), zero_grad);
    if (out_params != nullptr) overlap.add(out_params[i], ArgName("out_params", i), true);
  }
  overlap.check();

  const std::shared_ptr<ThreadPool> pool = global_thread_pool();
  plan.run(*pool,
           AdamwFlatStepPointers{params, master != nullptr ? static_cast<float*>(master->data) : nullptr,
                                 static_cast<float*>(exp_avg->data), static_cast<float*>(exp_avg_sq->data), grads,
                                 out_params},
           steps, AdamRunValues{lr, weight_decay, *hparams, grad_scale, flags});
}

void adamw_step_skip_columns(const zf_column_state* state, const zf_tensor* selected, size_t count,
                             const zf_tensor* grads, const zf_tensor* packed_grads, const zf_tensor* packed_out,
                             const double* lr, const double* weight_decay, const zf_adam_hparams* hparams,
                             float grad_scale, uint32_t flags) {
  check_flags(flags, ZF_CPU_ADAMW_ZERO_GRAD | ZF_CPU_ADAMW_INCREMENT_STEPS);
  check_adam_hparams(hparams);
  check_lr_and_weight_decay(lr, weight_decay, count);
  check_scale(grad_scale, "grad_scale");
  ColumnStepPlan plan;
  plan.build(state, selected, count, grads, packed_grads, packed_out);
  plan.check_step_counts(state, flags);

  const bool zero_grad = (flags & ZF_CPU_ADAMW_ZERO_GRAD) != 0;
  const bool increment = (flags & ZF_CPU_ADAMW_INCREMENT_STEPS) != 0;
  OverlapCheck overlap;
  overlap.reserve(6 * count + 2);
  for (size_t i = 0; i < count; ++i) {
    overlap.add(state[i].master, ArgName("state", i, "master"), true);
    overlap.add(state[i].exp_avg, ArgName("state", i, "exp_avg"), true);
    overlap.add(state[i].exp_avg_sq, ArgName("state", i, "exp_avg_sq"), true);
    overlap.add(state[i].steps, ArgName("state", i, "steps"), increment);
    if (selected != nullptr) overlap.add(selected[i], ArgName("selected", i), false);
    if (grads != nullptr) overlap.add(grads[i], ArgName("grads", i), zero_grad);
  }
  if (packed_grads != nullptr) overlap.add(*packed_grads, "packed_grads", zero_grad);
  if (packed_out != nullptr) overlap.add(*packed_out, "packed_out", true);
  overlap.check();

  const std::shared_ptr<ThreadPool> pool = global_thread_pool();
  plan.run(*pool,
           ColumnStepPointers{state, grads, packed_grads != nullptr ? packed_grads->data : nullptr,
                              packed_out != nullptr ? packed_out->data : nullptr},
           AdamRunValues{lr, weight_decay, *hparams, grad_scale, flags});
}

void accumulate(const zf_tensor* accumulators, const zf_tensor* selected, size_t count, const zf_tensor* packed,
                float scale) {
  check_scale(scale, "scale");
  AccumulatePlan plan;
  plan.build(accumulators, selected, count, packed);

  OverlapCheck overlap;
  overlap.reserve(2 * count + 1);
  for (size_t i = 0; i < count; ++i) {
    overlap.add(accumulators[i], ArgName("accumulators", i), true);
    if (selected != nullptr) overlap.add(selected[i], ArgName("selected", i), false);
  }
  overlap.add(*packed, "packed", false);
  overlap.check();

  const std::shared_ptr<ThreadPool> pool = global_thread_pool();
  plan.run(*pool, accumulators, packed->data, scale);
}

// ---- zf_cpu_gather_columns / zf_cpu_scatter_columns ----

enum class ColumnMove { kGather, kScatter };

// One matrix of a move, validated.
struct MovedMatrix {
  int64_t rows;        // m: elements per column
  int64_t first_item;  // index of its first moved column among all the call's moved columns
  bool master;         // whether the masters move (present) or not (all empty)
};

// host[i] (host layout) and list[i] (packed host list) of a move, for every i: validates
// everything, then copies the listed columns one way or the other.
void move_columns(const zf_column_state* host, const zf_tensor* columns, size_t count, const zf_column_state* list,
                  ColumnMove direction) {
  const bool gather = direction == ColumnMove::kGather;
  const char* const list_name = gather ? "out" : "in";
  require(count == 0 || (host != nullptr && columns != nullptr && list != nullptr), ZF_ERROR_INVALID_VALUE,
          "host/columns/", list_name, ": NULL array with count=", count);
  std::vector<MovedMatrix> matrices;
  matrices.reserve(count + 1);
  int64_t items = 0, elements = 0;
  for (size_t i = 0; i < count; ++i) {
    const ArgName host_name("host", i, "exp_avg");
    const zf_tensor& exp_avg = host[i].exp_avg;
    check_host_tensor(&exp_avg, host_name, {ZF_DTYPE_F32});
    check_ndim(exp_avg, host_name, 2);
    const int64_t cols = exp_avg.shape[0], rows = exp_avg.shape[1];
    const zf_device& cpu = exp_avg.device;
    const bool master = check_master(host[i].master, ArgName("host", i, "master"), cols * rows, cpu, host_name);
    check_matrix_layout(host[i].master, ArgName("host", i, "master"), cols, rows, kHostLayout, host_name);
    check_state_tensor(host[i].exp_avg_sq, ArgName("host", i, "exp_avg_sq"), ZF_DTYPE_F32, cols * rows, cpu, host_name);
    check_matrix_layout(host[i].exp_avg_sq, ArgName("host", i, "exp_avg_sq"), cols, rows, kHostLayout, host_name);
    check_state_tensor(host[i].steps, ArgName("host", i, "steps"), ZF_DTYPE_I32, cols, cpu, host_name);
    const int64_t moved = check_selected(&columns[i], ArgName("columns", i), cols, cpu, host_name);

    const zf_column_state& packed = list[i];
    const ArgName list_master(list_name, i, "master");
    if (master) {
      check_state_tensor(packed.master, list_master, ZF_DTYPE_F32, moved * rows, cpu, host_name);
      check_matrix_layout(packed.master, list_master, moved, rows, kListLayout, ArgName("columns", i));
    } else {
      check_descriptor(&packed.master, list_master);
      check_cpu(packed.master, list_master);
      require(numel(packed.master) == 0, ZF_ERROR_INVALID_VALUE, list_master, ": must be empty, as ",
              ArgName("host", i, "master"), " is (there is no master to move)");
    }
    check_state_tensor(packed.exp_avg, ArgName(list_name, i, "exp_avg"), ZF_DTYPE_F32, moved * rows, cpu, host_name);
    check_matrix_layout(packed.exp_avg, ArgName(list_name, i, "exp_avg"), moved, rows, kListLayout,
                        ArgName("columns", i));
    check_state_tensor(packed.exp_avg_sq, ArgName(list_name, i, "exp_avg_sq"), ZF_DTYPE_F32, moved * rows, cpu,
                       host_name);
    check_matrix_layout(packed.exp_avg_sq, ArgName(list_name, i, "exp_avg_sq"), moved, rows, kListLayout,
                        ArgName("columns", i));
    check_state_tensor(packed.steps, ArgName(list_name, i, "steps"), ZF_DTYPE_I32, moved, cpu, host_name);

    // The counts that move must be counts (>= 0); the host copies of the others are not read.
    if (gather) {
      const int32_t* indices = static_cast<const int32_t*>(columns[i].data);
      const int32_t* counts = static_cast<const int32_t*>(host[i].steps.data);
      for (int64_t c = 0; c < moved; ++c) {
        check_step_counts(counts + indices[c], 1, ArgName("host", i, "steps"), 0, 0, indices[c]);
      }
    } else {
      check_step_counts(static_cast<const int32_t*>(packed.steps.data), moved, ArgName("in", i, "steps"), 0, 0);
    }
    matrices.push_back(MovedMatrix{rows, items, master});
    items += moved;
    elements += moved * rows;
  }
  matrices.push_back(MovedMatrix{0, items, false});  // sentinel: the end of the last matrix

  OverlapCheck overlap;
  overlap.reserve(9 * count);
  for (size_t i = 0; i < count; ++i) {
    overlap.add(host[i].master, ArgName("host", i, "master"), !gather);
    overlap.add(host[i].exp_avg, ArgName("host", i, "exp_avg"), !gather);
    overlap.add(host[i].exp_avg_sq, ArgName("host", i, "exp_avg_sq"), !gather);
    overlap.add(host[i].steps, ArgName("host", i, "steps"), !gather);
    overlap.add(columns[i], ArgName("columns", i), false);
    overlap.add(list[i].master, ArgName(list_name, i, "master"), gather);
    overlap.add(list[i].exp_avg, ArgName(list_name, i, "exp_avg"), gather);
    overlap.add(list[i].exp_avg_sq, ArgName(list_name, i, "exp_avg_sq"), gather);
    overlap.add(list[i].steps, ArgName(list_name, i, "steps"), gather);
  }
  overlap.check();

  // Everything is valid: copy moved columns [begin, end) of the call.
  auto copy_items = [&](int64_t begin, int64_t end) {
    if (begin >= end) return;
    // The matrix of `begin`: the last one starting at or before it.
    const auto after = std::upper_bound(matrices.begin(), matrices.end(), begin,
                                        [](int64_t item, const MovedMatrix& m) { return item < m.first_item; });
    size_t i = static_cast<size_t>(after - matrices.begin()) - 1;
    for (int64_t item = begin; item < end; ++item) {
      while (item >= matrices[i + 1].first_item) ++i;
      const MovedMatrix& matrix = matrices[i];
      const int64_t position = item - matrix.first_item;
      const int64_t column = static_cast<const int32_t*>(columns[i].data)[position];
      const size_t bytes = static_cast<size_t>(matrix.rows) * sizeof(float);
      auto move = [&](const zf_tensor& host_tensor, const zf_tensor& list_tensor) {
        float* host_column = static_cast<float*>(host_tensor.data) + column * matrix.rows;
        float* list_column = static_cast<float*>(list_tensor.data) + position * matrix.rows;
        if (gather) {
          std::memcpy(list_column, host_column, bytes);
        } else {
          std::memcpy(host_column, list_column, bytes);
        }
      };
      if (matrix.master) move(host[i].master, list[i].master);
      move(host[i].exp_avg, list[i].exp_avg);
      move(host[i].exp_avg_sq, list[i].exp_avg_sq);
      int32_t* host_count = static_cast<int32_t*>(host[i].steps.data) + column;
      int32_t* list_count = static_cast<int32_t*>(list[i].steps.data) + position;
      if (gather) {
        *list_count = *host_count;
      } else {
        *host_count = *list_count;
      }
    }
  };
  const std::shared_ptr<ThreadPool> pool = global_thread_pool();
  if (elements < kParallelMinElements || pool->size() == 1) {
    copy_items(0, items);
    return;
  }
  pool->run([&](int thread, int threads) {
    int64_t begin, end;
    split_range(0, items, thread, threads, &begin, &end);
    copy_items(begin, end);
  });
}

}  // namespace
}  // namespace zf

extern "C" {

ZF_API zf_status zf_cpu_adamw_step(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs,
                                   const zf_tensor* grads, const zf_tensor* out_params, size_t count,
                                   const int64_t* steps, const double* lr, const double* weight_decay,
                                   const zf_adam_hparams* hparams, float grad_scale, uint32_t flags) {
  return zf::api_call([&] {
    zf::adamw_step(params, exp_avgs, exp_avg_sqs, grads, out_params, count, steps, lr, weight_decay, hparams,
                   grad_scale, flags);
  });
}

ZF_API zf_status zf_cpu_adamw_step_flat(const zf_tensor* params, const zf_tensor* master, const zf_tensor* exp_avg,
                                        const zf_tensor* exp_avg_sq, const int64_t* offsets, const int64_t* sizes,
                                        const zf_tensor* grads, const zf_tensor* out_params, size_t count,
                                        const int64_t* steps, const double* lr, const double* weight_decay,
                                        const zf_adam_hparams* hparams, float grad_scale, uint32_t flags) {
  return zf::api_call([&] {
    zf::adamw_step_flat(params, master, exp_avg, exp_avg_sq, offsets, sizes, grads, out_params, count, steps, lr,
                        weight_decay, hparams, grad_scale, flags);
  });
}

ZF_API zf_status zf_cpu_adamw_step_skip_columns(const zf_column_state* state, const zf_tensor* selected, size_t count,
                                                const zf_tensor* grads, const zf_tensor* packed_grads,
                                                const zf_tensor* packed_out, const double* lr,
                                                const double* weight_decay, const zf_adam_hparams* hparams,
                                                float grad_scale, uint32_t flags) {
  return zf::api_call([&] {
    zf::adamw_step_skip_columns(state, selected, count, grads, packed_grads, packed_out, lr, weight_decay, hparams,
                                grad_scale, flags);
  });
}

ZF_API zf_status zf_cpu_accumulate(const zf_tensor* accumulators, const zf_tensor* selected, size_t count,
                                   const zf_tensor* packed, float scale) {
  return zf::api_call([&] { zf::accumulate(accumulators, selected, count, packed, scale); });
}

ZF_API zf_status zf_cpu_gather_columns(const zf_column_state* host, const zf_tensor* columns, size_t count,
                                       const zf_column_state* out) {
  return zf::api_call([&] { zf::move_columns(host, columns, count, out, zf::ColumnMove::kGather); });
}

ZF_API zf_status zf_cpu_scatter_columns(const zf_column_state* in, const zf_tensor* columns, size_t count,
                                        const zf_column_state* host) {
  return zf::api_call([&] { zf::move_columns(host, columns, count, in, zf::ColumnMove::kScatter); });
}

}  // extern "C"
