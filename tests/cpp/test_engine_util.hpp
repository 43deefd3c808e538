// Helpers of the engine tests: parameters and gradients in any dtype, and a float64
// reference of the algorithm (docs/design.md sections 2 and 3) written as plain loops,
// independent of the engine's code: every column's state lives in one full array, so a
// re-selection moves nothing, which is exactly what "lossless" must reproduce.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "common/float_convert.hpp"
#include "zenflow/zenflow.hpp"

namespace zf_engine_test {

struct HostTensor {
  zf_dtype dtype = ZF_DTYPE_F32;
  std::vector<int64_t> shape;
  std::vector<float> f32;
  std::vector<uint16_t> half;

  HostTensor() = default;
  HostTensor(zf_dtype d, std::vector<int64_t> s) : dtype(d), shape(std::move(s)) {
    const size_t n = static_cast<size_t>(numel());
    if (dtype == ZF_DTYPE_F32) {
      f32.assign(n, 0.0f);
    } else {
      half.assign(n, 0);
    }
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  int64_t rows() const { return shape.size() >= 2 ? shape[0] : 1; }
  int64_t cols() const { return numel() / rows(); }
  void* data() { return dtype == ZF_DTYPE_F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(half.data()); }
  zf_tensor tensor() { return zenflow::contiguous_tensor(data(), dtype, shape); }
  double get(int64_t i) const {
    if (dtype == ZF_DTYPE_F32) return f32[static_cast<size_t>(i)];
    if (dtype == ZF_DTYPE_BF16) return zf::bf16_to_f32(half[static_cast<size_t>(i)]);
    return zf::f16_to_f32(half[static_cast<size_t>(i)]);
  }
  void set(int64_t i, float v) {
    if (dtype == ZF_DTYPE_F32) {
      f32[static_cast<size_t>(i)] = v;
    } else if (dtype == ZF_DTYPE_BF16) {
      half[static_cast<size_t>(i)] = zf::f32_to_bf16(v);
    } else {
      half[static_cast<size_t>(i)] = zf::f32_to_f16(v);
    }
  }
  std::vector<double> values() const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = get(i);
    return out;
  }
  bool bitwise_equal(const HostTensor& o) const { return f32 == o.f32 && half == o.half; }
};

// A small model: matrices of odd shapes (a 3-D one, a 1xN and an Nx1), a bias, a dense
// matrix, two groups.
struct Model {
  std::vector<HostTensor> params;
  std::vector<int32_t> param_groups;
  std::vector<zf_engine_group> groups;

  std::vector<zf_tensor> tensors() {
    std::vector<zf_tensor> out;
    for (auto& p : params) out.push_back(p.tensor());
    return out;
  }
  bool matrix(size_t i) const { return params[i].shape.size() >= 2 && groups[param_groups[i]].dense == 0; }
};

inline Model standard_model(zf_dtype dtype = ZF_DTYPE_F32, uint64_t seed = 1) {
  Model m;
  m.groups = {zf_engine_group{1e-2, 0.1, 0}, zf_engine_group{3e-3, 0.0, 0}, zf_engine_group{5e-3, 0.05, 1}};
  const std::vector<std::vector<int64_t>> shapes = {{7, 11}, {5, 3, 4}, {13, 1}, {11}, {1, 9}, {3, 5}};
  m.param_groups = {0, 1, 0, 0, 1, 2};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const auto& s : shapes) {
    HostTensor t(dtype, s);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, uniform(rng));
    m.params.push_back(std::move(t));
  }
  return m;
}

