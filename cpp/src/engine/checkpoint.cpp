// The checkpoint (zenflow/engine.h): the state in the parameters' own layout, independent of
// which columns sit on which side. Save waits for the host lane and changes nothing (the open
// window's accumulators and a pending host result are part of the state); load validates
// everything before it changes anything.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.hpp"
#include "common/float_convert.hpp"
#include "common/matrix_view.hpp"
#include "common/tensor.hpp"
#include "engine/engine.hpp"

namespace zf {
namespace {

const char* kind_name(zf_engine_state_kind kind) { return zf_engine_state_kind_name(kind); }

// Calls visit(local, position) for each of a rank's `own_cols` columns not in `own_selected`
// (ascending, local indices), in order: its local index and its place in the deferred host
// layout.
template <class Visit>
void for_each_deferred_column(int64_t own_cols, const std::vector<int32_t>& own_selected, const Visit& visit) {
  size_t next_selected = 0;
  int64_t position = 0;
  for (int64_t local = 0; local < own_cols; ++local) {
    if (next_selected < own_selected.size() && own_selected[next_selected] == local) {
      ++next_selected;
      continue;
    }
    visit(local, position++);
  }
}

zf_engine_state_entry entry(size_t param, zf_engine_state_kind kind, zf_dtype dtype, int32_t ndim,
                            const int64_t* shape) {
  zf_engine_state_entry e{};
  e.param = static_cast<int32_t>(param);
  e.kind = kind;
  e.dtype = dtype;
  e.ndim = ndim;
  size_t elements = 1;
  for (int d = 0; d < ndim; ++d) {
    e.shape[d] = shape[d];
    elements *= static_cast<size_t>(shape[d]);
  }
  e.bytes = elements * zf_dtype_size(dtype);
  return e;
}

float widen(const void* data, zf_dtype dtype, int64_t i) {
  if (dtype == ZF_DTYPE_BF16) return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
  if (dtype == ZF_DTYPE_F16) return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
  return static_cast<const float*>(data)[i];
}

}  // namespace

std::vector<zf_engine_state_entry> Engine::state_layout() const { return layout_entries(true); }

std::vector<zf_engine_state_entry> param_state_entries(size_t name, const zf_tensor& param, bool matrix, int64_t k) {
  std::vector<zf_engine_state_entry> out;
  for (zf_engine_state_kind kind : {ZF_STATE_MASTER, ZF_STATE_EXP_AVG, ZF_STATE_EXP_AVG_SQ})
    out.push_back(entry(name, kind, ZF_DTYPE_F32, param.ndim, param.shape));
  if (!matrix) {
    const int64_t one = 1;
    out.push_back(entry(name, ZF_STATE_STEPS, ZF_DTYPE_I32, 1, &one));
    return out;
  }
  const int64_t cols = matrix_view(param).cols, score[2] = {2, cols}, two = 2;
  out.push_back(entry(name, ZF_STATE_STEPS, ZF_DTYPE_I32, 1, &cols));
  out.push_back(entry(name, ZF_STATE_SELECTED, ZF_DTYPE_I32, 1, &k));
  out.push_back(entry(name, ZF_STATE_WINDOW_SCORE, ZF_DTYPE_F32, 2, score));
  out.push_back(entry(name, ZF_STATE_WINDOW_ENERGY, ZF_DTYPE_F32, 1, &two));
  out.push_back(entry(name, ZF_STATE_ACCUMULATOR, ZF_DTYPE_F32, param.ndim, param.shape));
  return out;
}

std::vector<zf_engine_state_entry> Engine::layout_entries(bool group_names) const {
  std::vector<zf_engine_state_entry> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    const int64_t k = p.matrix ? static_cast<int64_t>(matrices_[p.index].selected.size()) : 0;
    const std::vector<zf_engine_state_entry> entries =
        param_state_entries(group_names ? param_name(i) : i, p.tensor, p.matrix, k);
    out.insert(out.end(), entries.begin(), entries.end());
  }
  return out;
}

