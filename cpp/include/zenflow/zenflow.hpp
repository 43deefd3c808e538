// Header-only C++ layer over the zenflow C ABI: exceptions instead of status codes,
// descriptor builders, and RAII guards for the process-wide settings. Everything here
// is inline and calls only the exported C functions, so it adds no ABI of its own.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "zenflow/zenflow.h"

namespace zenflow {

class Error : public std::runtime_error {
 public:
  Error(zf_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  zf_status status() const noexcept { return status_; }

 private:
  zf_status status_;
};

// Throws zenflow::Error with zf_last_error()'s text when status is not ZF_SUCCESS.
inline void check(zf_status status) {
  if (status != ZF_SUCCESS) throw Error(status, zf_last_error());
}

constexpr zf_device cpu_device() { return zf_device{ZF_DEVICE_CPU, 0}; }
constexpr zf_device cuda_device(int index) { return zf_device{ZF_DEVICE_CUDA, index}; }

// A contiguous (row-major) descriptor over memory the caller owns.
inline zf_tensor contiguous_tensor(void* data, zf_dtype dtype, const std::vector<int64_t>& shape,
                                   zf_device device = cpu_device()) {
  if (shape.size() > ZF_MAX_DIMS) throw Error(ZF_ERROR_INVALID_VALUE, "shape: too many dimensions");
  zf_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  // Unsigned products: for a shape whose size overflows int64 the strides wrap (defined
  // behaviour) and the library rejects the shape when it validates the descriptor.
  uint64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[static_cast<size_t>(d)];
    t.strides[d] = static_cast<int64_t>(stride);
    stride *= static_cast<uint64_t>(shape[static_cast<size_t>(d)]);
  }
  return t;
}

// ---- ops (see zenflow/norms.h and zenflow/topk.h for the contracts) ----

inline size_t column_stats_workspace_bytes(const std::vector<zf_tensor>& grads, const std::vector<zf_tensor>& col_sq,
                                           const zf_tensor& total_sq, const zf_tensor& nonfinite, uint32_t flags = 0) {
  size_t bytes = 0;
  check(zf_column_stats(grads.data(), col_sq.data(), grads.size(), &total_sq, &nonfinite, flags, nullptr, &bytes,
                        nullptr));
  return bytes;
}

inline void column_stats(const std::vector<zf_tensor>& grads, const std::vector<zf_tensor>& col_sq,
                         const zf_tensor& total_sq, const zf_tensor& nonfinite, uint32_t flags = 0,
                         void* workspace = nullptr, size_t workspace_bytes = 0, zf_stream stream = nullptr) {
  if (grads.size() != col_sq.size()) throw Error(ZF_ERROR_INVALID_VALUE, "col_sq: length differs from grads");
  check(zf_column_stats(grads.data(), col_sq.data(), grads.size(), &total_sq, &nonfinite, flags, workspace,
                        workspace ? &workspace_bytes : nullptr, stream));
}

inline size_t select_topk_workspace_bytes(const std::vector<zf_tensor>& scores,
                                          const std::vector<zf_tensor>& out_indices) {
  size_t bytes = 0;
  check(zf_select_topk_columns(scores.data(), out_indices.data(), scores.size(), nullptr, &bytes, nullptr));
  return bytes;
}

inline void select_topk_columns(const std::vector<zf_tensor>& scores, const std::vector<zf_tensor>& out_indices,
                                void* workspace = nullptr, size_t workspace_bytes = 0, zf_stream stream = nullptr) {
  if (scores.size() != out_indices.size())
    throw Error(ZF_ERROR_INVALID_VALUE, "out_indices: length differs from scores");
  check(zf_select_topk_columns(scores.data(), out_indices.data(), scores.size(), workspace,
                               workspace ? &workspace_bytes : nullptr, stream));
}

// ---- column ops (see zenflow/optim.h and zenflow/pack.h for the contracts) ----

// The hyper-parameters shared by every Adam call; the defaults are torch.optim.AdamW's.
constexpr zf_adam_hparams adam_hparams(double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
                                       zf_adam_mode mode = ZF_ADAM_MODE_ADAMW) {
  return zf_adam_hparams{beta1, beta2, eps, mode};
}

// `selected` empty: every column (dense AdamW). lr_tensor, grad_scale and noop may be null;
// with lr_tensor, `lr` may be empty.
inline void adamw_selected_columns(const std::vector<zf_tensor>& params, const std::vector<zf_tensor>& grads,
                                   const std::vector<zf_tensor>& selected, const std::vector<zf_column_state>& state,
                                   const std::vector<double>& lr, const std::vector<double>& weight_decay,
                                   const zf_adam_hparams& hparams = adam_hparams(),
                                   const zf_tensor* grad_scale = nullptr, const zf_tensor* noop = nullptr,
                                   const zf_tensor* lr_tensor = nullptr, zf_stream stream = nullptr) {
  const size_t count = params.size();
  if (grads.size() != count || state.size() != count || (lr_tensor == nullptr && lr.size() != count) ||
      weight_decay.size() != count || (!selected.empty() && selected.size() != count)) {
    throw Error(ZF_ERROR_INVALID_VALUE, "adamw_selected_columns: argument lists differ in length");
  }
  check(zf_adamw_selected_columns(params.data(), grads.data(), selected.empty() ? nullptr : selected.data(),
                                  state.data(), count, lr.empty() ? nullptr : lr.data(), weight_decay.data(), lr_tensor,
                                  &hparams, grad_scale, noop, stream));
}

// Offsets of the packed layout (zf_packed_layout): count + 1 values, the last the total.
inline std::vector<int64_t> packed_offsets(const std::vector<int64_t>& rows, const std::vector<int64_t>& cols,
                                           const std::vector<int64_t>& selected_counts) {
  if (cols.size() != rows.size() || selected_counts.size() != rows.size())
    throw Error(ZF_ERROR_INVALID_VALUE, "packed_offsets: argument lists differ in length");
  std::vector<int64_t> offsets(rows.size() + 1);
  check(zf_packed_layout(rows.data(), cols.data(), selected_counts.data(), rows.size(), offsets.data()));
  return offsets;
}

// `selected` empty: no column is selected (every column is packed).
inline void pack_columns(const std::vector<zf_tensor>& grads, const std::vector<zf_tensor>& selected,
                         const zf_tensor& packed, const zf_tensor* scale = nullptr, zf_stream stream = nullptr) {
  if (!selected.empty() && selected.size() != grads.size())
    throw Error(ZF_ERROR_INVALID_VALUE, "selected: length differs from grads");
  check(zf_pack_columns(grads.data(), selected.empty() ? nullptr : selected.data(), grads.size(), &packed, scale,
                        stream));
}

inline void scatter_columns(const zf_tensor& packed, const std::vector<zf_tensor>& params,
                            const std::vector<zf_tensor>& selected, zf_stream stream = nullptr) {
  if (!selected.empty() && selected.size() != params.size())
    throw Error(ZF_ERROR_INVALID_VALUE, "selected: length differs from params");
  check(
      zf_scatter_columns(&packed, params.data(), selected.empty() ? nullptr : selected.data(), params.size(), stream));
}

struct ExchangeArgs {
  std::vector<zf_tensor> old_selected, new_selected;
  std::vector<zf_column_state> old_state, new_state, entering, leaving;
  void validate_lengths() const {
    const size_t n = old_selected.size();
    if (new_selected.size() != n || old_state.size() != n || new_state.size() != n || entering.size() != n ||
        leaving.size() != n) {
      throw Error(ZF_ERROR_INVALID_VALUE, "exchange_selected_columns: argument lists differ in length");
    }
  }
};

inline size_t exchange_selected_columns_workspace_bytes(const ExchangeArgs& a) {
  a.validate_lengths();
  size_t bytes = 0;
  check(zf_exchange_selected_columns(a.old_selected.data(), a.new_selected.data(), a.old_state.data(),
                                     a.new_state.data(), a.entering.data(), a.leaving.data(), a.old_selected.size(),
                                     nullptr, &bytes, nullptr));
  return bytes;
}

inline void exchange_selected_columns(const ExchangeArgs& a, void* workspace = nullptr, size_t workspace_bytes = 0,
                                      zf_stream stream = nullptr) {
  a.validate_lengths();
  check(zf_exchange_selected_columns(a.old_selected.data(), a.new_selected.data(), a.old_state.data(),
                                     a.new_state.data(), a.entering.data(), a.leaving.data(), a.old_selected.size(),
                                     workspace, workspace ? &workspace_bytes : nullptr, stream));
}

// The packed form (zf_exchange_selected_columns_packed): one entering and one leaving state
// for all matrices, cut by the per-matrix counts.
struct PackedExchangeArgs {
  std::vector<zf_tensor> old_selected, new_selected;
  std::vector<zf_column_state> old_state, new_state;
  std::vector<int64_t> entering_counts, leaving_counts;
  zf_column_state entering{}, leaving{};
  void validate_lengths() const {
    const size_t n = old_selected.size();
    if (new_selected.size() != n || old_state.size() != n || new_state.size() != n || entering_counts.size() != n ||
        leaving_counts.size() != n) {
      throw Error(ZF_ERROR_INVALID_VALUE, "exchange_selected_columns: argument lists differ in length");
    }
  }
};

inline size_t exchange_selected_columns_workspace_bytes(const PackedExchangeArgs& a) {
  a.validate_lengths();
  size_t bytes = 0;
  check(zf_exchange_selected_columns_packed(
      a.old_selected.data(), a.new_selected.data(), a.old_state.data(), a.new_state.data(), a.entering_counts.data(),
      &a.entering, a.leaving_counts.data(), &a.leaving, a.old_selected.size(), nullptr, &bytes, nullptr));
  return bytes;
}

inline void exchange_selected_columns(const PackedExchangeArgs& a, void* workspace = nullptr,
                                      size_t workspace_bytes = 0, zf_stream stream = nullptr) {
  a.validate_lengths();
  check(zf_exchange_selected_columns_packed(a.old_selected.data(), a.new_selected.data(), a.old_state.data(),
                                            a.new_state.data(), a.entering_counts.data(), &a.entering,
                                            a.leaving_counts.data(), &a.leaving, a.old_selected.size(), workspace,
                                            workspace ? &workspace_bytes : nullptr, stream));
}

// ---- RAII guards for process-wide settings ----

// Forces a SIMD level for its lifetime (tests sweep the levels with it).
class ScopedSimdLevel {
 public:
  explicit ScopedSimdLevel(zf_simd_level level) : previous_(zf_simd_level_active()) { check(zf_set_simd_level(level)); }
  ~ScopedSimdLevel() { zf_set_simd_level(previous_); }
  ScopedSimdLevel(const ScopedSimdLevel&) = delete;
  ScopedSimdLevel& operator=(const ScopedSimdLevel&) = delete;

