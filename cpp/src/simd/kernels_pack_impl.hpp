// The transposing copies of pack and scatter (KernelTable::pack_block / scatter_block),
// written once over a small 8x8 tile interface and compiled once per ISA level through
// kernels_impl.hpp. Everything sits in an anonymous namespace: the copies built with
// different flags never meet at link time.
//
// Why tiles. A pack reads the matrix row by row and writes packed columns, whose consecutive
// elements are `rows` values apart. Element by element, every row touches one cache line of
// every packed column of the block, and those lines (a power-of-two stride apart for the usual
// shapes) fall into a few cache sets and evict each other long before they are full. Here 8
// rows x 8 columns are loaded as 8 vectors, transposed in registers, and stored as 8 packed
// column pieces of 8 values; two such tiles stacked (16 rows) fill a whole 64-byte line of
// each fp32 packed column at once. A scatter is the same walk backwards.
//
// A Tile provides, on V (8 fp32 lanes):
//   load<dtype>(base, i)        elements i..i+7 of an f32, bf16 or f16 array widened to fp32
//   gather<dtype>(row, columns) elements columns[0..7] of `row`, widened
//   store<dtype>(base, i, v)    the same 8 elements written, rounding to nearest even
//                               exactly as zf::store_from_float does
//   set1(float), mul(V, V)      broadcast; lane-wise product, one rounding
//   transpose(V (&rows)[8])     rows[i] lane j <-> rows[j] lane i
// Columns that are not consecutive in the matrix (a selected column between them) are
// gathered, or scattered, lane by lane; every element still sees the same operations, so
// results are bitwise identical to the element-wise definition at every level and for every
// block split.
#pragma once

#include <cstdint>

#include "common/float_convert.hpp"
#include "simd/kernels.hpp"
#include "zenflow/zenflow.h"