void Engine::save_state(const zf_tensor* buffers, size_t count, int64_t* counters, double* loss_scale) {
  agree(Agreement::kSave, [&] { check_save_arguments(buffers, count, counters, loss_scale); });
  initialize_state();
  {
    // Data parallel: a failure found while waiting is agreed on below, with the others.
    const ParallelStepScope scope(*this);
    quiesce_host_lane();
  }
  agree(Agreement::kSave, [&] { check_usable(); });
  write_state(buffers, counters, loss_scale);
}

void Engine::check_save_arguments(const zf_tensor* buffers, size_t count, const int64_t* counters,
                                  const double* loss_scale) {
  require(!in_split_step_, ZF_ERROR_INVALID_VALUE, "save_state: a split step is open");
  require(counters != nullptr && loss_scale != nullptr, ZF_ERROR_INVALID_VALUE, "counters, loss_scale: NULL");
  const std::vector<zf_engine_state_entry> layout = state_layout();
  require(count == layout.size(), ZF_ERROR_INVALID_VALUE, "buffers: ", count, " buffers for a state of ", layout.size(),
          " entries");
  require(count == 0 || buffers != nullptr, ZF_ERROR_INVALID_VALUE, "buffers: NULL");
  for (size_t e = 0; e < count; ++e) {
    const ArgName name("buffers", buffer_name(e));
    check_descriptor(&buffers[e], name);
    check_cpu(buffers[e], name);
    check_dtype(buffers[e], name, {layout[e].dtype});
    check_contiguous(buffers[e], name);
    bool same = buffers[e].ndim == layout[e].ndim;
    for (int d = 0; same && d < layout[e].ndim; ++d) same = buffers[e].shape[d] == layout[e].shape[d];
    require(same, ZF_ERROR_INVALID_VALUE, name, ": shape differs from the layout of params[", layout[e].param, "] ",
            kind_name(layout[e].kind));
  }
  poll_host_lane();
}

