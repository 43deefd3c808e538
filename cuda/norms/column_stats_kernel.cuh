// Fused column statistics kernel: per-column sums of squares, their total and the
// non-finite flag for a list of row-major gradients, in one launch and one read.
//
// Work split: a tile is (matrix, 256-column block, 1024-row chunk). A block of 256 threads
// reads its tile with 16-byte loads (8 columns per thread, one warp per row), squares in
// fp64 (exact) and sums in fp64. Partial sums go to the workspace in fp32; the last tile
// of a column block to finish (an atomic ticket) sums the chunks in chunk order, and the
// last column block sums the block totals in block order. Every order depends on shapes
// only, so the result is the same on every run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <cub/block/block_reduce.cuh>

#include "zenflow/zenflow.h"

namespace zf {
namespace cuda {

constexpr int kStatsThreads = 256;
constexpr int kStatsColumnsPerThread = 8;
constexpr int kStatsWarps = kStatsThreads / 32;
constexpr int kStatsBlockColumns = 32 * kStatsColumnsPerThread;  // 256
constexpr int64_t kStatsChunkRows = 1024;
constexpr int kStatsMaxMatricesPerLaunch = 192;  // by-value table of 12 KiB (limit: 32 KiB since CUDA 12.1)

struct StatsMatrix {
  const void* data;
  float* col_sq;
  int64_t rows;
  int32_t cols;
  int32_t dtype;          // zf_dtype
  int32_t chunks;         // ceil(rows / kStatsChunkRows), at least 1
  int32_t column_blocks;  // ceil(cols / kStatsBlockColumns)
  int64_t first_tile;     // global index of this matrix's first tile
  int64_t first_block;    // global index of its first column block
  int32_t vector_loads;   // data 16-byte aligned and cols a multiple of 8
};

// Passed by value (graph-capturable, no upload); lists longer than one table are split
// into several launches sharing the workspace and the global tile numbering.
struct StatsLaunchTable {
  StatsMatrix matrices[kStatsMaxMatricesPerLaunch];
  int32_t count;
  int64_t tile_begin;  // first global tile of this launch
  int64_t total_column_blocks;
  int32_t accumulate;
};

struct StatsWorkspace {
  float* chunk_partials;        // [tile][kStatsBlockColumns]
  double* block_totals;         // [column block]
  unsigned int* block_tickets;  // [column block], zeroed before the first launch
  unsigned int* final_ticket;   // [1], zeroed before the first launch
  float* total_sq;
  int32_t* nonfinite;
};

__device__ __forceinline__ void load_eight_as_float(const void* base, int32_t dtype, int64_t offset, bool vector,
                                                    int32_t valid, float out[kStatsColumnsPerThread]) {
  if (vector) {
    if (dtype == ZF_DTYPE_F32) {
      const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(base) + offset);
      const float4 a = __ldg(p), b = __ldg(p + 1);
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
      out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
      return;
    }
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + offset));
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint16_t lo = static_cast<uint16_t>(words[w] & 0xffffu), hi = static_cast<uint16_t>(words[w] >> 16);
      if (dtype == ZF_DTYPE_BF16) {
        out[2 * w] = __uint_as_float(static_cast<uint32_t>(lo) << 16);
        out[2 * w + 1] = __uint_as_float(static_cast<uint32_t>(hi) << 16);
      } else {
        out[2 * w] = __half2float(__ushort_as_half(lo));
        out[2 * w + 1] = __half2float(__ushort_as_half(hi));
      }
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < kStatsColumnsPerThread; ++c) {
    float value = 0.0f;
    if (c < valid) {
      if (dtype == ZF_DTYPE_F32) {
        value = static_cast<const float*>(base)[offset + c];
      } else {
        const uint16_t bits = static_cast<const uint16_t*>(base)[offset + c];
        value = dtype == ZF_DTYPE_BF16 ? __uint_as_float(static_cast<uint32_t>(bits) << 16)
                                       : __half2float(__ushort_as_half(bits));
      }
    }
    out[c] = value;
  }
}

