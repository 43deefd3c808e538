// Host launcher of the CUDA column statistics (kernel in column_stats_kernel.cuh).
#include <algorithm>
#include <vector>

#include "common/device_ops.hpp"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/multi_tensor.cuh"
#include "cuda/norms/column_stats_kernel.cuh"

namespace zf {
namespace cuda {
namespace {

struct StatsPlan {
  std::vector<StatsMatrix> matrices;  // non-empty-column matrices only
  int64_t tiles = 0;
  int64_t column_blocks = 0;
};

// The tiles of the call at `chunk_rows` rows per chunk.
StatsPlan plan_with_chunk(const zf_tensor* grads, const zf_tensor* col_sq, size_t count, int64_t chunk_rows) {
  StatsPlan plan;
  for (size_t i = 0; i < count; ++i) {
    const int64_t rows = grads[i].shape[0], cols = grads[i].shape[1];
    if (cols == 0) continue;
    require(cols <= INT32_MAX, ZF_ERROR_INVALID_VALUE, "grads[", i, "]: more than 2^31 columns");
    StatsMatrix mat{};
    mat.data = grads[i].data;
    mat.col_sq = col_sq ? static_cast<float*>(col_sq[i].data) : nullptr;
    mat.rows = rows;
    mat.cols = static_cast<int32_t>(cols);
    mat.dtype = grads[i].dtype;
    mat.chunk_rows = static_cast<int32_t>(chunk_rows);
    mat.chunks = static_cast<int32_t>(std::max<int64_t>(1, (rows + chunk_rows - 1) / chunk_rows));
    mat.column_blocks = static_cast<int32_t>((cols + kStatsBlockColumns - 1) / kStatsBlockColumns);
    mat.first_tile = plan.tiles;
    mat.first_block = plan.column_blocks;
    mat.vector_loads = (reinterpret_cast<uintptr_t>(grads[i].data) % 16 == 0) && (cols % 8 == 0);
    plan.tiles += static_cast<int64_t>(mat.chunks) * mat.column_blocks;
    plan.column_blocks += mat.column_blocks;
    plan.matrices.push_back(mat);
  }
  return plan;
}

// 1024-row chunks, halved while the call has fewer tiles than fill the GPU (a lone matrix,
// a short list); the shapes alone decide, so the sums' order is fixed by them.
StatsPlan plan_column_stats(const zf_tensor* grads, const zf_tensor* col_sq, size_t count) {
  int64_t chunk_rows = kStatsChunkRows;
  StatsPlan plan = plan_with_chunk(grads, col_sq, count, chunk_rows);
  while (plan.tiles < kStatsTargetTiles && chunk_rows > kStatsMinChunkRows) {
    chunk_rows /= 2;
    plan = plan_with_chunk(grads, col_sq, count, chunk_rows);
  }
  return plan;
}

struct WorkspaceLayout {
  size_t partials, block_totals, block_tickets, final_ticket, bytes;
};

WorkspaceLayout layout_for(const StatsPlan& plan) {
  WorkspaceLayout layout{};
  size_t offset = 0;
  layout.partials = offset;
  offset = align_up(offset + static_cast<size_t>(plan.tiles) * kStatsBlockColumns * sizeof(double));
  layout.block_totals = offset;
  offset = align_up(offset + static_cast<size_t>(plan.column_blocks) * sizeof(double));
  layout.block_tickets = offset;
  offset = align_up(offset + static_cast<size_t>(plan.column_blocks) * sizeof(unsigned int));
  layout.final_ticket = offset;
  offset = align_up(offset + sizeof(unsigned int));
  layout.bytes = offset;
  return layout;
}

size_t column_stats_workspace_bytes(const zf_tensor* grads, size_t count) {
  return layout_for(plan_column_stats(grads, nullptr, count)).bytes;
}

void column_stats(const zf_tensor* grads, const zf_tensor* col_sq, size_t count, float* total_sq, int32_t* nonfinite,
                  int device, bool accumulate, void* workspace, size_t workspace_bytes, zf_stream stream) {
  const StatsPlan plan = plan_column_stats(grads, col_sq, count);
  const WorkspaceLayout layout = layout_for(plan);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const ScopedDevice device_guard(device);
  if (plan.column_blocks == 0) {
    // Nothing to read: the total is 0 and no element is non-finite.
    check_cuda(cudaMemsetAsync(total_sq, 0, sizeof(float), cuda_stream), "cudaMemsetAsync(total_sq)");
    check_cuda(cudaMemsetAsync(nonfinite, 0, sizeof(int32_t), cuda_stream), "cudaMemsetAsync(nonfinite)");
    return;
  }
  char* base = static_cast<char*>(workspace);
  // Tickets and the final counter are contiguous at the end: one memset clears both.
  check_cuda(cudaMemsetAsync(base + layout.block_tickets, 0, layout.bytes - layout.block_tickets, cuda_stream),
             "cudaMemsetAsync(workspace)");
  StatsWorkspace ws{};
  ws.chunk_partials = reinterpret_cast<double*>(base + layout.partials);
  ws.block_totals = reinterpret_cast<double*>(base + layout.block_totals);
  ws.block_tickets = reinterpret_cast<unsigned int*>(base + layout.block_tickets);
  ws.final_ticket = reinterpret_cast<unsigned int*>(base + layout.final_ticket);
  ws.total_sq = total_sq;
  ws.nonfinite = nonfinite;

  // Tiles are numbered across the whole call (the reduction spans launches); each launch
  // starts at its first matrix's first tile.
  for_each_launch_batch(plan.matrices.size(), kStatsMaxMatricesPerLaunch, [&](size_t begin, size_t end) {
    StatsLaunchTable table{};
    table.count = static_cast<int32_t>(end - begin);
    std::copy(plan.matrices.begin() + begin, plan.matrices.begin() + end, table.matrices);
    table.tile_begin = plan.matrices[begin].first_tile;
    table.total_column_blocks = plan.column_blocks;
    table.accumulate = accumulate ? 1 : 0;
    const int64_t tile_end = end < plan.matrices.size() ? plan.matrices[end].first_tile : plan.tiles;
    const int64_t blocks = tile_end - table.tile_begin;
    require(blocks <= INT32_MAX, ZF_ERROR_INVALID_VALUE, "grads: too many tiles for one launch");
    column_stats_kernel<<<static_cast<unsigned>(blocks), kStatsThreads, 0, cuda_stream>>>(table, ws);
    check_launch("column_stats_kernel");
  });
}

const bool registered = [] {
  cuda_ops().column_stats_workspace_bytes = &column_stats_workspace_bytes;
  cuda_ops().column_stats = &column_stats;
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace zf