void Engine::write_state(const zf_tensor* buffers, int64_t* counters, double* loss_scale) {
  // The device state, read on the host: in place (host backend) or from a copy.
  std::vector<uint8_t> mirror;
  if (!backend_->host_visible()) {
    mirror.resize(device_state_bytes_);
    download(mirror.data(), arena_.base(), device_state_bytes_);
  }
  const uint8_t* state = backend_->host_visible() ? arena_.base() : mirror.data();
  auto state_float = [state](size_t offset) { return reinterpret_cast<const float*>(state + offset); };
  auto state_int = [state](size_t offset) { return reinterpret_cast<const int32_t*>(state + offset); };
  size_t e = 0;
  for (const Param& p : params_) {
    // The weights are read only where they are the master (no fp32 master on the device).
    const bool master_on_device = p.matrix ? matrices_[p.index].has_master : dense_[p.index].has_master;
    const std::vector<uint8_t> weights_copy =
        master_on_device ? std::vector<uint8_t>{} : download_param(static_cast<size_t>(&p - params_.data()));
    const void* weights = weights_copy.empty() ? p.tensor.data : weights_copy.data();
    float* master = static_cast<float*>(buffers[e].data);
    float* exp_avg = static_cast<float*>(buffers[e + 1].data);
    float* exp_avg_sq = static_cast<float*>(buffers[e + 2].data);
    int32_t* steps = static_cast<int32_t*>(buffers[e + 3].data);
    if (!p.matrix && rank_ != 0) {  // data parallel: rank 0 writes the dense parameters
      for (size_t b = e; b < e + 4; ++b) std::memset(buffers[b].data, 0, static_cast<size_t>(numel(buffers[b])) * 4);
      e += 4;
      continue;
    }
    if (!p.matrix) {
      const Dense& d = dense_[p.index];
      for (int64_t i = 0; i < p.numel; ++i)
        master[i] = d.has_master ? state_float(d.dev_master)[i] : widen(weights, p.tensor.dtype, i);
      std::memcpy(exp_avg, state_float(d.dev_exp_avg), static_cast<size_t>(p.numel) * 4);
      std::memcpy(exp_avg_sq, state_float(d.dev_exp_avg_sq), static_cast<size_t>(p.numel) * 4);
      steps[0] = state_int(d.dev_steps)[0];
      e += 4;
      continue;
    }
    const Matrix& m = matrices_[p.index];
    const int64_t rows = m.rows, cols = m.cols, k = static_cast<int64_t>(m.selected.size());
    const int64_t lo = m.own_lo, hi = m.own_lo + m.own_cols;
    float* accumulator = static_cast<float*>(buffers[e + 7].data);
    // The open window's accumulator; one that holds nothing of it (it is not zeroed after
    // an update) is saved as zeros, as are the selected columns' entries, which no
    // accumulate touches.
    const bool holds_window = window_.steps() > 0 && m.acc_fresh[window_.filling()] == 0;
    const StreamedVector<float>& acc = m.acc[window_.filling()];
    if (parallel()) {  // the columns of other ranks: zeros
      for (size_t b = e; b < e + 8; ++b) std::memset(buffers[b].data, 0, static_cast<size_t>(numel(buffers[b])) * 4);
    }
    // The deferred host layout [own_deferred, rows] -> [rows, cols]; the selected columns are
    // written from the compact state below.
    for_each_deferred_column(m.own_cols, m.own_selected, [&](int64_t local, int64_t position) {
      const int64_t j = lo + local;
      for (int64_t r = 0; r < rows; ++r) {
        master[r * cols + j] = m.master[position * rows + r];
        exp_avg[r * cols + j] = m.exp_avg[position * rows + r];
        exp_avg_sq[r * cols + j] = m.exp_avg_sq[position * rows + r];
        accumulator[r * cols + j] = holds_window ? acc[position * rows + r] : 0.0f;
      }
      steps[j] = m.steps[position];
    });
    for (int64_t c = 0; c < k; ++c) {  // the selected columns live in the compact state [rows, k]
      const int64_t j = m.selected[c];
      if (j < lo || j >= hi) continue;
      for (int64_t r = 0; r < rows; ++r) {
        master[r * cols + j] =
            m.has_master ? state_float(m.dev_master)[r * k + c] : widen(weights, p.tensor.dtype, r * cols + j);
        exp_avg[r * cols + j] = state_float(m.dev_exp_avg)[r * k + c];
        exp_avg_sq[r * cols + j] = state_float(m.dev_exp_avg_sq)[r * k + c];
        accumulator[r * cols + j] = 0.0f;
      }
      steps[j] = state_int(m.dev_steps)[c];
    }
    if (rank_ == 0) {  // the same on every rank: rank 0 writes them
      std::copy(m.selected.begin(), m.selected.end(), static_cast<int32_t*>(buffers[e + 4].data));
      std::copy(m.window_score.begin(), m.window_score.end(), static_cast<float*>(buffers[e + 5].data));
      std::copy(m.energy, m.energy + 2, static_cast<float*>(buffers[e + 6].data));
    }
    e += 8;
  }
  schedule_.save(counters);
  counters[ZF_COUNTER_GROWTH_TRACKER] = growth_tracker_;
  counters[ZF_COUNTER_SKIPPED] = skipped_steps_;
  counters[ZF_COUNTER_STEPS_ACCUMULATED] = window_.steps();
  counters[ZF_COUNTER_UPDATE_PENDING] = window_.pending() ? 1 : 0;
  counters[ZF_COUNTER_HYSTERESIS] = hysteresis_count_;
  *loss_scale = loss_scale_;
}

void Engine::load_state(const zf_tensor* buffers, size_t count, const int64_t* counters, double loss_scale) {
  // Data parallel: a state refused on one rank is refused on all, so no rank loads alone.
  agree(Agreement::kLoad, [&] { check_load_arguments(buffers, count, counters, loss_scale); });
  apply_load(buffers, counters, loss_scale);
}

