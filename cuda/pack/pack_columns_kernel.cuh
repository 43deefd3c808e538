// Pack (row-major matrices -> column-major staging buffer) and scatter (the inverse) of
// the unselected columns, and the device side of a selection change.
//
// Pack/scatter are transposes restricted to the unselected columns: a block takes 32
// consecutive unselected columns of one matrix and a chunk of rows, and moves 32 x 32
// tiles through shared memory, so that the matrix side is read/written along rows (lanes
// over columns: the sectors holding them) and the packed side along columns (lanes over
// rows: contiguous runs). Lane l finds its matrix column once with unselected_column()
// (cpp/src/common/column_index.hpp, shared with the host twin). Pack reads the matrix side
// as 16-byte vectors of the row spans its columns cover (several rows per warp load) and
// picks its columns out of shared memory; the conversion is the scalar one, so the packed
// values are the same bits either way.
//
// Bytes in flight: a pack is a strided read of the gradient, so the loads of several tiles
// must be outstanding to cover the latency (about 24 KiB per SM on an H200; one tile's loads
// were about 8 KiB). Each lane holds eight 16-byte registers for the span loads; a tile
// needs 1, 2 or 4 of them (spans of up to 8, 16 or 32 vectors per row), and the ring holds
// the loads of the next 8, 4 or 2 tiles: with 2 blocks per SM (120 registers), 20 to 64 KiB
// per SM by the span's width (at k = 10%, about 5 vectors of bf16 per row: 40 KiB).
#pragma once

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "common/column_index.hpp"

