// Host launchers of the CUDA pack, scatter and selection exchange (kernels in
// pack_columns_kernel.cuh), registered in the CUDA launcher table (common/device_ops.hpp).
#include <algorithm>
#include <vector>

#include "common/device_ops.hpp"
#include "common/matrix_view.hpp"
#include "common/tensor.hpp"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/multi_tensor.cuh"
#include "cuda/pack/pack_columns_kernel.cuh"

namespace zf {
namespace cuda {
namespace {

StatePointers state_pointers(const zf_column_state& s) {
  StatePointers p{};
  p.master = numel(s.master) > 0 ? static_cast<float*>(s.master.data) : nullptr;
  p.exp_avg = static_cast<float*>(s.exp_avg.data);
  p.exp_avg_sq = static_cast<float*>(s.exp_avg_sq.data);
  p.steps = static_cast<int32_t*>(s.steps.data);
  return p;
}

void pack_or_scatter_columns(const zf_tensor* matrices, const zf_tensor* selected, const PackedLayout& layout,
                             const zf_tensor& packed, const float* scale, bool to_packed, zf_stream stream) {
  std::vector<PackMatrix> entries;
  for (size_t i = 0; i < layout.size(); ++i) {
    const PackedMatrix& m = layout[i];
    PackMatrix mat{};
    mat.matrix = matrices[i].data;
    mat.selected = m.selected > 0 ? static_cast<const int32_t*>(selected[i].data) : nullptr;
    mat.rows = m.rows;
    mat.packed_offset = m.offset;
    mat.cols = static_cast<int32_t>(m.cols);
    mat.k = static_cast<int32_t>(m.selected);
    mat.dtype = matrices[i].dtype;
    mat.row_chunks = static_cast<int32_t>((m.rows + kPackChunkRows - 1) / kPackChunkRows);
    if (m.rows == 0 || m.unselected() == 0) continue;
    entries.push_back(mat);
  }
  if (entries.empty()) return;
  const ScopedDevice device_guard(packed.device.index);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_launch_batch(entries.size(), kPackMaxMatricesPerLaunch, [&](size_t begin, size_t end) {
    PackLaunchTable table{};
    std::copy(entries.begin() + begin, entries.begin() + end, table.matrices);
    const unsigned blocks = number_blocks(
        table.matrices, end - begin, &PackMatrix::first_tile,
        [](const PackMatrix& m) { return (m.cols - m.k + kPackTile - 1) / kPackTile * int64_t{m.row_chunks}; },
        "matrices");
    table.count = static_cast<int32_t>(end - begin);
    table.packed = packed.data;
    table.packed_dtype = packed.dtype;
    table.scale = scale;
    if (to_packed) {
      pack_columns_kernel<true><<<blocks, kPackThreads, 0, cuda_stream>>>(table);
    } else {
      pack_columns_kernel<false><<<blocks, kPackThreads, 0, cuda_stream>>>(table);
    }
    check_launch(to_packed ? "pack_columns_kernel" : "scatter_columns_kernel");
  });
}

size_t exchange_workspace_bytes(const zf_tensor* old_selected, const zf_tensor* new_selected, size_t count) {
  size_t entries = 0;
  for (size_t i = 0; i < count; ++i) {
    entries += static_cast<size_t>(old_selected[i].shape[0] + new_selected[i].shape[0]);
  }
  return align_up(entries * sizeof(int32_t));
}

void exchange_selected_columns(const zf_tensor* old_selected, const zf_tensor* new_selected,
                               const zf_column_state* old_state, const zf_column_state* new_state,
                               const zf_column_state* entering, const zf_column_state* leaving, size_t count,
                               void* workspace, size_t, zf_stream stream) {
  std::vector<ExchangeMatrix> entries;
  int32_t* plan = static_cast<int32_t*>(workspace);
  for (size_t i = 0; i < count; ++i) {
    ExchangeMatrix mat{};
    mat.old_selected = static_cast<const int32_t*>(old_selected[i].data);
    mat.new_selected = static_cast<const int32_t*>(new_selected[i].data);
    mat.old_state = state_pointers(old_state[i]);
    mat.new_state = state_pointers(new_state[i]);
    mat.entering = state_pointers(entering[i]);
    mat.leaving = state_pointers(leaving[i]);
    mat.rows = old_state[i].exp_avg.shape[0];
    mat.k_old = static_cast<int32_t>(old_selected[i].shape[0]);
    mat.k_new = static_cast<int32_t>(new_selected[i].shape[0]);
    mat.entering_count = static_cast<int32_t>(numel(entering[i].steps));
    mat.leaving_count = static_cast<int32_t>(numel(leaving[i].steps));
    mat.plan_new = plan;
    mat.plan_old = plan + mat.k_new;
    plan += mat.k_new + mat.k_old;
    if (mat.k_old == 0 && mat.k_new == 0) continue;
    entries.push_back(mat);
  }
  if (entries.empty()) return;
  const ScopedDevice device_guard(old_selected[0].device.index);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_launch_batch(entries.size(), kExchangeMaxMatricesPerLaunch, [&](size_t begin, size_t end) {
    ExchangeLaunchTable table{};
    std::copy(entries.begin() + begin, entries.begin() + end, table.matrices);
    const unsigned blocks = number_blocks(
        table.matrices, end - begin, &ExchangeMatrix::first_tile,
        [](const ExchangeMatrix& m) { return (std::max(m.k_old, m.k_new) + kExchangeColumns - 1) / kExchangeColumns; },
        "old_selected");
    table.count = static_cast<int32_t>(end - begin);
    exchange_plan_kernel<<<static_cast<unsigned>(end - begin), kExchangeThreads, 0, cuda_stream>>>(table);
    check_launch("exchange_plan_kernel");
    exchange_move_kernel<<<blocks, kExchangeThreads, 0, cuda_stream>>>(table);
    check_launch("exchange_move_kernel");
  });
}

const bool registered = [] {
  CudaOps& table = cuda_ops();
  table.pack_or_scatter_columns = &pack_or_scatter_columns;
  table.exchange_workspace_bytes = &exchange_workspace_bytes;
  table.exchange_selected_columns = &exchange_selected_columns;
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace zf