void Engine::check_load_arguments(const zf_tensor* buffers, size_t count, const int64_t* counters,
                                  double loss_scale) const {
  require(!in_split_step_, ZF_ERROR_INVALID_VALUE, "load_state: a split step is open");
  require(counters != nullptr, ZF_ERROR_INVALID_VALUE, "counters: NULL");
  const std::vector<zf_engine_state_entry> layout = layout_entries(false);  // local indices
  require(count == layout.size(), ZF_ERROR_INVALID_VALUE, "buffers: ", count, " buffers, but this engine's state has ",
          layout.size(), " entries (a state of another model?)");
  require(count == 0 || buffers != nullptr, ZF_ERROR_INVALID_VALUE, "buffers: NULL");
  // Validate everything first.
  for (size_t e = 0; e < count; ++e) {
    const ArgName name("buffers", buffer_name(e));
    const zf_engine_state_entry& want = layout[e];
    check_descriptor(&buffers[e], name);
    check_cpu(buffers[e], name);
    check_dtype(buffers[e], name, {want.dtype});
    check_contiguous(buffers[e], name);
    const zf_tensor& b = buffers[e];
    const Param& p = params_[static_cast<size_t>(want.param)];
    const size_t param = param_name(static_cast<size_t>(want.param));
    if (want.kind == ZF_STATE_SELECTED) {
      check_ndim(b, name, 1);
      const int64_t k = b.shape[0];
      require(k <= p.cols, ZF_ERROR_INVALID_VALUE, name, ": params[", param, "] selected holds ", k,
              " columns, the matrix has ", p.cols, " (a state of another model?)");
      const auto* s = static_cast<const int32_t*>(b.data);
      for (int64_t c = 0; c < k; ++c)
        require(s[c] >= 0 && s[c] < p.cols && (c == 0 || s[c] > s[c - 1]), ZF_ERROR_INVALID_VALUE, name, ": params[",
                param, "] selected is not strictly increasing in [0, ", p.cols, ")");
      continue;
    }
    bool same = b.ndim == want.ndim;
    for (int d = 0; same && d < want.ndim; ++d) same = b.shape[d] == want.shape[d];
    require(same, ZF_ERROR_INVALID_VALUE, name, ": params[", param, "] ", kind_name(want.kind),
            " has another shape than this engine's (a state of another model?)");
    if (want.kind == ZF_STATE_STEPS) {
      // A count the next step could not increment (INT32_MAX) is refused here, as any later
      // step would be (check_counters_have_room).
      const auto* s = static_cast<const int32_t*>(b.data);
      for (int64_t j = 0; j < numel(b); ++j)
        require(s[j] >= 0 && s[j] < INT32_MAX, ZF_ERROR_INVALID_VALUE, name, ": params[", param, "] steps[", j,
                "] = ", s[j], " is out of range (Adam step counts are in [0, INT32_MAX): one more step must fit)");
    }
  }
  schedule_.check(counters);
  require(counters[ZF_COUNTER_GROWTH_TRACKER] >= 0 && counters[ZF_COUNTER_GROWTH_TRACKER] < config_.growth_interval,
          ZF_ERROR_INVALID_VALUE, "counters[", int{ZF_COUNTER_GROWTH_TRACKER}, "]: out of range");
  require(counters[ZF_COUNTER_SKIPPED] >= 0 && counters[ZF_COUNTER_SKIPPED] < INT64_MAX, ZF_ERROR_INVALID_VALUE,
          "counters[", int{ZF_COUNTER_SKIPPED}, "]: ", counters[ZF_COUNTER_SKIPPED],
          " skipped steps is out of range [0, INT64_MAX)");
  require(counters[ZF_COUNTER_STEPS_ACCUMULATED] >= 0 && counters[ZF_COUNTER_STEPS_ACCUMULATED] < INT32_MAX,
          ZF_ERROR_INVALID_VALUE, "counters[", int{ZF_COUNTER_STEPS_ACCUMULATED}, "]: steps accumulated out of range");
  require(counters[ZF_COUNTER_UPDATE_PENDING] == 0 || counters[ZF_COUNTER_UPDATE_PENDING] == 1, ZF_ERROR_INVALID_VALUE,
          "counters[", int{ZF_COUNTER_UPDATE_PENDING}, "]: must be 0 or 1");
  // Into an engine with a smaller hysteresis: refused like a growth tracker past its interval.
  require(counters[ZF_COUNTER_HYSTERESIS] >= 0 && counters[ZF_COUNTER_HYSTERESIS] < config_.hysteresis,
          ZF_ERROR_INVALID_VALUE, "counters[", int{ZF_COUNTER_HYSTERESIS}, "]: ", counters[ZF_COUNTER_HYSTERESIS],
          " overflows in the hysteresis, this engine's hysteresis is ", config_.hysteresis);
  require(std::isfinite(loss_scale) && loss_scale > 0.0, ZF_ERROR_INVALID_VALUE, "loss_scale: must be finite and > 0");
}

