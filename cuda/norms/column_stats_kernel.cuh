// Fused column statistics kernel: per-column sums of squares, their total and the
// non-finite flag for a list of row-major gradients, in one launch and one read.
//
// Work split: a tile is (matrix, 256-column block, row chunk). The chunk is 1024 rows, or
// fewer (down to 128) when the call has too few tiles to fill the GPU: a lone [4096, 4096]
// gradient is 16 column blocks, 64 tiles at 1024 rows for 132 SMs, 512 at 128. The chunk
// size follows from the call's shapes only, so the order of the sums does too. A block of 256 threads
// reads its tile with 16-byte loads (8 columns per thread, one warp per row, 4 rows in
// flight per warp), squares in fp64 (exact) and sums in fp64. Partial sums stay in fp64 in
// the workspace; the last tile of a column block to finish (an atomic ticket) sums the
// chunks in chunk order, and the last column block sums the block totals in block order.
// Every order depends on shapes only, so the result is the same on every run. Nothing is
// rounded before the final fp32 outputs, and no fp64 sum of squares of finite 16/32-bit
// values can overflow: the total is non-finite exactly when an input is, which is the
// flag the host reports too.
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
constexpr int64_t kStatsChunkRows = 1024;                        // the chunk of a call with enough tiles
constexpr int64_t kStatsMinChunkRows = 128;                      // 4 passes of the block's 8 warps x 4 rows
constexpr int64_t kStatsTargetTiles = 4 * 132;                   // a few blocks per SM of an H100 / H200
constexpr int kStatsMaxMatricesPerLaunch = 192;  // by-value table of 12 KiB (limit: 32 KiB since CUDA 12.1)

struct StatsMatrix {
  const void* data;
  float* col_sq;
  int64_t rows;
  int32_t cols;
  int32_t dtype;          // zf_dtype
  int32_t chunks;         // ceil(rows / chunk_rows), at least 1
  int32_t chunk_rows;     // the call's chunk (every matrix of a call has the same)
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
  double* chunk_partials;       // [tile][kStatsBlockColumns]
  double* block_totals;         // [column block]
  unsigned int* block_tickets;  // [column block], zeroed before the first launch
  unsigned int* final_ticket;   // [1], zeroed before the first launch
  float* total_sq;
  int32_t* nonfinite;
};

// The eight raw values one lane reads per row, loaded before any is converted so that the
// loads of every row in flight are issued back to back (a conversion right after a load
// would wait for it). Vector form: one 16-byte load (16-bit types) or two (fp32).
template <int32_t kDtype>
struct RawEight {
  static constexpr bool kWide = kDtype == ZF_DTYPE_F32;
  uint4 words[kWide ? 2 : 1];
};

template <int32_t kDtype>
__device__ __forceinline__ RawEight<kDtype> load_raw_vector(const void* base, int64_t offset) {
  RawEight<kDtype> raw;
  if constexpr (RawEight<kDtype>::kWide) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(base) + offset);
    raw.words[0] = __ldg(p);
    raw.words[1] = __ldg(p + 1);
  } else {
    raw.words[0] = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + offset));
  }
  return raw;
}

// Scalar form for unaligned data or the last, partial group of columns: `valid` values,
// zero bits past it (which square to 0).
template <int32_t kDtype>
__device__ __forceinline__ RawEight<kDtype> load_raw_scalar(const void* base, int64_t offset, int32_t valid) {
  uint32_t bits[kStatsColumnsPerThread];
#pragma unroll
  for (int c = 0; c < kStatsColumnsPerThread; ++c) {
    if constexpr (RawEight<kDtype>::kWide) {
      bits[c] = c < valid ? __ldg(static_cast<const uint32_t*>(base) + offset + c) : 0u;
    } else {
      bits[c] = c < valid ? static_cast<uint32_t>(__ldg(static_cast<const unsigned short*>(base) + offset + c)) : 0u;
    }
  }
  RawEight<kDtype> raw;
  if constexpr (RawEight<kDtype>::kWide) {
    raw.words[0] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
    raw.words[1] = make_uint4(bits[4], bits[5], bits[6], bits[7]);
  } else {
    raw.words[0] =
        make_uint4(bits[0] | bits[1] << 16, bits[2] | bits[3] << 16, bits[4] | bits[5] << 16, bits[6] | bits[7] << 16);
  }
  return raw;
}