// Gradients of step t: normal values, plus (when rotate) a boost of a few columns that
// moves every `period` steps, so that top-k selections change.
inline std::vector<HostTensor> make_grads(const Model& model, int64_t t, bool rotate = false, int64_t period = 4) {
  std::vector<HostTensor> out;
  for (size_t i = 0; i < model.params.size(); ++i) {
    const HostTensor& p = model.params[i];
    HostTensor g(p.dtype, p.shape);
    std::mt19937_64 rng(static_cast<uint64_t>(t) * 1000003ull + i * 7919ull + 17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t cols = p.cols();
    for (int64_t e = 0; e < g.numel(); ++e) {
      float v = normal(rng);
      if (rotate && ((e % cols) + t / period) % 4 == 0) v *= 4.0f;
      g.set(e, v);
    }
    out.push_back(std::move(g));
  }
  return out;
}

inline std::vector<zf_tensor> tensors_of(std::vector<HostTensor>& list) {
  std::vector<zf_tensor> out;
  for (auto& t : list) out.push_back(t.tensor());
  return out;
}

inline zf_engine_config test_config() {
  zf_engine_config c = zf_engine_config_default();
  c.compute_threads = 1;
  c.host_threads = 1;
  // Windows from step 1: the synchronous start's detection has its own tests (EngineStart).
  c.auto_warm_up_rounds = 0;
  return c;
}

// ---- the float64 reference ----

struct RefConfig {
  double topk_ratio = 0.1;
  int64_t update_interval = 4;
  bool overlap = true;
  int64_t update_lag = 0;  // 0: an overlapped result lands at the next close
  int64_t warm_up = 0;
  int64_t select_interval = 0;  // strategy "step"; 0: select once
  double max_grad_norm = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // A window's host update: one plain step (NONE), or standing for the window's S steps: lr
  // times sqrt(S) (SQRT) or S (LINEAR), moments decayed by beta^S, counts + S, AdamW's decay
  // (1 - lr wd)^S.
  zf_window_scaling window_scaling = ZF_WINDOW_SCALING_SQRT;
};

class Reference {
 public:
  Reference(const Model& model, const RefConfig& config) : config_(config) {
    for (size_t i = 0; i < model.params.size(); ++i) {
      P p;
      p.matrix = model.matrix(i);
      p.rows = model.params[i].rows();
      p.cols = model.params[i].cols();
      if (p.matrix) {
        const int64_t k = static_cast<int64_t>(std::floor(config.topk_ratio * static_cast<double>(p.cols)));
        p.k = config.topk_ratio == 0.0 ? 0 : std::min(p.cols, std::max<int64_t>(1, k));
      }
      p.group = model.param_groups[i];
      p.weight_decay = model.groups[static_cast<size_t>(p.group)].weight_decay;
      p.W = model.params[i].values();
      p.master = p.W;
      p.m.assign(p.W.size(), 0.0);
      p.v.assign(p.W.size(), 0.0);
      p.A.assign(p.W.size(), 0.0);
      p.steps.assign(static_cast<size_t>(p.cols), 0);
      params_.push_back(std::move(p));
    }
  }

  void step(const std::vector<HostTensor>& grads, const std::vector<double>& lrs) {
    double total = 0.0;
    for (const auto& g : grads)
      for (int64_t e = 0; e < g.numel(); ++e) total += g.get(e) * g.get(e);
    const double norm = std::sqrt(total);
    const double clip = config_.max_grad_norm > 0 ? std::min(1.0, config_.max_grad_norm / (norm + 1e-6)) : 1.0;
    ++t_;
    if (t_ <= config_.warm_up) {
      for (size_t i = 0; i < params_.size(); ++i) {
        P& p = params_[i];
        for (int64_t j = 0; j < p.cols; ++j) adam_column(p, j, grads[i], clip, lrs[p.group], current(), false);
        p.W = p.master;
      }
      return;
    }
    const bool window_start = window_steps_ == 0;
    const int64_t period = config_.select_interval > 0 ? config_.select_interval : INT64_MAX;
    if (window_start && (selections_ == 0 || since_ >= period)) {
      flush();
      for (size_t i = 0; i < params_.size(); ++i)
        if (params_[i].matrix) select(params_[i], grads[i]);
      ++selections_;
      since_ = 0;
    }
    if (window_start && !windows_begun_) {
      windows_begun_ = true;
      if (t_ > 1) moments_to_windows();
    }
    ++since_;
    ++window_steps_;
    for (size_t i = 0; i < params_.size(); ++i) {
      P& p = params_[i];
      const double lr = lrs[p.group];
      for (int64_t j = 0; j < p.cols; ++j) {
        if (!p.matrix || p.selected(j)) {
          adam_column(p, j, grads[i], clip, lr, current(), false);
          for (int64_t r = 0; r < p.rows; ++r) p.W[r * p.cols + j] = p.master[r * p.cols + j];
        } else {
          for (int64_t r = 0; r < p.rows; ++r) p.A[r * p.cols + j] += grads[i].get(r * p.cols + j) * clip;
        }
      }
    }
    ++accumulated_;
    last_lrs_ = lrs;
    last_hp_ = current();
    if (window_steps_ == config_.update_interval) {
      window_steps_ = 0;
      if (config_.overlap) {
        upload();
        if (accumulated_ > 0) host_update();
      } else if (accumulated_ > 0) {
        host_update();
        upload();
      }
    } else if (config_.overlap && config_.update_lag > 0 && window_steps_ == config_.update_lag) {
      upload();  // the previous window's result, update_lag steps into this one
    }
  }

  // Betas, eps and each group's weight decay of later steps; a window's host update takes
  // those of its last step.
  void set_hyperparameters(double beta1, double beta2, double eps, const std::vector<double>& weight_decays) {
    hp_ = Hyper{beta1, beta2, eps, weight_decays};
  }

  void flush() {
    upload();
    if (accumulated_ > 0) {
      host_update();
      upload();
    }
  }

  const std::vector<double>& weights(size_t i) const { return params_[i].W; }
  const std::vector<double>& master(size_t i) const { return params_[i].master; }
  const std::vector<int32_t>& selection(size_t i) const { return params_[i].sel; }

 private:
  struct P {
    bool matrix = false;
    int64_t rows = 0, cols = 0, k = 0;
    int32_t group = 0;
    double weight_decay = 0;
    std::vector<double> W, master, m, v, A, pending;
    std::vector<int64_t> steps;
    std::vector<int32_t> sel;
    bool has_pending = false;
    bool selected(int64_t j) const { return std::binary_search(sel.begin(), sel.end(), static_cast<int32_t>(j)); }
  };

  struct Hyper {
    double beta1, beta2, eps;
    std::vector<double> weight_decays;  // per group; empty: the groups' own
  };
  Hyper current() const { return hp_.has_value() ? *hp_ : Hyper{config_.beta1, config_.beta2, config_.eps, {}}; }

  // span > 1: a window's update standing for span steps, taken with step_lr.
  void adam_column(P& p, int64_t j, const HostTensor& grad, double scale, double lr, const Hyper& h, bool from_acc,
                   int64_t span = 1, double step_lr = -1.0) {
    const double wd = h.weight_decays.empty() ? p.weight_decay : h.weight_decays[static_cast<size_t>(p.group)];
    if (step_lr < 0.0) step_lr = lr;
    const int64_t t = (p.steps[static_cast<size_t>(j)] += span);
    const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
    const double d1 = std::pow(h.beta1, static_cast<double>(span));
    const double d2 = std::pow(h.beta2, static_cast<double>(span));
    for (int64_t r = 0; r < p.rows; ++r) {
      const size_t e = static_cast<size_t>(r * p.cols + j);
      const double g = from_acc ? p.A[e] * scale : grad.get(static_cast<int64_t>(e)) * scale;
      p.m[e] = d1 * p.m[e] + (1.0 - d1) * g;
      p.v[e] = d2 * p.v[e] + (1.0 - d2) * g * g;
      p.master[e] *= std::pow(1.0 - lr * wd, static_cast<double>(span));
      p.master[e] -= step_lr * (p.m[e] / bc1) / (std::sqrt(p.v[e] / bc2) + h.eps);
    }
  }

  // The first window after per-step updates of every column: each deferred column's second
  // moment becomes that of the mean of S steps' gradients, m_hat^2 + max(0, v_hat - m_hat^2) / S
  // (window_scaling SQRT or LINEAR, S > 1).
  void moments_to_windows() {
    const int64_t span = config_.update_interval;
    if (config_.window_scaling == ZF_WINDOW_SCALING_NONE || span <= 1) return;
    const Hyper h = current();
    for (P& p : params_) {
      if (!p.matrix) continue;
      for (int64_t j = 0; j < p.cols; ++j) {
        const int64_t t = p.steps[static_cast<size_t>(j)];
        if (p.selected(j) || t == 0) continue;
        const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
        const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
        for (int64_t r = 0; r < p.rows; ++r) {
          const size_t e = static_cast<size_t>(r * p.cols + j);
          const double signal = (p.m[e] / bc1) * (p.m[e] / bc1);
          const double noise = std::max(0.0, p.v[e] / bc2 - signal);
          p.v[e] = (signal + noise / static_cast<double>(span)) * bc2;
        }
      }
    }
  }

  void select(P& p, const HostTensor& grad) {
    std::vector<double> c(static_cast<size_t>(p.cols), 0.0);
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t j = 0; j < p.cols; ++j)
        c[static_cast<size_t>(j)] += grad.get(r * p.cols + j) * grad.get(r * p.cols + j);
    std::vector<int32_t> order(static_cast<size_t>(p.cols));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return c[a] > c[b]; });
    p.sel.assign(order.begin(), order.begin() + p.k);
    std::sort(p.sel.begin(), p.sel.end());
  }

  void host_update() {
    const double scale = 1.0 / static_cast<double>(accumulated_);
    const int64_t span = config_.window_scaling == ZF_WINDOW_SCALING_NONE ? 1 : accumulated_;
    const double factor = config_.window_scaling == ZF_WINDOW_SCALING_SQRT ? std::sqrt(static_cast<double>(span))
                                                                           : static_cast<double>(span);
    for (P& p : params_) {
      if (!p.matrix) continue;
      const double lr = last_lrs_[p.group];
      for (int64_t j = 0; j < p.cols; ++j) {
        if (p.selected(j)) continue;
        adam_column(p, j, HostTensor(), scale, lr, last_hp_, true, span, lr * factor);
        for (int64_t r = 0; r < p.rows; ++r) p.A[r * p.cols + j] = 0.0;
      }
      p.pending = p.master;
      p.has_pending = true;
    }
    accumulated_ = 0;
  }

  void upload() {
    for (P& p : params_) {
      if (!p.has_pending) continue;
      for (int64_t j = 0; j < p.cols; ++j)
        if (!p.selected(j))
          for (int64_t r = 0; r < p.rows; ++r) p.W[r * p.cols + j] = p.pending[r * p.cols + j];
      p.has_pending = false;
    }
  }

  RefConfig config_;
  std::vector<P> params_;
  bool windows_begun_ = false;
  int64_t t_ = 0, window_steps_ = 0, since_ = 0, selections_ = 0, accumulated_ = 0;
  std::vector<double> last_lrs_;
  std::optional<Hyper> hp_;
  Hyper last_hp_;
};