void Engine::apply_load(const zf_tensor* buffers, const int64_t* counters, double loss_scale) {
  // Quiesce the host lane, dropping whatever it held (its errors included).
  for (auto& job : ring_.take_jobs()) {
    if (job) {
      try {
        job->wait();
      } catch (...) {
      }
    }
  }
  if (window_.job()) {
    try {
      window_.job()->wait();
    } catch (...) {
    }
    window_.forget_job();
  }
  backend_->synchronize();  // nothing in flight reads or writes the device state below
  scalar_readback_.clear();
  ring_.forget_copies();
  last_scatter_.reset();
  window_.forget_uploaded();
  ensure_device_memory();
  ensure_host_memory();
  initialized_ = true;
  schedule_.load(counters);
  // The device state is written on the host: in place (host backend) or into a copy that
  // goes up at the end.
  std::vector<uint8_t> mirror;
  if (!backend_->host_visible()) mirror.assign(device_state_bytes_, 0);
  uint8_t* state = backend_->host_visible() ? arena_.base() : mirror.data();
  auto state_float = [state](size_t offset) { return reinterpret_cast<float*>(state + offset); };
  auto state_int = [state](size_t offset) { return reinterpret_cast<int32_t*>(state + offset); };
  bool reselect = false;
  step_count_bound_ = 0;
  size_t e = 0;
  for (const Param& p : params_) {
    // Every count of the state (data parallel: of every rank's columns, so that all ranks
    // bound their counts alike), checked below INT32_MAX above.
    const auto* counts = static_cast<const int32_t*>(buffers[e + 3].data);
    for (int64_t j = 0; j < numel(buffers[e + 3]); ++j)
      step_count_bound_ = std::max<int64_t>(step_count_bound_, counts[j]);
    const auto* master = static_cast<const float*>(buffers[e].data);
    const auto* exp_avg = static_cast<const float*>(buffers[e + 1].data);
    const auto* exp_avg_sq = static_cast<const float*>(buffers[e + 2].data);
    const auto* steps = static_cast<const int32_t*>(buffers[e + 3].data);
    if (!p.matrix) {
      const Dense& d = dense_[p.index];
      if (d.has_master) std::memcpy(state_float(d.dev_master), master, static_cast<size_t>(p.numel) * 4);
      std::memcpy(state_float(d.dev_exp_avg), exp_avg, static_cast<size_t>(p.numel) * 4);
      std::memcpy(state_float(d.dev_exp_avg_sq), exp_avg_sq, static_cast<size_t>(p.numel) * 4);
      state_int(d.dev_steps)[0] = steps[0];
      e += 4;
      continue;
    }
    Matrix& m = matrices_[p.index];
    const int64_t rows = m.rows, cols = m.cols;
    const zf_tensor& sel = buffers[e + 4];
    const auto* saved = static_cast<const int32_t*>(sel.data);
    const int64_t k_saved = sel.shape[0];
    const int64_t k_expected = schedule_.selections() > 0 ? m.k : 0;
    if (k_saved == k_expected) {
      m.selected.assign(saved, saved + k_saved);
      const int64_t k = k_saved;
      for (int64_t c = 0; c < k; ++c) {
        const int64_t j = m.selected[c];
        for (int64_t r = 0; r < rows; ++r) {
          if (m.has_master) state_float(m.dev_master)[r * k + c] = master[r * cols + j];
          state_float(m.dev_exp_avg)[r * k + c] = exp_avg[r * cols + j];
          state_float(m.dev_exp_avg_sq)[r * k + c] = exp_avg_sq[r * cols + j];
        }
        state_int(m.dev_steps)[c] = steps[j];
      }
    } else {
      // The saved selection does not fit this engine (another topk_ratio): the whole state
      // goes to the host, and the next step selects anew.
      m.selected.clear();
      reselect = true;
    }
    // This rank's deferred columns, with the open window's sums, into the deferred host layout.
    set_own_selected(m);
    const auto* accumulator = static_cast<const float*>(buffers[e + 7].data);
    for_each_deferred_column(m.own_cols, m.own_selected, [&](int64_t local, int64_t position) {
      const int64_t j = m.own_lo + local;
      for (int64_t r = 0; r < rows; ++r) {
        m.master[position * rows + r] = master[r * cols + j];
        m.exp_avg[position * rows + r] = exp_avg[r * cols + j];
        m.exp_avg_sq[position * rows + r] = exp_avg_sq[r * cols + j];
        m.acc[0][position * rows + r] = accumulator[r * cols + j];
      }
      m.steps[position] = steps[j];
    });
    std::fill(m.acc[1].begin(), m.acc[1].end(), 0.0f);
    std::copy_n(static_cast<const float*>(buffers[e + 5].data), 2 * cols, m.window_score.begin());
    std::copy_n(static_cast<const float*>(buffers[e + 6].data), 2, m.energy);
    e += 8;
  }
  if (!mirror.empty()) upload(arena_.base(), mirror.data(), device_state_bytes_);
  for (Matrix& m : matrices_) upload_selection(m);
  if (reselect) schedule_.force_selection();
  growth_tracker_ = counters[ZF_COUNTER_GROWTH_TRACKER];
  skipped_steps_ = counters[ZF_COUNTER_SKIPPED];
  loss_scale_ = config_.loss_scaling == ZF_LOSS_SCALING_DYNAMIC ? loss_scale : 1.0;
  window_.restore(counters[ZF_COUNTER_STEPS_ACCUMULATED], counters[ZF_COUNTER_UPDATE_PENDING] != 0);
  hysteresis_count_ = counters[ZF_COUNTER_HYSTERESIS];
  sticky_ = false;
  sticky_message_.clear();
  rebuild_plans();
  // A pending host result is the deferred columns' master: its upload copy is rebuilt, and
  // the next window close applies it as it would have been.
  if (window_.pending()) {
    for (Matrix& m : matrices_) write_upload_from_master(m);
  }
}