__global__ void __launch_bounds__(kStatsThreads) column_stats_kernel(const StatsLaunchTable table, StatsWorkspace ws) {
  using BlockReduce = cub::BlockReduce<double, kStatsThreads>;
  __shared__ double warp_sums[kStatsWarps][kStatsBlockColumns];
  __shared__ typename BlockReduce::TempStorage reduce_storage;
  __shared__ bool is_last;

  const int64_t tile = table.tile_begin + blockIdx.x;
  int m = 0;
  while (m + 1 < table.count && table.matrices[m + 1].first_tile <= tile) ++m;
  const StatsMatrix& mat = table.matrices[m];
  const int64_t local_tile = tile - mat.first_tile;
  const int32_t column_block = static_cast<int32_t>(local_tile / mat.chunks);
  const int32_t chunk = static_cast<int32_t>(local_tile % mat.chunks);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t first_column = column_block * kStatsBlockColumns + lane * kStatsColumnsPerThread;
  const int32_t valid = max(0, min(kStatsColumnsPerThread, mat.cols - first_column));
  const int64_t row_begin = chunk * kStatsChunkRows;
  const int64_t row_end = min(mat.rows, row_begin + kStatsChunkRows);

  double sums[kStatsColumnsPerThread];
#pragma unroll
  for (int c = 0; c < kStatsColumnsPerThread; ++c) sums[c] = 0.0;
  if (valid > 0) {
    const bool vector = mat.vector_loads != 0 && valid == kStatsColumnsPerThread;
    for (int64_t row = row_begin + warp; row < row_end; row += kStatsWarps) {
      float values[kStatsColumnsPerThread];
      load_eight_as_float(mat.data, mat.dtype, row * mat.cols + first_column, vector, valid, values);
#pragma unroll
      for (int c = 0; c < kStatsColumnsPerThread; ++c) {
        const double wide = values[c];
        sums[c] = fma(wide, wide, sums[c]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kStatsColumnsPerThread; ++c) warp_sums[warp][lane * kStatsColumnsPerThread + c] = sums[c];
  __syncthreads();

  // Thread t owns column t of the block: sum the warps in order, store the chunk partial.
  double column_sum = 0.0;
#pragma unroll
  for (int w = 0; w < kStatsWarps; ++w) column_sum += warp_sums[w][threadIdx.x];
  const int64_t global_block = mat.first_block + column_block;
  float* partials =
      ws.chunk_partials + (mat.first_tile + static_cast<int64_t>(column_block) * mat.chunks) * kStatsBlockColumns;
  partials[static_cast<int64_t>(chunk) * kStatsBlockColumns + threadIdx.x] = static_cast<float>(column_sum);

  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    is_last = atomicAdd(ws.block_tickets + global_block, 1u) == static_cast<unsigned>(mat.chunks - 1);
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  // Last chunk of this column block: fold the chunks in chunk order.
  double column_total = 0.0;
  for (int32_t c = 0; c < mat.chunks; ++c) {
    column_total += static_cast<double>(__ldcg(partials + static_cast<int64_t>(c) * kStatsBlockColumns + threadIdx.x));
  }
  const int32_t column = column_block * kStatsBlockColumns + threadIdx.x;
  if (column < mat.cols) {
    const double previous = table.accumulate ? static_cast<double>(mat.col_sq[column]) : 0.0;
    mat.col_sq[column] = static_cast<float>(column_total + previous);
  } else {
    column_total = 0.0;
  }
  const double block_total = BlockReduce(reduce_storage).Sum(column_total);
  if (threadIdx.x == 0) ws.block_totals[global_block] = block_total;

  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    is_last = atomicAdd(ws.final_ticket, 1u) == static_cast<unsigned>(table.total_column_blocks - 1);
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();

  // Last column block overall: the global total, strided by thread then tree-reduced,
  // both in an order fixed by the number of column blocks.
  double strided = 0.0;
  for (int64_t b = threadIdx.x; b < table.total_column_blocks; b += kStatsThreads)
    strided += __ldcg(ws.block_totals + b);
  __syncthreads();  // reduce_storage is reused
  const double total = BlockReduce(reduce_storage).Sum(strided);
  if (threadIdx.x == 0) {
    *ws.total_sq = static_cast<float>(total);
    // Squares of finite values cannot overflow fp64: a non-finite total means a
    // non-finite input (the host implementation uses the same rule).
    *ws.nonfinite = isfinite(total) ? 0 : 1;
  }
}

}  // namespace cuda
}  // namespace zf
