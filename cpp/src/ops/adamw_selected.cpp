// zf_adamw_selected_columns: validation, the host twin, and dispatch to CUDA.
#include <cmath>
#include <memory>
#include <vector>

#include "common/adam_math.hpp"
#include "common/column_index.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "ops/column_ops.hpp"
#include "ops/device_dispatch.hpp"
#include "zenflow/optim.h"

#if defined(ZENFLOW_WITH_CUDA)
#include "cuda/optim/adamw_selected_launch.hpp"
#endif

namespace zf {
namespace {

zf_device validate(const zf_tensor* params, const zf_tensor* grads, const zf_tensor* selected,
                   const zf_column_state* state, const double* lr, const double* weight_decay, size_t count,
                   const zf_adamw_options& options, const zf_tensor* grad_scale, const zf_tensor* noop) {
  require(count == 0 ||
              (params != nullptr && grads != nullptr && state != nullptr && lr != nullptr && weight_decay != nullptr),
          ZF_ERROR_INVALID_VALUE, "params/grads/state/lr/weight_decay: NULL array with count=", count);
  require(options.beta1 >= 0.0f && options.beta1 < 1.0f, ZF_ERROR_INVALID_VALUE, "beta1: ", options.beta1,
          " is outside [0, 1)");
  require(options.beta2 >= 0.0f && options.beta2 < 1.0f, ZF_ERROR_INVALID_VALUE, "beta2: ", options.beta2,
          " is outside [0, 1)");
  require(std::isfinite(options.eps) && options.eps >= 0.0f, ZF_ERROR_INVALID_VALUE, "eps: ", options.eps,
          " must be finite and >= 0");
  zf_device device{ZF_DEVICE_CPU, 0};
  std::string source = "params[0]";
  if (count > 0) {
    check_descriptor(&params[0], "params[0]");
    device = params[0].device;
  } else if (grad_scale != nullptr) {
    check_descriptor(grad_scale, "grad_scale");
    device = grad_scale->device;
    source = "grad_scale";
  }
  check_device_compiled(device, source);
  if (grad_scale != nullptr) check_state_tensor(*grad_scale, "grad_scale", ZF_DTYPE_F32, 1, device, source);
  if (noop != nullptr) check_state_tensor(*noop, "noop", ZF_DTYPE_I32, 1, device, source);
  for (size_t i = 0; i < count; ++i) {
    const std::string param_name = arg_name("params", i), grad_name = arg_name("grads", i);
    const MatrixView view = check_float_matrix(&params[i], param_name, device, source);
    check_float_matrix(&grads[i], grad_name, device, source);
    require(numel(grads[i]) == numel(params[i]) && matrix_view(grads[i]).cols == view.cols, ZF_ERROR_INVALID_VALUE,
            grad_name, ": shape differs from ", param_name);
    const int64_t k =
        selected ? check_selected(&selected[i], arg_name("selected", i), view.cols, device, source) : view.cols;
    const std::string state_name = arg_name("state", i);
    check_master(state[i].master, state_name + ".master", view.rows * k, device, source);
    check_state_tensor(state[i].exp_avg, state_name + ".exp_avg", ZF_DTYPE_F32, view.rows * k, device, source);
    check_state_tensor(state[i].exp_avg_sq, state_name + ".exp_avg_sq", ZF_DTYPE_F32, view.rows * k, device, source);
    check_state_tensor(state[i].steps, state_name + ".steps", ZF_DTYPE_I32, k, device, source);
    require(std::isfinite(lr[i]) && lr[i] >= 0.0f, ZF_ERROR_INVALID_VALUE, "lr[", i, "]: ", lr[i],
            " must be finite and >= 0");
    require(std::isfinite(weight_decay[i]) && weight_decay[i] >= 0.0f, ZF_ERROR_INVALID_VALUE, "weight_decay[", i,
            "]: ", weight_decay[i], " must be finite and >= 0");
  }
  return device;
}

void adamw_selected_host(const zf_tensor* params, const zf_tensor* grads, const zf_tensor* selected,
                         const zf_column_state* state, const double* lr, const double* weight_decay, size_t count,
                         const zf_adamw_options& options, const float* grad_scale, const int32_t* noop) {
  if (noop != nullptr && *noop != 0) return;
  const float scale = grad_scale ? *grad_scale : 1.0f;
  const std::shared_ptr<ThreadPool> pool_owner = global_thread_pool();
  ThreadPool& pool = *pool_owner;
  for (size_t i = 0; i < count; ++i) {
    const MatrixView view = matrix_view(params[i]);
    const int32_t* sel = selected ? static_cast<const int32_t*>(selected[i].data) : nullptr;
    const int64_t k = selected ? selected[i].shape[0] : view.cols;
    if (k == 0) continue;
    int32_t* steps = static_cast<int32_t*>(state[i].steps.data);
    const AdamHyperParams hyper{lr[i], options.beta1, options.beta2, options.eps, weight_decay[i], true};
    std::vector<AdamStepScalars> scalars(static_cast<size_t>(k));
    for (int64_t c = 0; c < k; ++c) scalars[static_cast<size_t>(c)] = adam_step_scalars(hyper, int64_t{steps[c]} + 1);

    void* param = params[i].data;
    const void* grad = grads[i].data;
    const int32_t param_dtype = params[i].dtype, grad_dtype = grads[i].dtype;
    float* master = numel(state[i].master) > 0 ? static_cast<float*>(state[i].master.data) : nullptr;
    float* exp_avg = static_cast<float*>(state[i].exp_avg.data);
    float* exp_avg_sq = static_cast<float*>(state[i].exp_avg_sq.data);
    const int64_t rows = view.rows, cols = view.cols;
    pool.run([&](int thread, int threads) {
      int64_t row_begin, row_end;
      split_range(0, rows, thread, threads, &row_begin, &row_end);
      for (int64_t r = row_begin; r < row_end; ++r) {
        for (int64_t c = 0; c < k; ++c) {
          const int64_t element = row_major_index(cols, r, selected_column(sel, c));
          const int64_t slot = row_major_index(k, r, c);
          const float g = load_as_float(grad, grad_dtype, element) * scale;
          float p = master ? master[slot] : load_as_float(param, param_dtype, element);
          adam_update_element(p, exp_avg[slot], exp_avg_sq[slot], g, scalars[static_cast<size_t>(c)]);
          if (master) master[slot] = p;
          store_from_float(param, param_dtype, element, p);
        }
      }
    });
    for (int64_t c = 0; c < k; ++c) steps[c] += 1;
  }
}

}  // namespace
}  // namespace zf

extern "C" ZF_API zf_status zf_adamw_selected_columns(const zf_tensor* params, const zf_tensor* grads,
                                                      const zf_tensor* selected, const zf_column_state* state,
                                                      const double* lr, const double* weight_decay, size_t count,
                                                      zf_adamw_options options, const zf_tensor* grad_scale,
                                                      const zf_tensor* noop, zf_stream stream) {
  return zf::api_call([&] {
    const zf_device device =
        zf::validate(params, grads, selected, state, lr, weight_decay, count, options, grad_scale, noop);
    const float* scale = grad_scale ? static_cast<const float*>(grad_scale->data) : nullptr;
    const int32_t* skip = noop ? static_cast<const int32_t*>(noop->data) : nullptr;
    if (device.type == ZF_DEVICE_CUDA) {
#if defined(ZENFLOW_WITH_CUDA)
      zf::cuda::adamw_selected_columns(params, grads, selected, state, lr, weight_decay, count, options, scale, skip,
                                       stream);
#endif
      return;
    }
    zf::adamw_selected_host(params, grads, selected, state, lr, weight_decay, count, options, scale, skip);
  });
}