void Engine::write_upload_from_master(Matrix& m) {
  // U holds this rank's deferred columns, ascending, each column's rows contiguous, in the
  // parameter's dtype, rounded as the host update rounds its output.
  const zf_dtype dtype = params_[m.param].tensor.dtype;
  uint8_t* out = upload_copy(window_.result_buffer()) + m.upload_offset;
  // The host master is in the same layout: element for element.
  const auto elements = static_cast<size_t>(m.own_deferred() * m.rows);
  for (size_t position = 0; position < elements; ++position) {
    const float value = m.master[position];
    if (dtype == ZF_DTYPE_BF16) {
      reinterpret_cast<uint16_t*>(out)[position] = f32_to_bf16(value);
    } else if (dtype == ZF_DTYPE_F16) {
      reinterpret_cast<uint16_t*>(out)[position] = f32_to_f16(value);
    } else {
      reinterpret_cast<float*>(out)[position] = value;
    }
  }
}

}  // namespace zf

extern "C" ZF_API const char* zf_engine_state_kind_name(zf_engine_state_kind kind) {
  int raw = 0;  // an out-of-range value passed by value: read the integer, never the enum
  static_assert(sizeof(kind) == sizeof(raw), "C enums are int-sized");
  std::memcpy(&raw, &kind, sizeof(raw));
  switch (raw) {
    case ZF_STATE_MASTER:
      return "master";
    case ZF_STATE_EXP_AVG:
      return "exp_avg";
    case ZF_STATE_EXP_AVG_SQ:
      return "exp_avg_sq";
    case ZF_STATE_STEPS:
      return "steps";
    case ZF_STATE_SELECTED:
      return "selected";
    case ZF_STATE_WINDOW_SCORE:
      return "window_score";
    case ZF_STATE_WINDOW_ENERGY:
      return "window_energy";
    case ZF_STATE_ACCUMULATOR:
      return "accumulator";
    default:
      return "unknown";
  }
}
