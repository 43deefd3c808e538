// zf_adamw_selected_columns: validation, the host plan, and dispatch to CUDA.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/adam_math.hpp"
#include "common/column_checks.hpp"
#include "common/column_index.hpp"
#include "common/device_ops.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "ops/adamw_selected_plan.hpp"
#include "simd/kernels.hpp"
#include "zenflow/optim.h"

namespace zf {

namespace {
// Below this many elements the pool's wake-up costs more than the second thread saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;
// Columns of one row handed to the Adam kernel at once (the gather buffers' size).
constexpr int64_t kPiece = 256;
}  // namespace

AdamwSelectedPlan::AdamwSelectedPlan(std::vector<AdamwSelectedMatrix> matrices, const zf_adam_hparams& hparams)
    : matrices_(std::move(matrices)), hparams_(hparams) {
  work_offsets_.assign(matrices_.size() + 1, 0);
  scalar_offsets_.assign(matrices_.size() + 1, 0);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    work_offsets_[i + 1] = work_offsets_[i] + matrices_[i].rows * matrices_[i].k;
    scalar_offsets_[i + 1] = scalar_offsets_[i] + static_cast<size_t>(matrices_[i].k);
  }
  scalars_.resize(scalar_offsets_.back());
}

void AdamwSelectedPlan::run(ThreadPool& pool, const AdamwSelectedPointers* pointers, float grad_scale) {
  // The step scalars of every column, once per column (not per element). A column whose lr,
  // weight decay and count equal those of the column before it, in this matrix or the
  // previous one (the common case: one group, one count), reuses its scalars: computing
  // them (beta^step in double-double) costs about as much as updating a few hundred elements.
  bool have_previous = false;
  double previous_lr = 0.0, previous_weight_decay = 0.0;
  int32_t previous_count = 0;
  AdamStepScalars previous{};
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const AdamHyperParams hyper{pointers[i].lr, hparams_.beta1,           hparams_.beta2,
                                hparams_.eps,   pointers[i].weight_decay, hparams_.mode == ZF_ADAM_MODE_ADAMW};
    AdamStepScalars* column_scalars = scalars_.data() + scalar_offsets_[i];
    for (int64_t c = 0; c < matrices_[i].k; ++c) {
      const int32_t count = pointers[i].steps[c];
      if (!have_previous || count != previous_count || hyper.lr != previous_lr ||
          hyper.weight_decay != previous_weight_decay) {
        previous = adam_step_scalars(hyper, adam_next_step_count(count));
        previous_count = count;
        previous_lr = hyper.lr;
        previous_weight_decay = hyper.weight_decay;
        have_previous = true;
      }
      column_scalars[c] = previous;
    }
  }
  // Walks the elements [begin, end) of matrix i's row-major (r, c) order: whole rows of its
  // k selected columns, clipped at both ends. Within a row, each run of columns with the same
  // step count goes through the SIMD level's Adam kernel (simd/kernels_adam_impl.hpp, the
  // same operations as adam_update_element) in pieces of up to kPiece columns: the compact
  // state of a row is contiguous; the gradient, and the parameter when there is no fp32
  // master, are gathered from the selected columns into small buffers first, and the new
  // parameter values are scattered back.
  const simd::KernelTable& kernels = simd::active_kernels();
  const auto update_matrix_range = [&](size_t i, int64_t begin, int64_t end) {
    const AdamwSelectedMatrix& m = matrices_[i];
    const AdamwSelectedPointers& p = pointers[i];
    const AdamStepScalars* column_scalars = scalars_.data() + scalar_offsets_[i];
    const size_t grad_bytes = zf_dtype_size(m.grad_dtype), param_bytes = zf_dtype_size(m.param_dtype);
    alignas(64) float values[kPiece];
    alignas(64) unsigned char grads[kPiece * sizeof(float)];
    alignas(64) unsigned char outputs[kPiece * sizeof(float)];
    simd::AdamStepArgs args{};
    args.grad_dtype = m.grad_dtype;
    args.out_dtype = m.param_dtype;
    args.grad_scale = grad_scale;
    for (int64_t r = begin / m.k; r * m.k < end; ++r) {
      const int64_t c_begin = std::max<int64_t>(0, begin - r * m.k), c_end = std::min(m.k, end - r * m.k);
      const auto* grad_row = static_cast<const unsigned char*>(p.grad) + r * m.cols * static_cast<int64_t>(grad_bytes);
      auto* param_row = static_cast<unsigned char*>(p.param) + r * m.cols * static_cast<int64_t>(param_bytes);
      for (int64_t c0 = c_begin; c0 < c_end;) {
        // Columns [c0, c1): one step count (so one set of scalars), at most kPiece of them.
        int64_t c1 = c0 + 1;
        while (c1 < c_end && c1 - c0 < kPiece && p.steps[c1] == p.steps[c0]) ++c1;
        const int64_t count = c1 - c0, slot = r * m.k + c0;
        args.scalars = column_scalars[c0];
        args.exp_avg = p.exp_avg + slot;
        args.exp_avg_sq = p.exp_avg_sq + slot;
        if (p.selected == nullptr) {  // dense: the row's columns are contiguous
          args.grad = const_cast<unsigned char*>(grad_row + c0 * static_cast<int64_t>(grad_bytes));
        } else if (p.grad_compact) {  // column c's row r at c * rows + r
          const auto* compact = static_cast<const unsigned char*>(p.grad);
          for (int64_t c = 0; c < count; ++c) {
            std::memcpy(grads + c * grad_bytes, compact + ((c0 + c) * m.rows + r) * static_cast<int64_t>(grad_bytes),
                        grad_bytes);
          }
          args.grad = grads;
        } else {
          for (int64_t c = 0; c < count; ++c) {
            std::memcpy(grads + c * grad_bytes, grad_row + p.selected[c0 + c] * static_cast<int64_t>(grad_bytes),
                        grad_bytes);
          }
          args.grad = grads;
        }
        // The fp32 value updated in place: the master, a dense fp32 row itself, or the
        // parameter gathered (and widened) into `values`. The parameter in its own dtype
        // (rounding to nearest even) goes straight into a dense row, else through `outputs`.
        const bool dense = p.selected == nullptr;
        const bool f32_in_place = p.master == nullptr && m.param_dtype == ZF_DTYPE_F32;
        unsigned char* const param_at = param_row + c0 * static_cast<int64_t>(param_bytes);
        if (p.master) {
          args.param = p.master + slot;
        } else if (dense && f32_in_place) {
          args.param = static_cast<float*>(static_cast<void*>(param_at));
        } else {
          for (int64_t c = 0; c < count; ++c) {
            values[c] = load_as_float(param_row, m.param_dtype, selected_column(p.selected, c0 + c));
          }
          args.param = values;
        }
        args.out = f32_in_place ? nullptr : (dense ? param_at : outputs);
        kernels.adam_step(args, count);
        if (!dense && f32_in_place) {
          auto* row = static_cast<float*>(static_cast<void*>(param_row));
          for (int64_t c = 0; c < count; ++c) row[p.selected[c0 + c]] = values[c];
        } else if (!dense) {
          for (int64_t c = 0; c < count; ++c) {
            std::memcpy(param_row + p.selected[c0 + c] * static_cast<int64_t>(param_bytes), outputs + c * param_bytes,
                        param_bytes);
          }
        }
        c0 = c1;
      }
    }
  };
  // Elements of all matrices as one range, split over the pool.
  const int64_t total = work_offsets_.back();
  const auto update_range = [&](int64_t begin, int64_t end) {
    size_t i = static_cast<size_t>(std::upper_bound(work_offsets_.begin(), work_offsets_.end(), begin) -
                                   work_offsets_.begin()) -
               1;
    for (; i < matrices_.size() && work_offsets_[i] < end; ++i) {
      const int64_t lo = std::max(begin, work_offsets_[i]), hi = std::min(end, work_offsets_[i + 1]);
      if (lo < hi) update_matrix_range(i, lo - work_offsets_[i], hi - work_offsets_[i]);
    }
  };
  if (total < kParallelMinElements || pool.size() == 1 || in_parallel_region()) {
    update_range(0, total);
  } else {
    pool.run([&](int thread, int threads) {
      int64_t begin, end;
      split_range(0, total, thread, threads, &begin, &end);
      if (begin < end) update_range(begin, end);
    });
  }
  for (size_t i = 0; i < matrices_.size(); ++i) {
    for (int64_t c = 0; c < matrices_[i].k; ++c) pointers[i].steps[c] = adam_next_step_count(pointers[i].steps[c]);
  }
}