template <int32_t kDtype>
__device__ __forceinline__ float raw_to_float(uint32_t bits) {
  if constexpr (kDtype == ZF_DTYPE_F32) return __uint_as_float(bits);
  if constexpr (kDtype == ZF_DTYPE_BF16) return __uint_as_float(bits << 16);
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// sums[c] += value_c^2, squared and summed in fp64: the square of any fp32 value is exact
// in fp64 and no sum of them overflows, so a sum is non-finite only for a non-finite input.
template <int32_t kDtype>
__device__ __forceinline__ void accumulate_squares(const RawEight<kDtype>& raw, double sums[kStatsColumnsPerThread]) {
  uint32_t bits[kStatsColumnsPerThread];
  if constexpr (RawEight<kDtype>::kWide) {
    const uint4 a = raw.words[0], b = raw.words[1];
    bits[0] = a.x, bits[1] = a.y, bits[2] = a.z, bits[3] = a.w;
    bits[4] = b.x, bits[5] = b.y, bits[6] = b.z, bits[7] = b.w;
  } else {
    const uint32_t words[4] = {raw.words[0].x, raw.words[0].y, raw.words[0].z, raw.words[0].w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      bits[2 * w] = words[w] & 0xffffu;
      bits[2 * w + 1] = words[w] >> 16;
    }
  }
#pragma unroll
  for (int c = 0; c < kStatsColumnsPerThread; ++c) {
    const double wide = raw_to_float<kDtype>(bits[c]);
    sums[c] = fma(wide, wide, sums[c]);
  }
}

// Rows one warp keeps in flight, 64 bytes per lane for every dtype: their raw loads are
// all issued before the first square.
template <int32_t kDtype>
constexpr int kStatsRowsInFlight = RawEight<kDtype>::kWide ? 2 : 4;

// One lane's eight columns over the rows row_begin + warp, + kStatsWarps, ... < row_end, in
// row order (the order, hence the sums, do not depend on the unrolling). kVector: 16-byte
// loads (aligned rows, eight valid columns), a template parameter so that the unrolled loop
// body is straight-line loads, then conversions.
template <int32_t kDtype, bool kVector>
__device__ __forceinline__ void accumulate_rows(const void* base, int64_t cols, int64_t first_column, int64_t row_begin,
                                                int64_t row_end, int32_t valid, double sums[kStatsColumnsPerThread]) {
  constexpr int kInFlight = kStatsRowsInFlight<kDtype>;
  int64_t row = row_begin;
  for (; row + (kInFlight - 1) * kStatsWarps < row_end; row += int64_t{kInFlight} * kStatsWarps) {
    RawEight<kDtype> raw[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int64_t offset = (row + i * kStatsWarps) * cols + first_column;
      raw[i] = kVector ? load_raw_vector<kDtype>(base, offset) : load_raw_scalar<kDtype>(base, offset, valid);
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) accumulate_squares<kDtype>(raw[i], sums);
  }
  for (; row < row_end; row += kStatsWarps) {
    const int64_t offset = row * cols + first_column;
    const RawEight<kDtype> raw =
        kVector ? load_raw_vector<kDtype>(base, offset) : load_raw_scalar<kDtype>(base, offset, valid);
    accumulate_squares<kDtype>(raw, sums);
  }
}

// 3 blocks per SM: 80 registers without a spill (left to itself, ptxas picks 80 and spills).
__global__ void __launch_bounds__(kStatsThreads, 3)
    column_stats_kernel(const StatsLaunchTable table, StatsWorkspace ws) {
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
  const int64_t row_begin = static_cast<int64_t>(chunk) * mat.chunk_rows;
  const int64_t row_end = min(mat.rows, row_begin + mat.chunk_rows);

  double sums[kStatsColumnsPerThread];
#pragma unroll
  for (int c = 0; c < kStatsColumnsPerThread; ++c) sums[c] = 0.0;
  if (valid > 0) {
    // The dtype and the load width are uniform over a lane's rows: one branch here, none
    // per element.
    const bool vector = mat.vector_loads != 0 && valid == kStatsColumnsPerThread;
    const int64_t first_row = row_begin + warp;
    const void* data = mat.data;
    if (mat.dtype == ZF_DTYPE_F32) {
      if (vector) {
        accumulate_rows<ZF_DTYPE_F32, true>(data, mat.cols, first_column, first_row, row_end, valid, sums);
      } else {
        accumulate_rows<ZF_DTYPE_F32, false>(data, mat.cols, first_column, first_row, row_end, valid, sums);
      }
    } else if (mat.dtype == ZF_DTYPE_BF16) {
      if (vector) {
        accumulate_rows<ZF_DTYPE_BF16, true>(data, mat.cols, first_column, first_row, row_end, valid, sums);
      } else {
        accumulate_rows<ZF_DTYPE_BF16, false>(data, mat.cols, first_column, first_row, row_end, valid, sums);
      }
    } else if (vector) {
      accumulate_rows<ZF_DTYPE_F16, true>(data, mat.cols, first_column, first_row, row_end, valid, sums);
    } else {
      accumulate_rows<ZF_DTYPE_F16, false>(data, mat.cols, first_column, first_row, row_end, valid, sums);
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
  double* partials =
      ws.chunk_partials + (mat.first_tile + static_cast<int64_t>(column_block) * mat.chunks) * kStatsBlockColumns;
  partials[static_cast<int64_t>(chunk) * kStatsBlockColumns + threadIdx.x] = column_sum;

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
    column_total += __ldcg(partials + static_cast<int64_t>(c) * kStatsBlockColumns + threadIdx.x);
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
    // Exact rule (no fp64 sum of finite squares overflows): non-finite total <=> some
    // non-finite input, the host's definition of the flag.
    *ws.nonfinite = isfinite(total) ? 0 : 1;
  }
}

}  // namespace cuda
}  // namespace zf
