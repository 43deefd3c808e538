// Host launcher of the CUDA AdamW on selected columns (kernel in adamw_selected_kernel.cuh).
#include <algorithm>
#include <vector>

#include "cuda/common/cuda_check.cuh"
#include "cuda/optim/adamw_selected_kernel.cuh"
#include "cuda/optim/adamw_selected_launch.hpp"
#include "ops/column_ops.hpp"

namespace zf {
namespace cuda {

void adamw_selected_columns(const zf_tensor* params, const zf_tensor* grads, const zf_tensor* selected,
                            const zf_column_state* state, const double* lr, const double* weight_decay, size_t count,
                            zf_adamw_options options, const float* grad_scale, const int32_t* noop, zf_stream stream) {
  std::vector<AdamwMatrix> matrices;
  for (size_t i = 0; i < count; ++i) {
    const MatrixView view = matrix_view(params[i]);
    const int64_t k = selected ? selected[i].shape[0] : view.cols;
    if (k == 0) continue;
    AdamwMatrix mat{};
    mat.param = params[i].data;
    mat.grad = grads[i].data;
    mat.selected = selected ? static_cast<const int32_t*>(selected[i].data) : nullptr;
    mat.master = numel(state[i].master) > 0 ? static_cast<float*>(state[i].master.data) : nullptr;
    mat.exp_avg = static_cast<float*>(state[i].exp_avg.data);
    mat.exp_avg_sq = static_cast<float*>(state[i].exp_avg_sq.data);
    mat.steps = static_cast<int32_t*>(state[i].steps.data);
    mat.rows = view.rows;
    mat.cols = static_cast<int32_t>(view.cols);
    mat.k = static_cast<int32_t>(k);
    mat.param_dtype = params[i].dtype;
    mat.grad_dtype = grads[i].dtype;
    mat.lr = lr[i];
    mat.weight_decay = weight_decay[i];
    matrices.push_back(mat);
  }
  if (matrices.empty()) return;
  const ScopedDevice device_guard(params[0].device.index);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for (size_t begin = 0; begin < matrices.size(); begin += kAdamwMaxMatricesPerLaunch) {
    const size_t end = std::min(matrices.size(), begin + kAdamwMaxMatricesPerLaunch);
    AdamwLaunchTable table{};
    int64_t blocks = 0;
    for (size_t i = begin; i < end; ++i) {
      table.matrices[i - begin] = matrices[i];
      table.matrices[i - begin].first_block = blocks;
      blocks += (matrices[i].k + kAdamwColumnsPerBlock - 1) / kAdamwColumnsPerBlock;
    }
    require(blocks <= INT32_MAX, ZF_ERROR_INVALID_VALUE, "params: too many columns for one launch");
    table.count = static_cast<int32_t>(end - begin);
    table.grad_scale = grad_scale;
    table.noop = noop;
    table.beta1 = options.beta1;
    table.beta2 = options.beta2;
    table.eps = options.eps;
    adamw_selected_kernel<<<static_cast<unsigned>(blocks), kAdamwThreads, 0, cuda_stream>>>(table);
    check_launch("adamw_selected_kernel");
  }
}

}  // namespace cuda
}  // namespace zf