namespace {

void check_hparams(const zf_adam_hparams* h) {
  require(h != nullptr, ZF_ERROR_INVALID_VALUE, "hparams: is NULL");
  require(std::isfinite(h->beta1) && h->beta1 >= 0.0 && h->beta1 < 1.0, ZF_ERROR_INVALID_VALUE,
          "hparams.beta1: must be in [0, 1), got ", h->beta1);
  require(std::isfinite(h->beta2) && h->beta2 >= 0.0 && h->beta2 < 1.0, ZF_ERROR_INVALID_VALUE,
          "hparams.beta2: must be in [0, 1), got ", h->beta2);
  require(std::isfinite(h->eps) && h->eps >= 0.0, ZF_ERROR_INVALID_VALUE, "hparams.eps: must be finite and >= 0, got ",
          h->eps);
  const int mode = zf::raw_enum_value(h->mode);
  require(mode == ZF_ADAM_MODE_ADAMW || mode == ZF_ADAM_MODE_ADAM, ZF_ERROR_INVALID_VALUE,
          "hparams.mode: unknown mode ", mode);
}

zf_device validate(const zf_tensor* params, const zf_tensor* grads, const zf_tensor* selected,
                   const zf_column_state* state, size_t count, const double* lr, const double* weight_decay,
                   const zf_tensor* lr_tensor, const zf_adam_hparams* hparams, const zf_tensor* grad_scale,
                   const zf_tensor* noop) {
  require(count == 0 || (params != nullptr && grads != nullptr && state != nullptr && weight_decay != nullptr &&
                         (lr != nullptr || lr_tensor != nullptr)),
          ZF_ERROR_INVALID_VALUE, "params/grads/state/lr/weight_decay: NULL array with count=", count);
  check_hparams(hparams);
  zf_device device{ZF_DEVICE_CPU, 0};
  ArgName source("params", 0);
  if (count > 0) {
    check_descriptor(&params[0], source);
    device = params[0].device;
  } else if (grad_scale != nullptr) {
    check_descriptor(grad_scale, "grad_scale");
    device = grad_scale->device;
    source = ArgName("grad_scale");
  }
  check_device_compiled(device, source);
  OverlapCheck overlap;
  overlap.reserve(7 * count + 3);
  if (grad_scale != nullptr) {
    check_state_tensor(*grad_scale, "grad_scale", ZF_DTYPE_F32, 1, device, source);
    overlap.add(*grad_scale, "grad_scale", false);
  }
  if (noop != nullptr) {
    check_state_tensor(*noop, "noop", ZF_DTYPE_I32, 1, device, source);
    overlap.add(*noop, "noop", false);
  }
  if (lr_tensor != nullptr) {
    check_state_tensor(*lr_tensor, "lr_tensor", ZF_DTYPE_F32, static_cast<int64_t>(count), device, source);
    overlap.add(*lr_tensor, "lr_tensor", false);
    if (device.type == ZF_DEVICE_CPU) {
      for (size_t i = 0; i < count; ++i) {
        const float value = static_cast<const float*>(lr_tensor->data)[i];
        require(std::isfinite(value) && value >= 0.0f, ZF_ERROR_INVALID_VALUE, "lr_tensor[", i, "]: ", value,
                " must be finite and >= 0");
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    const ArgName param_name("params", i), grad_name("grads", i), state_name("state", i);
    const MatrixView view = check_float_matrix(&params[i], param_name, device, source);
    check_float_matrix(&grads[i], grad_name, device, source);
    require(numel(grads[i]) == numel(params[i]) && matrix_view(grads[i]).cols == view.cols, ZF_ERROR_INVALID_VALUE,
            grad_name, ": shape differs from ", param_name);
    const ArgName selected_name("selected", i);
    const int64_t k = selected ? check_selected(&selected[i], selected_name, view.cols, device, source) : view.cols;
    const ArgName master_name = state_name.with_field("master"), m_name = state_name.with_field("exp_avg"),
                  v_name = state_name.with_field("exp_avg_sq"), steps_name = state_name.with_field("steps");
    check_master(state[i].master, master_name, view.rows * k, device, source);
    check_state_tensor(state[i].exp_avg, m_name, ZF_DTYPE_F32, view.rows * k, device, source);
    check_state_tensor(state[i].exp_avg_sq, v_name, ZF_DTYPE_F32, view.rows * k, device, source);
    // The compact layout [m, k]: a [k, m] state (the host lists' layout) is refused.
    const ArgName layout_source = selected ? selected_name : param_name;
    const char* const compact = "the device (compact) layout";
    check_matrix_layout(state[i].master, master_name, view.rows, k, compact, layout_source);
    check_matrix_layout(state[i].exp_avg, m_name, view.rows, k, compact, layout_source);
    check_matrix_layout(state[i].exp_avg_sq, v_name, view.rows, k, compact, layout_source);
    check_state_tensor(state[i].steps, steps_name, ZF_DTYPE_I32, k, device, source);
    if (device.type == ZF_DEVICE_CPU) {
      check_step_counts(static_cast<const int32_t*>(state[i].steps.data), k, steps_name, 0, 1);
    }
    if (lr != nullptr && lr_tensor == nullptr) {
      require(std::isfinite(lr[i]) && lr[i] >= 0.0, ZF_ERROR_INVALID_VALUE, "lr[", i, "]: ", lr[i],
              " must be finite and >= 0");
    }
    require(std::isfinite(weight_decay[i]) && weight_decay[i] >= 0.0, ZF_ERROR_INVALID_VALUE, "weight_decay[", i,
            "]: ", weight_decay[i], " must be finite and >= 0");
    overlap.add(params[i], param_name, true);
    overlap.add(grads[i], grad_name, false);
    if (selected) overlap.add(selected[i], selected_name, false);
    overlap.add(state[i].master, master_name, true);
    overlap.add(state[i].exp_avg, m_name, true);
    overlap.add(state[i].exp_avg_sq, v_name, true);
    overlap.add(state[i].steps, steps_name, true);
  }
  overlap.check();
  return device;
}

}  // namespace
}  // namespace zf

extern "C" ZF_API zf_status zf_adamw_selected_columns(const zf_tensor* params, const zf_tensor* grads,
                                                      const zf_tensor* selected, const zf_column_state* state,
                                                      size_t count, const double* lr, const double* weight_decay,
                                                      const zf_tensor* lr_tensor, const zf_adam_hparams* hparams,
                                                      const zf_tensor* grad_scale, const zf_tensor* noop,
                                                      zf_stream stream) {
  return zf::api_call([&] {
    const zf_device device =
        zf::validate(params, grads, selected, state, count, lr, weight_decay, lr_tensor, hparams, grad_scale, noop);
    const float* scale = grad_scale ? static_cast<const float*>(grad_scale->data) : nullptr;
    const int32_t* skip = noop ? static_cast<const int32_t*>(noop->data) : nullptr;
    const float* lr_values = lr_tensor ? static_cast<const float*>(lr_tensor->data) : nullptr;
    if (device.type == ZF_DEVICE_CUDA) {
      const zf::AdamwSelectedArgs args{params,       grads,     selected, state, count, lr,
                                       weight_decay, lr_values, *hparams, scale, skip,  device.index};
      zf::cuda_ops().adamw_selected_columns(args, stream);
      return;
    }
    if (skip != nullptr && *skip != 0) return;
    std::vector<zf::AdamwSelectedMatrix> matrices(count);
    std::vector<zf::AdamwSelectedPointers> pointers(count);
    for (size_t i = 0; i < count; ++i) {
      const zf::MatrixView view = zf::matrix_view(params[i]);
      const int64_t k = selected ? selected[i].shape[0] : view.cols;
      const bool has_master = zf::numel(state[i].master) > 0;
      matrices[i] = {view.rows, view.cols, k, params[i].dtype, grads[i].dtype, has_master};
      pointers[i] = {params[i].data,
                     grads[i].data,
                     selected ? static_cast<const int32_t*>(selected[i].data) : nullptr,
                     has_master ? static_cast<float*>(state[i].master.data) : nullptr,
                     static_cast<float*>(state[i].exp_avg.data),
                     static_cast<float*>(state[i].exp_avg_sq.data),
                     static_cast<int32_t*>(state[i].steps.data),
                     lr_values ? static_cast<double>(lr_values[i]) : lr[i],
                     weight_decay[i]};
    }
    zf::AdamwSelectedPlan plan(std::move(matrices), *hparams);
    plan.run(*zf::global_thread_pool(), pointers.data(), scale ? *scale : 1.0f);
  });
}