namespace zf {
namespace cuda {

constexpr int kPackTile = 32;
constexpr int kPackRowWarps = 8;
constexpr int kPackThreads = kPackTile * kPackRowWarps;
constexpr int64_t kPackChunkRows = 512;
constexpr int kPackMaxMatricesPerLaunch = 256;  // by-value table of 14 KiB

struct PackMatrix {
  void* matrix;
  const int32_t* selected;  // nullptr: nothing selected
  int64_t rows;
  int64_t packed_offset;  // first packed element of this matrix
  int64_t first_tile;     // first block of this matrix within the launch
  int32_t cols;
  int32_t k;
  int32_t dtype;
  int32_t row_chunks;
};

struct PackLaunchTable {
  PackMatrix matrices[kPackMaxMatricesPerLaunch];
  void* packed;
  const float* scale;  // pack only; nullptr: 1
  int32_t packed_dtype;
  int32_t count;
};

template <class Entry>
__device__ __forceinline__ int find_entry(const Entry* entries, int count, int64_t block) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (entries[mid].first_tile <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// kToPacked: pack; otherwise scatter. A template parameter so each loop body is branch-free.
// Pack's vector path: warp w owns tile rows 4w .. 4w+3 and reads the 16-byte vectors of
// their row spans, several rows per load when the span is short (8 lanes per row for up to
// 8 vectors: 4 rows and up to 512 bytes per warp load; 16 lanes: 2 rows; 32 lanes: 1 row).
constexpr int kSpanRows = kPackTile / kPackRowWarps;  // 4
constexpr int kSpanRegisters = 8;                     // 16-byte registers per lane for the span loads' ring
struct SpanLoad {
  const uint4* matrix;  // the matrix from its first row's first span vector
  int64_t row_vectors;  // 16-byte vectors per matrix row
  int vectors;          // span vectors per row (1 .. 32)
  int lane_row, lane_vector;
};

// The span loads of one tile for a span of kLanesPerRow lanes per row: kLoads loads per
// lane, lane l's i-th holding tile row 4w + i * (32 / kLanesPerRow) + l / kLanesPerRow
// (zero where the lane has none: past the span or past row_end).
template <int kLanesPerRow>
struct SpanTile {
  static constexpr int kRowsPerLoad = kPackTile / kLanesPerRow;  // 4, 2, 1
  static constexpr int kLoads = kSpanRows / kRowsPerLoad;        // 1, 2, 4
  static constexpr int kAhead = kSpanRegisters / kLoads;         // tiles in flight: 8, 4, 2
  uint4 raw[kLoads];
};

template <int kLanesPerRow>
__device__ __forceinline__ void load_span_tile(const SpanLoad& span, int64_t r0, int64_t row_end, int warp,
                                               SpanTile<kLanesPerRow>& tile) {
#pragma unroll
  for (int i = 0; i < SpanTile<kLanesPerRow>::kLoads; ++i) {
    tile.raw[i] = make_uint4(0u, 0u, 0u, 0u);
    const int64_t r = r0 + warp * kSpanRows + i * SpanTile<kLanesPerRow>::kRowsPerLoad + span.lane_row;
    if (span.lane_vector < span.vectors && r < row_end) {
      tile.raw[i] = __ldg(span.matrix + r * span.row_vectors + span.lane_vector);
    }
  }
}

template <int kLanesPerRow>
__device__ __forceinline__ void stage_span_tile(const SpanLoad& span, int warp, const SpanTile<kLanesPerRow>& tile,
                                                uint4 (*staged)[kPackTile]) {
#pragma unroll
  for (int i = 0; i < SpanTile<kLanesPerRow>::kLoads; ++i) {
    const int row = warp * kSpanRows + i * SpanTile<kLanesPerRow>::kRowsPerLoad + span.lane_row;
    if (span.lane_vector < span.vectors) staged[row][span.lane_vector] = tile.raw[i];
  }
}

// Pack's vector path over the block's rows [row_begin, row_end): tile by tile, the staged
// raw rows are compacted to this lane's column, transposed through `tile`, and stored
// column-major; the loads of the next kAhead tiles are in flight meanwhile. The ring's
// slot of a tile is static (the loop is unrolled over the ring), so it stays in registers.
template <int kLanesPerRow>
__device__ __forceinline__ void pack_span_rows(const PackMatrix& mat, const PackLaunchTable& table, SpanLoad span,
                                               int64_t span_first_vector, int64_t column, int64_t first,
                                               int64_t unselected, float scale, int64_t row_begin, int64_t row_end,
                                               int lane, int warp, float (*tile)[kPackTile + 1],
                                               uint4 (*staged)[kPackTile]) {
  constexpr int kAhead = SpanTile<kLanesPerRow>::kAhead;
  span.lane_row = lane / kLanesPerRow;
  span.lane_vector = lane % kLanesPerRow;
  SpanTile<kLanesPerRow> ring[kAhead];
#pragma unroll
  for (int d = 0; d < kAhead; ++d)
    load_span_tile<kLanesPerRow>(span, row_begin + d * kPackTile, row_end, warp, ring[d]);
  const int64_t position_base = span_first_vector * (mat.dtype == ZF_DTYPE_F32 ? 4 : 8);
  for (int64_t base = row_begin; base < row_end; base += int64_t{kAhead} * kPackTile) {
#pragma unroll
    for (int d = 0; d < kAhead; ++d) {
      const int64_t r0 = base + d * kPackTile;
      if (r0 >= row_end) break;  // uniform over the block
      stage_span_tile<kLanesPerRow>(span, warp, ring[d], staged);
      load_span_tile<kLanesPerRow>(span, r0 + int64_t{kAhead} * kPackTile, row_end, warp, ring[d]);
      __syncwarp();
#pragma unroll
      for (int i = 0; i < kSpanRows; ++i) {
        const int row = warp * kSpanRows + i;
        float value = 0.0f;
        if (r0 + row < row_end && column >= 0) {
          value =
              load_as_float(staged[row], mat.dtype, column - position_base) * scale;  // the scalar path's conversion
        }
        tile[row][lane] = value;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPackTile / kPackRowWarps; ++i) {
        const int j = warp + i * kPackRowWarps;
        const int64_t r = r0 + lane;
        if (first + j < unselected && r < row_end) {
          store_from_float(table.packed, table.packed_dtype, packed_index(mat.packed_offset, mat.rows, first + j, r),
                           tile[lane][j]);
        }
      }
      __syncthreads();  // the tile and the staged rows are refilled next
    }
  }
}

// At least 2 blocks per SM: caps registers at 128 (pack's vector path holds its ring of eight
// 16-byte loads per lane: 120 registers, no spill); scatter uses fewer and fits 3.
template <bool kToPacked>
__global__ void __launch_bounds__(kPackThreads, 2) pack_columns_kernel(const PackLaunchTable table) {
  __shared__ float tile[kPackTile][kPackTile + 1];                // +1: column reads hit 32 banks
  __shared__ uint4 staged[kToPacked ? kPackTile : 1][kPackTile];  // raw row spans (pack's vector path)
  const PackMatrix mat = table.matrices[find_entry(table.matrices, table.count, blockIdx.x)];
  const int64_t local = static_cast<int64_t>(blockIdx.x) - mat.first_tile;
  const int64_t column_tile = local / mat.row_chunks;
  const int64_t chunk = local % mat.row_chunks;
  const int64_t unselected = static_cast<int64_t>(mat.cols) - mat.k;
  const int lane = threadIdx.x % kPackTile, warp = threadIdx.x / kPackTile;
  const int64_t first = column_tile * kPackTile;

  // This lane's column on the matrix side (-1: past the end, or a bad index list).
  int64_t column = -1;
  if (first + lane < unselected) {
    column = unselected_column(mat.selected, mat.k, first + lane);
    if (column >= mat.cols) column = -1;
  }
  const float scale = (kToPacked && table.scale != nullptr) ? *table.scale : 1.0f;
  const int64_t row_begin = chunk * kPackChunkRows;
  const int64_t row_end = min(mat.rows, row_begin + kPackChunkRows);

  // Pack reads the matrix side through the vector path when it can: the block's columns
  // span at most 32 16-byte vectors of each row, and rows start 16-byte aligned. It is
  // uniform over the block (every warp computes the same columns).
  int64_t span_first_vector = 0;
  int span_vectors = 0;  // 0: scalar path
  if (kToPacked) {
    const int64_t element_bytes = mat.dtype == ZF_DTYPE_F32 ? 4 : 2;
    const int64_t per_vector = 16 / element_bytes;
    const bool aligned =
        reinterpret_cast<uintptr_t>(mat.matrix) % 16 == 0 && (static_cast<int64_t>(mat.cols) * element_bytes) % 16 == 0;
    unsigned lowest = column >= 0 ? static_cast<unsigned>(column) : 0xffffffffu;
    unsigned highest = column >= 0 ? static_cast<unsigned>(column) : 0u;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {  // butterfly: every lane ends with both
      lowest = min(lowest, __shfl_xor_sync(0xffffffffu, lowest, offset));
      highest = max(highest, __shfl_xor_sync(0xffffffffu, highest, offset));
    }
    if (aligned && lowest != 0xffffffffu) {
      span_first_vector = lowest / per_vector;
      const int64_t vectors = highest / per_vector - span_first_vector + 1;
      if (vectors <= kPackTile) span_vectors = static_cast<int>(vectors);
    }
  }

  if constexpr (kToPacked) {
    if (span_vectors > 0) {
      SpanLoad span{};
      span.vectors = span_vectors;
      span.row_vectors = static_cast<int64_t>(mat.cols) * (mat.dtype == ZF_DTYPE_F32 ? 4 : 2) / 16;
      span.matrix = static_cast<const uint4*>(mat.matrix) + span_first_vector;
      if (span_vectors <= 8) {
        pack_span_rows<8>(mat, table, span, span_first_vector, column, first, unselected, scale, row_begin, row_end,
                          lane, warp, tile, staged);
      } else if (span_vectors <= 16) {
        pack_span_rows<16>(mat, table, span, span_first_vector, column, first, unselected, scale, row_begin, row_end,
                           lane, warp, tile, staged);
      } else {
        pack_span_rows<32>(mat, table, span, span_first_vector, column, first, unselected, scale, row_begin, row_end,
                           lane, warp, tile, staged);
      }
      return;
    }
  }

  for (int64_t r0 = row_begin; r0 < row_end; r0 += kPackTile) {
    if (kToPacked) {
      // Scalar path (unaligned rows, or selected columns spreading the block's columns over
      // more than 32 vectors): the raw elements of this warp's rows first, then the
      // conversions.
      uint32_t bits[kPackTile / kPackRowWarps];
#pragma unroll
      for (int i = 0; i < kPackTile / kPackRowWarps; ++i) {
        const int64_t r = r0 + warp + i * kPackRowWarps;
        bits[i] = 0u;
        if (r < row_end && column >= 0) {
          const int64_t index = row_major_index(mat.cols, r, column);
          bits[i] = mat.dtype == ZF_DTYPE_F32 ? __ldg(static_cast<const unsigned*>(mat.matrix) + index)
                                              : __ldg(static_cast<const unsigned short*>(mat.matrix) + index);
        }
      }
#pragma unroll
      for (int i = 0; i < kPackTile / kPackRowWarps; ++i) {
        const int row = warp + i * kPackRowWarps;
        float value = 0.0f;
        if (r0 + row < row_end && column >= 0) {
          if (mat.dtype == ZF_DTYPE_F32) {
            value = __uint_as_float(bits[i]) * scale;
          } else {
            const uint16_t half = static_cast<uint16_t>(bits[i]);
            value = load_as_float(&half, mat.dtype, 0) * scale;
          }
        }
        tile[row][lane] = value;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPackTile / kPackRowWarps; ++i) {
        const int j = warp + i * kPackRowWarps;
        const int64_t r = r0 + lane;
        if (first + j < unselected && r < row_end) {
          store_from_float(table.packed, table.packed_dtype, packed_index(mat.packed_offset, mat.rows, first + j, r),
                           tile[lane][j]);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPackTile / kPackRowWarps; ++i) {
        const int j = warp + i * kPackRowWarps;
        const int64_t r = r0 + lane;
        if (first + j < unselected && r < row_end) {
          tile[lane][j] =
              load_as_float(table.packed, table.packed_dtype, packed_index(mat.packed_offset, mat.rows, first + j, r));
        }
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPackTile / kPackRowWarps; ++i) {
        const int row = warp + i * kPackRowWarps;
        const int64_t r = r0 + row;
        if (r < row_end && column >= 0) {
          store_from_float(mat.matrix, mat.dtype, row_major_index(mat.cols, r, column), tile[row][lane]);
        }
      }
    }
    __syncthreads();  // the tile is refilled next iteration
  }
}

// ---- selection exchange -------------------------------------------------------------------

constexpr int kExchangeThreads = 256;
constexpr int kExchangeColumns = 32;
constexpr int kExchangeRowWarps = kExchangeThreads / kExchangeColumns;
constexpr int kExchangeMaxMatricesPerLaunch = 96;  // by-value table of 19 KiB

struct StatePointers {
  float* master;  // nullptr: no master
  float* exp_avg;
  float* exp_avg_sq;
  int32_t* steps;
};

struct ExchangeMatrix {
  const int32_t* old_selected;
  const int32_t* new_selected;
  StatePointers old_state, new_state, entering, leaving;
  int32_t* plan_new;  // [k_new]: q >= 0 (staying, from old position q) or -(e + 1) (e-th entering)
  int32_t* plan_old;  // [k_old]: l >= 0 (l-th leaving) or -1 (staying)
  int64_t rows;
  int64_t first_tile;  // first block of this matrix in the move launch
  int32_t k_old;
  int32_t k_new;
  int32_t entering_count;
  int32_t leaving_count;
};

struct ExchangeLaunchTable {
  ExchangeMatrix matrices[kExchangeMaxMatricesPerLaunch];
  int32_t count;
};

// One block per matrix: ranks of the entering and leaving columns by block-wide prefix
// sums in ascending column order.
__global__ void __launch_bounds__(kExchangeThreads) exchange_plan_kernel(const ExchangeLaunchTable table) {
  using BlockScan = cub::BlockScan<int, kExchangeThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  const ExchangeMatrix mat = table.matrices[blockIdx.x];
  int running = 0;
  for (int32_t base = 0; base < mat.k_new; base += kExchangeThreads) {
    const int32_t p = base + threadIdx.x;
    const int32_t q = p < mat.k_new ? find_in_sorted(mat.old_selected, mat.k_old, mat.new_selected[p]) : 0;
    const int enters = (p < mat.k_new && q < 0) ? 1 : 0;
    int before, total;
    BlockScan(scan_storage).ExclusiveSum(enters, before, total);
    if (p < mat.k_new) mat.plan_new[p] = enters ? -(running + before + 1) : q;
    running += total;
    __syncthreads();
  }
  running = 0;
  for (int32_t base = 0; base < mat.k_old; base += kExchangeThreads) {
    const int32_t q = base + threadIdx.x;
    const int leaves = (q < mat.k_old && find_in_sorted(mat.new_selected, mat.k_new, mat.old_selected[q]) < 0) ? 1 : 0;
    int before, total;
    BlockScan(scan_storage).ExclusiveSum(leaves, before, total);
    if (q < mat.k_old) mat.plan_old[q] = leaves ? running + before : -1;
    running += total;
    __syncthreads();
  }
}

__device__ __forceinline__ void copy_state_column(const StatePointers& from, int64_t from_index, int64_t from_stride,
                                                  const StatePointers& to, int64_t to_index, int64_t to_stride,
                                                  int64_t rows, int warp) {
  const bool master = from.master != nullptr && to.master != nullptr;
  for (int64_t r = warp; r < rows; r += kExchangeRowWarps) {
    if (master) to.master[to_index + r * to_stride] = from.master[from_index + r * from_stride];
    to.exp_avg[to_index + r * to_stride] = from.exp_avg[from_index + r * from_stride];
    to.exp_avg_sq[to_index + r * to_stride] = from.exp_avg_sq[from_index + r * from_stride];
  }
}

// A block owns 32 positions of one matrix: new positions p (filled from the old state or the
// entering buffer) and old positions q with the same numbers (copied out when leaving).
__global__ void __launch_bounds__(kExchangeThreads) exchange_move_kernel(const ExchangeLaunchTable table) {
  const ExchangeMatrix mat = table.matrices[find_entry(table.matrices, table.count, blockIdx.x)];
  const int lane = threadIdx.x % kExchangeColumns, warp = threadIdx.x / kExchangeColumns;
  const int32_t position =
      static_cast<int32_t>((static_cast<int64_t>(blockIdx.x) - mat.first_tile) * kExchangeColumns + lane);
  if (position < mat.k_new) {
    const int32_t source = mat.plan_new[position];
    if (source >= 0) {
      copy_state_column(mat.old_state, source, mat.k_old, mat.new_state, position, mat.k_new, mat.rows, warp);
      if (warp == 0) mat.new_state.steps[position] = mat.old_state.steps[source];
    } else if (-source - 1 < mat.entering_count) {
      const int64_t e = -source - 1;
      copy_state_column(mat.entering, packed_index(0, mat.rows, e, 0), 1, mat.new_state, position, mat.k_new, mat.rows,
                        warp);
      if (warp == 0) mat.new_state.steps[position] = mat.entering.steps[e];
    }
  }
  if (position < mat.k_old) {
    const int32_t l = mat.plan_old[position];
    if (l >= 0 && l < mat.leaving_count) {
      copy_state_column(mat.old_state, position, mat.k_old, mat.leaving, packed_index(0, mat.rows, l, 0), 1, mat.rows,
                        warp);
      if (warp == 0) mat.leaving.steps[l] = mat.old_state.steps[position];
    }
  }
}

}  // namespace cuda
}  // namespace zf
