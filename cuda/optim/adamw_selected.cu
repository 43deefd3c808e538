// Host launcher of the CUDA AdamW on selected columns (kernel in adamw_selected_kernel.cuh),
// registered in the CUDA launcher table (common/device_ops.hpp).
#include <algorithm>
#include <vector>

#include "common/device_ops.hpp"
#include "common/matrix_view.hpp"
#include "common/tensor.hpp"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/multi_tensor.cuh"
#include "cuda/optim/adamw_selected_kernel.cuh"

namespace zf {
namespace cuda {
namespace {

void adamw_selected_columns(const AdamwSelectedArgs& args, zf_stream stream) {
  std::vector<AdamwMatrix> matrices;
  for (size_t i = 0; i < args.count; ++i) {
    const MatrixView view = matrix_view(args.params[i]);
    const int64_t k = args.selected ? args.selected[i].shape[0] : view.cols;
    if (k == 0) continue;
    const zf_column_state& state = args.state[i];
    AdamwMatrix mat{};
    mat.param = args.params[i].data;
    mat.grad = args.grads[i].data;
    mat.selected = args.selected ? static_cast<const int32_t*>(args.selected[i].data) : nullptr;
    mat.master = numel(state.master) > 0 ? static_cast<float*>(state.master.data) : nullptr;
    mat.exp_avg = static_cast<float*>(state.exp_avg.data);
    mat.exp_avg_sq = static_cast<float*>(state.exp_avg_sq.data);
    mat.steps = static_cast<int32_t*>(state.steps.data);
    mat.rows = view.rows;
    mat.cols = static_cast<int32_t>(view.cols);
    mat.k = static_cast<int32_t>(k);
    mat.column_tiles = static_cast<int32_t>((k + kAdamwColumnsPerBlock - 1) / kAdamwColumnsPerBlock);
    mat.param_dtype = args.params[i].dtype;
    mat.grad_dtype = args.grads[i].dtype;
    mat.grad_compact = args.grads_compact != nullptr && args.grads_compact[i] != 0 ? 1 : 0;
    mat.lr = args.lr ? args.lr[i] : 0.0;
    mat.lr_index = static_cast<int32_t>(i);
    mat.weight_decay = args.weight_decay[i];
    matrices.push_back(mat);
  }
  if (matrices.empty()) return;
  const ScopedDevice device_guard(args.device);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_launch_batch(matrices.size(), kAdamwMaxMatricesPerLaunch, [&](size_t begin, size_t end) {
    AdamwLaunchTable table{};
    std::copy(matrices.begin() + begin, matrices.begin() + end, table.matrices);
    const size_t count = end - begin;
    const unsigned update_blocks = number_blocks(
        table.matrices, count, &AdamwMatrix::first_block,
        [](const AdamwMatrix& m) { return int64_t{m.column_tiles} * adamw_row_chunks(m.rows); }, "params");
    const unsigned step_blocks = number_blocks(
        table.matrices, count, &AdamwMatrix::first_step_block,
        [](const AdamwMatrix& m) { return (int64_t{m.k} + kAdamwStepThreads - 1) / kAdamwStepThreads; }, "params");
    table.count = static_cast<int32_t>(count);
    table.grad_scale = args.grad_scale;
    table.noop = args.noop;
    table.lr_device = args.lr_device;
    table.beta1 = args.hparams.beta1;
    table.beta2 = args.hparams.beta2;
    table.eps = args.hparams.eps;
    table.decoupled = args.hparams.mode == ZF_ADAM_MODE_ADAMW ? 1 : 0;
    // Matrices with no rows have no update blocks but still count the step (as the host does).
    if (update_blocks > 0) {
      adamw_selected_kernel<<<update_blocks, kAdamwThreads, 0, cuda_stream>>>(table);
      check_launch("adamw_selected_kernel");
    }
    // After the update in stream order: every update block has read the old counts.
    adamw_count_steps_kernel<<<step_blocks, kAdamwStepThreads, 0, cuda_stream>>>(table);
    check_launch("adamw_count_steps_kernel");
  });
}

const bool registered = [] {
  cuda_ops().adamw_selected_columns = &adamw_selected_columns;
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace zf