 private:
  zf_simd_level previous_;
};

// Resizes the host pool for its lifetime.
class ScopedNumThreads {
 public:
  explicit ScopedNumThreads(int num_threads) : previous_(zf_get_num_threads()) {
    check(zf_set_num_threads(num_threads, nullptr, 0));
  }
  ~ScopedNumThreads() { zf_set_num_threads(previous_, nullptr, 0); }
  ScopedNumThreads(const ScopedNumThreads&) = delete;
  ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

 private:
  int previous_;
};

inline std::vector<zf_simd_level> supported_simd_levels() {
  std::vector<zf_simd_level> levels;
  for (int level = ZF_SIMD_SCALAR; level <= zf_simd_level_supported(); ++level) {
    levels.push_back(static_cast<zf_simd_level>(level));
  }
  return levels;
}

}  // namespace zenflow

// ---- host optimizer (see zenflow/cpu_adamw.h for the contracts) ----
namespace zenflow {

namespace detail {
inline void require_same_length(size_t expected, size_t got, const char* name) {
  if (got != expected) {
    throw Error(ZF_ERROR_INVALID_VALUE, std::string(name) + ": has " + std::to_string(got) + " entries for " +
                                            std::to_string(expected) + " tensors");
  }
}
// An empty list stands for "none" (a NULL array at the C ABI).
inline const zf_tensor* optional_list(const std::vector<zf_tensor>& list, size_t count, const char* name) {
  if (list.empty()) return nullptr;
  require_same_length(count, list.size(), name);
  return list.data();
}
}  // namespace detail

// One Adam/AdamW step on every tensor; out_params empty for no output copy. steps, lr and
// weight_decay hold one value per tensor.
inline void cpu_adamw_step(const std::vector<zf_tensor>& params, const std::vector<zf_tensor>& exp_avgs,
                           const std::vector<zf_tensor>& exp_avg_sqs, const std::vector<zf_tensor>& grads,
                           const std::vector<zf_tensor>& out_params, const std::vector<int64_t>& steps,
                           const std::vector<double>& lr, const std::vector<double>& weight_decay,
                           const zf_adam_hparams& hparams = adam_hparams(), float grad_scale = 1.0f,
                           uint32_t flags = 0) {
  const size_t count = params.size();
  detail::require_same_length(count, exp_avgs.size(), "exp_avgs");
  detail::require_same_length(count, exp_avg_sqs.size(), "exp_avg_sqs");
  detail::require_same_length(count, grads.size(), "grads");
  detail::require_same_length(count, steps.size(), "steps");
  detail::require_same_length(count, lr.size(), "lr");
  detail::require_same_length(count, weight_decay.size(), "weight_decay");
  check(zf_cpu_adamw_step(params.data(), exp_avgs.data(), exp_avg_sqs.data(), grads.data(),
                          detail::optional_list(out_params, count, "out_params"), count, steps.data(), lr.data(),
                          weight_decay.data(), &hparams, grad_scale, flags));
}

// The step with the fp32 state in flat buffers (zf_cpu_adamw_step_flat): `params` holds the
// fp32 weights updated in place (then master is null), or is empty when `master` holds
// the flat fp32 masters. offsets, out_params (empty: none), steps, lr and weight_decay hold
// one value per tensor (per gradient); sizes too.
inline void cpu_adamw_step_flat(const std::vector<zf_tensor>& params, const zf_tensor* master, const zf_tensor& exp_avg,
                                const zf_tensor& exp_avg_sq, const std::vector<int64_t>& offsets,
                                const std::vector<int64_t>& sizes, const std::vector<zf_tensor>& grads,
                                const std::vector<zf_tensor>& out_params, const std::vector<int64_t>& steps,
                                const std::vector<double>& lr, const std::vector<double>& weight_decay,
                                const zf_adam_hparams& hparams = adam_hparams(), float grad_scale = 1.0f,
                                uint32_t flags = 0) {
  const size_t count = grads.size();
  detail::require_same_length(count, offsets.size(), "offsets");
  detail::require_same_length(count, sizes.size(), "sizes");
  detail::require_same_length(count, steps.size(), "steps");
  detail::require_same_length(count, lr.size(), "lr");
  detail::require_same_length(count, weight_decay.size(), "weight_decay");
  check(zf_cpu_adamw_step_flat(master != nullptr ? nullptr : detail::optional_list(params, count, "params"), master,
                               &exp_avg, &exp_avg_sq, offsets.data(), sizes.data(), grads.data(),
                               detail::optional_list(out_params, count, "out_params"), count, steps.data(), lr.data(),
                               weight_decay.data(), &hparams, grad_scale, flags));
}

// The step on the unselected columns of host-layout matrices. selected empty: nothing is
// selected. The gradient is either `grads` (one per matrix) or `packed_grads` (the other
// empty / null); packed_out may be null.
inline void cpu_adamw_step_skip_columns(const std::vector<zf_column_state>& state,
                                        const std::vector<zf_tensor>& selected, const std::vector<zf_tensor>& grads,
                                        const zf_tensor* packed_grads, const zf_tensor* packed_out,
                                        const std::vector<double>& lr, const std::vector<double>& weight_decay,
                                        const zf_adam_hparams& hparams = adam_hparams(), float grad_scale = 1.0f,
                                        uint32_t flags = 0) {
  const size_t count = state.size();
  detail::require_same_length(count, lr.size(), "lr");
  detail::require_same_length(count, weight_decay.size(), "weight_decay");
  check(zf_cpu_adamw_step_skip_columns(state.data(), detail::optional_list(selected, count, "selected"), count,
                                       detail::optional_list(grads, count, "grads"), packed_grads, packed_out,
                                       lr.data(), weight_decay.data(), &hparams, grad_scale, flags));
}

// accumulators[i] += scale * (matrix i's region of `packed`); selected empty: nothing is
// selected (each region is the accumulator's elements in order).
inline void cpu_accumulate(const std::vector<zf_tensor>& accumulators, const std::vector<zf_tensor>& selected,
                           const zf_tensor& packed, float scale = 1.0f) {
  const size_t count = accumulators.size();
  check(zf_cpu_accumulate(accumulators.data(), detail::optional_list(selected, count, "selected"), count, &packed,
                          scale));
}

// out[i] <- the listed columns of host[i]; host[i] <- in[i] at the listed columns.
inline void cpu_gather_columns(const std::vector<zf_column_state>& host, const std::vector<zf_tensor>& columns,
                               const std::vector<zf_column_state>& out) {
  detail::require_same_length(host.size(), columns.size(), "columns");
  detail::require_same_length(host.size(), out.size(), "out");
  check(zf_cpu_gather_columns(host.data(), columns.data(), host.size(), out.data()));
}

inline void cpu_scatter_columns(const std::vector<zf_column_state>& in, const std::vector<zf_tensor>& columns,
                                const std::vector<zf_column_state>& host) {
  detail::require_same_length(host.size(), columns.size(), "columns");
  detail::require_same_length(host.size(), in.size(), "in");
  check(zf_cpu_scatter_columns(in.data(), columns.data(), host.size(), host.data()));
}

}  // namespace zenflow