inline zf_engine_config engine_config(const RefConfig& r) {
  zf_engine_config c = test_config();
  c.topk_ratio = r.topk_ratio;
  c.update_interval = r.update_interval;
  c.overlap_step = r.overlap ? 1 : 0;
  c.update_lag = r.update_lag;
  c.full_warm_up_rounds = r.warm_up;
  c.select_strategy = ZF_SELECT_STEP;
  c.select_interval = r.select_interval;
  c.max_grad_norm = r.max_grad_norm;
  c.window_scaling = r.window_scaling;
  return c;
}

// Largest |engine - reference| / (atol + rtol * |reference|) over every parameter; <= 1 passes.
inline double worst_error(const Model& model, const Reference& ref, double atol, double rtol) {
  double worst = 0.0;
  for (size_t i = 0; i < model.params.size(); ++i) {
    const std::vector<double> got = model.params[i].values();
    const std::vector<double>& want = ref.weights(i);
    for (size_t e = 0; e < got.size(); ++e)
      worst = std::max(worst, std::fabs(got[e] - want[e]) / (atol + rtol * std::fabs(want[e])));
  }
  return worst;
}

inline std::vector<double> step_lrs(const Model& model, int64_t t) {
  std::vector<double> lrs;
  for (const auto& g : model.groups) lrs.push_back(g.lr * (1.0 + 0.05 * static_cast<double>(t % 3)));
  return lrs;
}

}  // namespace zf_engine_test