namespace {

template <int kDtype>
struct PackStorage {
  using Type = uint16_t;
};
template <>
struct PackStorage<ZF_DTYPE_F32> {
  using Type = float;
};

template <int kDtype>
inline float pack_load_scalar(typename PackStorage<kDtype>::Type x) {
  if constexpr (kDtype == ZF_DTYPE_F32) {
    return x;
  } else if constexpr (kDtype == ZF_DTYPE_BF16) {
    return zf::bf16_to_f32(x);
  } else {
    return zf::f16_to_f32(x);
  }
}

template <int kDtype>
inline typename PackStorage<kDtype>::Type pack_store_scalar(float x) {
  if constexpr (kDtype == ZF_DTYPE_F32) {
    return x;
  } else if constexpr (kDtype == ZF_DTYPE_BF16) {
    return zf::f32_to_bf16(x);
  } else {
    return zf::f32_to_f16(x);
  }
}

// The portable tile: plain arrays the compiler may vectorise at its baseline.
struct PortablePackTile {
  struct V {
    float lane[8];
  };
  template <int kDtype>
  static V load(const void* base, int64_t i) {
    const auto* p = static_cast<const typename PackStorage<kDtype>::Type*>(base) + i;
    V v;
    for (int l = 0; l < 8; ++l) v.lane[l] = pack_load_scalar<kDtype>(p[l]);
    return v;
  }
  template <int kDtype>
  static void store(void* base, int64_t i, const V& v) {
    auto* p = static_cast<typename PackStorage<kDtype>::Type*>(base) + i;
    for (int l = 0; l < 8; ++l) p[l] = pack_store_scalar<kDtype>(v.lane[l]);
  }
  // Elements columns[0..7] of `row` (any columns), widened.
  template <int kDtype>
  static V gather(const void* row, const int64_t* columns) {
    const auto* p = static_cast<const typename PackStorage<kDtype>::Type*>(row);
    V v;
    for (int l = 0; l < 8; ++l) v.lane[l] = pack_load_scalar<kDtype>(p[columns[l]]);
    return v;
  }
  static V set1(float x) {
    V v;
    for (float& lane : v.lane) lane = x;
    return v;
  }
  static V mul(const V& a, const V& b) {
    V v;
    for (int l = 0; l < 8; ++l) v.lane[l] = a.lane[l] * b.lane[l];
    return v;
  }
  static void transpose(V (&rows)[8]) {
    for (int i = 0; i < 8; ++i) {
      for (int j = i + 1; j < 8; ++j) {
        const float x = rows[i].lane[j];
        rows[i].lane[j] = rows[j].lane[i];
        rows[j].lane[i] = x;
      }
    }
  }
};

constexpr int64_t kPackTile = 8;

// Columns [j0, j0 + 8) are a run of consecutive matrix columns: whole vectors can be used.
inline bool consecutive_columns(const int64_t* columns, int64_t j0) {
  return columns[j0 + kPackTile - 1] - columns[j0] == kPackTile - 1;
}

// Walks the block in 16-row bands (two 8-row tiles per 8 columns, so each packed column gets
// 16 consecutive values at once), then one 8-row band, then the rows and columns no whole
// tile covers, element by element. `tile(r0, j0)` moves one 8x8 tile; `element(r, j)` one
// value.
template <class TileFn, class ElementFn>
inline void walk_block(int64_t rows, int64_t width, TileFn tile, ElementFn element) {
  const int64_t tiled_width = width / kPackTile * kPackTile;
  int64_t r0 = 0;
  for (; r0 + 2 * kPackTile <= rows; r0 += 2 * kPackTile) {
    for (int64_t j0 = 0; j0 < tiled_width; j0 += kPackTile) {
      tile(r0, j0);
      tile(r0 + kPackTile, j0);
    }
  }
  if (r0 + kPackTile <= rows) {
    for (int64_t j0 = 0; j0 < tiled_width; j0 += kPackTile) tile(r0, j0);
    r0 += kPackTile;
  }
  if (tiled_width < width) {
    for (int64_t r = 0; r < r0; ++r) {
      for (int64_t j = tiled_width; j < width; ++j) element(r, j);
    }
  }
  for (int64_t r = r0; r < rows; ++r) {
    for (int64_t j = 0; j < width; ++j) element(r, j);
  }
}

template <class Tile, int kMatrix, int kPacked>
void pack_block_typed(const zf::simd::PackBlockArgs& a) {
  using MatrixStorage = typename PackStorage<kMatrix>::Type;
  using PackedStorage = typename PackStorage<kPacked>::Type;
  using V = typename Tile::V;
  const auto* matrix = static_cast<const MatrixStorage*>(a.matrix);
  auto* packed = static_cast<PackedStorage*>(a.packed);
  const int64_t rows = a.rows, stride = a.row_stride;
  const int64_t* columns = a.columns;
  const float scale = a.scale;
  const V scale_v = Tile::set1(scale);
  const auto tile = [&](int64_t r0, int64_t j0) {
    V v[kPackTile];
    const bool run = consecutive_columns(columns, j0);
    const int64_t c0 = columns[j0];
    for (int64_t q = 0; q < kPackTile; ++q) {
      const MatrixStorage* row = matrix + (r0 + q) * stride;
      if (run) {
        v[q] = Tile::template load<kMatrix>(row, c0);
      } else {
        v[q] = Tile::template gather<kMatrix>(row, columns + j0);
      }
      v[q] = Tile::mul(v[q], scale_v);
    }
    Tile::transpose(v);
    for (int64_t l = 0; l < kPackTile; ++l) Tile::template store<kPacked>(packed, (j0 + l) * rows + r0, v[l]);
  };
  const auto element = [&](int64_t r, int64_t j) {
    packed[j * rows + r] =
        pack_store_scalar<kPacked>(pack_load_scalar<kMatrix>(matrix[r * stride + columns[j]]) * scale);
  };
  walk_block(rows, a.width, tile, element);
}

template <class Tile, int kMatrix, int kPacked>
void scatter_block_typed(const zf::simd::PackBlockArgs& a) {
  using MatrixStorage = typename PackStorage<kMatrix>::Type;
  using PackedStorage = typename PackStorage<kPacked>::Type;
  using V = typename Tile::V;
  auto* matrix = static_cast<MatrixStorage*>(a.matrix);
  const auto* packed = static_cast<const PackedStorage*>(a.packed);
  const int64_t rows = a.rows, stride = a.row_stride;
  const int64_t* columns = a.columns;
  const auto tile = [&](int64_t r0, int64_t j0) {
    V v[kPackTile];
    for (int64_t l = 0; l < kPackTile; ++l) v[l] = Tile::template load<kPacked>(packed, (j0 + l) * rows + r0);
    Tile::transpose(v);
    const bool run = consecutive_columns(columns, j0);
    const int64_t c0 = columns[j0];
    for (int64_t q = 0; q < kPackTile; ++q) {
      MatrixStorage* row = matrix + (r0 + q) * stride;
      if (run) {
        Tile::template store<kMatrix>(row, c0, v[q]);
      } else {
        MatrixStorage scattered[kPackTile];
        Tile::template store<kMatrix>(scattered, 0, v[q]);
        for (int64_t l = 0; l < kPackTile; ++l) row[columns[j0 + l]] = scattered[l];
      }
    }
  };
  const auto element = [&](int64_t r, int64_t j) {
    matrix[r * stride + columns[j]] = pack_store_scalar<kMatrix>(pack_load_scalar<kPacked>(packed[j * rows + r]));
  };
  walk_block(rows, a.width, tile, element);
}

// Dispatch on the two dtypes (validated by the op layer: f32, bf16 or f16).
template <class Tile, bool kToPacked, int kMatrix>
void pack_or_scatter_for_packed(const zf::simd::PackBlockArgs& a) {
  switch (a.packed_dtype) {
    case ZF_DTYPE_BF16:
      return kToPacked ? pack_block_typed<Tile, kMatrix, ZF_DTYPE_BF16>(a)
                       : scatter_block_typed<Tile, kMatrix, ZF_DTYPE_BF16>(a);
    case ZF_DTYPE_F16:
      return kToPacked ? pack_block_typed<Tile, kMatrix, ZF_DTYPE_F16>(a)
                       : scatter_block_typed<Tile, kMatrix, ZF_DTYPE_F16>(a);
    default:
      return kToPacked ? pack_block_typed<Tile, kMatrix, ZF_DTYPE_F32>(a)
                       : scatter_block_typed<Tile, kMatrix, ZF_DTYPE_F32>(a);
  }
}

template <class Tile, bool kToPacked>
void pack_or_scatter_block(const zf::simd::PackBlockArgs& a) {
  switch (a.matrix_dtype) {
    case ZF_DTYPE_BF16:
      return pack_or_scatter_for_packed<Tile, kToPacked, ZF_DTYPE_BF16>(a);
    case ZF_DTYPE_F16:
      return pack_or_scatter_for_packed<Tile, kToPacked, ZF_DTYPE_F16>(a);
    default:
      return pack_or_scatter_for_packed<Tile, kToPacked, ZF_DTYPE_F32>(a);
  }
}

template <class Tile>
void pack_block(const zf::simd::PackBlockArgs& a) {
  pack_or_scatter_block<Tile, true>(a);
}

template <class Tile>
void scatter_block(const zf::simd::PackBlockArgs& a) {
  pack_or_scatter_block<Tile, false>(a);
}

}  // namespace