// ---- the engine (see zenflow/engine.h for the contract) ----
#include <array>
#include <cstdint>
#include <utility>

#include "zenflow/engine.h"

namespace zenflow {

// A saved engine state with its own storage (one buffer per layout entry).
struct EngineState {
  std::vector<zf_engine_state_entry> layout;
  std::vector<std::vector<uint64_t>> storage;  // 8-byte aligned bytes of each buffer
  std::array<int64_t, ZF_ENGINE_STATE_COUNTERS> counters{};
  double loss_scale = 1.0;

  void* data(size_t i) { return storage[i].data(); }
  std::vector<zf_tensor> tensors() {
    std::vector<zf_tensor> out;
    for (size_t i = 0; i < layout.size(); ++i) {
      const zf_engine_state_entry& e = layout[i];
      out.push_back(contiguous_tensor(data(i), e.dtype, std::vector<int64_t>(e.shape, e.shape + e.ndim)));
    }
    return out;
  }
};

// Move-only owner of a zf_engine.
class Engine {
 public:
  // param_groups[i]: the group of params[i].
  Engine(const std::vector<zf_tensor>& params, const std::vector<int32_t>& param_groups,
         const std::vector<zf_engine_group>& groups, const zf_engine_config& config = zf_engine_config_default()) {
    if (param_groups.size() != params.size())
      throw Error(ZF_ERROR_INVALID_VALUE, "param_groups: length differs from params");
    check(zf_engine_create(params.data(), param_groups.data(), params.size(), groups.data(), groups.size(), &config,
                           &engine_));
  }
  // Takes ownership of a handle from zf_engine_create (destroyed with the object).
  explicit Engine(zf_engine* engine) noexcept : engine_(engine) {}
  ~Engine() { reset(); }
  Engine(Engine&& other) noexcept : engine_(std::exchange(other.engine_, nullptr)) {}
  Engine& operator=(Engine&& other) noexcept {
    if (this != &other) {
      reset();
      engine_ = std::exchange(other.engine_, nullptr);
    }
    return *this;
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Destroys the engine now (joins its host lane).
  void reset() noexcept {
    if (engine_ != nullptr) zf_engine_destroy(engine_);
    engine_ = nullptr;
  }
  zf_engine* get() const { return engine_; }

  size_t device_memory_size() const {
    size_t bytes = 0;
    check(zf_engine_device_memory_size(engine_, &bytes));
    return bytes;
  }
  void attach_device_memory(void* memory, size_t bytes) {
    check(zf_engine_attach_device_memory(engine_, memory, bytes));
  }
  // CUDA backend: the compute stream of later calls (a cudaStream_t; nullptr = default).
  void set_stream(zf_stream stream) { check(zf_engine_set_stream(engine_, stream)); }

  // Several devices (engine.h): their number, each one's place and memory size, and the
  // per-device forms of attach_device_memory and set_stream.
  size_t device_count() const {
    size_t count = 0;
    check(zf_engine_device_count(engine_, &count));
    return count;
  }
  std::pair<zf_device, size_t> device_at(size_t index) const {
    zf_device device{};
    size_t bytes = 0;
    check(zf_engine_device_at(engine_, index, &device, &bytes));
    return {device, bytes};
  }
  void attach_device_memory_at(size_t index, void* memory, size_t bytes) {
    check(zf_engine_attach_device_memory_at(engine_, index, memory, bytes));
  }
  void set_stream_at(size_t index, zf_stream stream) { check(zf_engine_set_stream_at(engine_, index, stream)); }

  // The stream passed with each call: `engine.on(stream).step(grads)` sets the compute stream
  // (of every device, or per device: on({s0, s1})) and returns the engine for the call. The
  // stream stays set for later calls that pass none (zf_engine_set_stream's rule).
  Engine& on(zf_stream stream) {
    const size_t count = device_count();
    for (size_t d = 0; d < count; ++d) set_stream_at(d, stream);
    return *this;
  }
  Engine& on(const std::vector<zf_stream>& per_device) {
    detail::require_same_length(device_count(), per_device.size(), "per_device streams");
    for (size_t d = 0; d < per_device.size(); ++d) set_stream_at(d, per_device[d]);
    return *this;
  }

  // Data parallel (zf_engine_set_collectives): the table must outlive the engine's use of it
  // (until destroy, or the next set_collectives).
  void set_collectives(const zf_engine_collectives& collectives) {
    check(zf_engine_set_collectives(engine_, &collectives));
  }
  // Data parallel (zf_engine_refuse): this rank refuses `call` before making it.
  void refuse(zf_engine_call call) { check(zf_engine_refuse(engine_, call)); }
  // zf_engine_check_params: each parameter's data pointer now (a swapped storage is an error).
  void check_params(const std::vector<const void*>& data) const {
    check(zf_engine_check_params(engine_, data.data(), data.size()));
  }

  // lrs empty: each group's own lr.
  void step(const std::vector<zf_tensor>& grads, const std::vector<double>& lrs = {}) {
    check(zf_engine_step(engine_, grads.data(), grads.size(), lrs.empty() ? nullptr : lrs.data(), lrs.size()));
  }
  void begin_step(const std::vector<double>& lrs = {}) {
    check(zf_engine_begin_step(engine_, lrs.empty() ? nullptr : lrs.data(), lrs.size()));
  }
  void submit(size_t first, const std::vector<zf_tensor>& grads) {
    check(zf_engine_submit(engine_, first, grads.data(), grads.size()));
  }
  void end_step() { check(zf_engine_end_step(engine_)); }
  // Readiness in a split step (zf_engine_mark_ready): params[index]'s gradient is ready.
  void mark_ready(size_t index, const zf_tensor& grad) { check(zf_engine_mark_ready(engine_, index, &grad)); }
  // release_gradients (zf_engine_take_released): the parameters released since the last call.
  std::vector<size_t> take_released(size_t param_count) {
    std::vector<size_t> indices(param_count);
    size_t count = 0;
    check(zf_engine_take_released(engine_, indices.data(), indices.size(), &count));
    indices.resize(count);
    return indices;
  }
  // Ends a split step with every parameter's final gradient (zf_engine_end_step_with; a
  // released parameter's entry is not read: its data may be NULL).
  void end_step_with(const std::vector<zf_tensor>& grads) {
    check(zf_engine_end_step_with(engine_, grads.data(), grads.size()));
  }
  void abort_step() { check(zf_engine_abort_step(engine_)); }
  void flush() { check(zf_engine_flush(engine_)); }
  // Betas, eps and (when not empty) each group's weight decay of later steps
  // (zf_engine_set_hyperparameters: no flush).
  void set_hyperparameters(double beta1, double beta2, double eps, const std::vector<double>& weight_decays = {}) {
    check(zf_engine_set_hyperparameters(engine_, beta1, beta2, eps,
                                        weight_decays.empty() ? nullptr : weight_decays.data(), weight_decays.size()));
  }

  zf_engine_stats stats() const {
    zf_engine_stats s{};
    check(zf_engine_get_stats(engine_, &s));
    return s;
  }
  double loss_scale() const {
    double scale = 0.0;
    check(zf_engine_loss_scale(engine_, &scale));
    return scale;
  }

  std::vector<zf_engine_state_entry> state_layout() const {
    size_t count = 0;
    check(zf_engine_state_layout(engine_, nullptr, &count));
    std::vector<zf_engine_state_entry> layout(count);
    check(zf_engine_state_layout(engine_, layout.data(), &count));
    return layout;
  }
  // Copies the state out (closes no window: zf_engine_save_state).
  EngineState save_state() {
    EngineState state;
    state.layout = state_layout();
    for (const zf_engine_state_entry& e : state.layout) state.storage.emplace_back((e.bytes + 7) / 8 + 1);
    const std::vector<zf_tensor> buffers = state.tensors();
    check(zf_engine_save_state(engine_, buffers.data(), buffers.size(), state.counters.data(), &state.loss_scale));
    return state;
  }
  // Testing (engine.h): the host lane's next piece of work fails with `message`.
  void inject_host_lane_fault_for_testing(const char* message) {
    check(zf_engine_inject_host_lane_fault_for_testing(engine_, message));
  }

  void load_state(EngineState& state) {
    const std::vector<zf_tensor> buffers = state.tensors();
    check(zf_engine_load_state(engine_, buffers.data(), buffers.size(), state.counters.data(), state.loss_scale));
  }

 private:
  zf_engine* engine_ = nullptr;
};

}  // namespace zenflow
