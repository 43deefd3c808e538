// Host launchers of the CUDA pack, scatter and selection exchange (kernels in
// pack_columns_kernel.cuh).
#include <algorithm>
#include <vector>

#include "cuda/common/cuda_check.cuh"
#include "cuda/pack/pack_columns_kernel.cuh"
#include "cuda/pack/pack_columns_launch.hpp"
#include "ops/column_ops.hpp"

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

// Splits `entries` into launches of at most `per_launch`, numbering blocks from 0 in each.
template <class Entry, class Launch>
void launch_in_batches(std::vector<Entry>& entries, const std::vector<int64_t>& blocks_of, size_t per_launch,
                       Launch&& launch) {
  for (size_t begin = 0; begin < entries.size(); begin += per_launch) {
    const size_t end = std::min(entries.size(), begin + per_launch);
    int64_t blocks = 0;
    for (size_t i = begin; i < end; ++i) {
      entries[i].first_tile = blocks;
      blocks += blocks_of[i];
    }
    require(blocks <= INT32_MAX, ZF_ERROR_INVALID_VALUE, "too many tiles for one launch");
    launch(begin, end, static_cast<unsigned>(blocks));
  }
}

}  // namespace

void pack_or_scatter_columns(const zf_tensor* matrices, const zf_tensor* selected, size_t count,
                             const zf_tensor& packed, const float* scale, bool to_packed, zf_stream stream) {
  std::vector<PackMatrix> entries;
  std::vector<int64_t> blocks_of;
  int64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    const MatrixView view = matrix_view(matrices[i]);
    const int64_t k = selected ? selected[i].shape[0] : 0;
    const int64_t unselected = view.cols - k;
    PackMatrix mat{};
    mat.matrix = matrices[i].data;
    mat.selected = selected ? static_cast<const int32_t*>(selected[i].data) : nullptr;
    mat.rows = view.rows;
    mat.packed_offset = offset;
    mat.cols = static_cast<int32_t>(view.cols);
    mat.k = static_cast<int32_t>(k);
    mat.dtype = matrices[i].dtype;
    mat.row_chunks = static_cast<int32_t>((view.rows + kPackChunkRows - 1) / kPackChunkRows);
    offset += view.rows * unselected;
    if (view.rows == 0 || unselected == 0) continue;
    entries.push_back(mat);
    blocks_of.push_back((unselected + kPackTile - 1) / kPackTile * mat.row_chunks);
  }
  if (entries.empty()) return;
  const ScopedDevice device_guard(packed.device.index);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  launch_in_batches(entries, blocks_of, kPackMaxMatricesPerLaunch, [&](size_t begin, size_t end, unsigned blocks) {
    PackLaunchTable table{};
    std::copy(entries.begin() + begin, entries.begin() + end, table.matrices);
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
  std::vector<int64_t> blocks_of;
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
    blocks_of.push_back((std::max(mat.k_old, mat.k_new) + kExchangeColumns - 1) / kExchangeColumns);
  }
  if (entries.empty()) return;
  const ScopedDevice device_guard(old_selected[0].device.index);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  launch_in_batches(entries, blocks_of, kExchangeMaxMatricesPerLaunch, [&](size_t begin, size_t end, unsigned blocks) {
    ExchangeLaunchTable table{};
    std::copy(entries.begin() + begin, entries.begin() + end, table.matrices);
    table.count = static_cast<int32_t>(end - begin);
    exchange_plan_kernel<<<static_cast<unsigned>(end - begin), kExchangeThreads, 0, cuda_stream>>>(table);
    check_launch("exchange_plan_kernel");
    exchange_move_kernel<<<blocks, kExchangeThreads, 0, cuda_stream>>>(table);
    check_launch("exchange_move_kernel");
  });
}

}  // namespace cuda
}  // namespace zf
