// The host kernels, written once over a small vector interface `Isa` and compiled once per
// ISA level. Each kernels_<level>.cpp defines its Isa type and includes this file; every
// name here sits in an anonymous namespace so the copies built with different flags never
// meet at link time.
//
// An Isa provides:
//   kLanes                       fp32 lanes per vector
//   F32, F64x                    a vector of kLanes floats / kLanes doubles
//   load_f32/load_bf16/load_f16  kLanes elements (unaligned) widened to F32
//   load_f64x/store_f64x         kLanes doubles
//   mul/add(F32, F32)            lane-wise fp32 product / sum, each rounded once (no FMA)
//   add_widened(F64x, F32)       acc + widen(x) in fp64
#pragma once

#include <cstdint>

#include "common/float_convert.hpp"
#include "simd/kernels.hpp"
#include "simd/kernels_adam_impl.hpp"
#include "simd/kernels_pack_impl.hpp"

namespace {

// Rows are taken in blocks of up to kColumnSqBlockRows: squares are summed in fp32 within a
// block (in row order, no FMA, so every level rounds identically), and each block sum is
// added to the fp64 accumulator. With at most 8 positive terms per fp32 sum, a column's
// relative error stays below 8 * 2^-24 (5e-7), while the fp32 inner loop halves the
// instruction count of widening every square to fp64.
constexpr int64_t kColumnSqBlockRows = 8;

// Sum of squares of kLanes columns over `block_rows` rows, in row order. Inlined with a
// constant block_rows on the hot path, so the loop unrolls fully there.
template <class Isa, class Storage, class VectorLoad>
inline auto column_block_square_sum(const Storage* column, int64_t block_rows, int64_t row_stride,
                                    VectorLoad vector_load) {
  auto value = vector_load(column);
  auto sum = Isa::mul(value, value);
  for (int64_t q = 1; q < block_rows; ++q) {
    value = vector_load(column + q * row_stride);
    sum = Isa::add(sum, Isa::mul(value, value));
  }
  return sum;
}

template <class Isa, class Storage, class VectorLoad, class ScalarLoad>
void column_sq_accumulate(const Storage* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc,
                          VectorLoad vector_load, ScalarLoad scalar_load) {
  for (int64_t r = 0; r < rows; r += kColumnSqBlockRows) {
    const Storage* block = x + r * row_stride;
    const int64_t block_rows = rows - r < kColumnSqBlockRows ? rows - r : kColumnSqBlockRows;
    int64_t j = 0;
    if (block_rows == kColumnSqBlockRows) {
      for (; j + Isa::kLanes <= cols; j += Isa::kLanes) {
        const auto sum = column_block_square_sum<Isa>(block + j, kColumnSqBlockRows, row_stride, vector_load);
        Isa::store_f64x(acc + j, Isa::add_widened(Isa::load_f64x(acc + j), sum));
      }
    } else {
      for (; j + Isa::kLanes <= cols; j += Isa::kLanes) {
        const auto sum = column_block_square_sum<Isa>(block + j, block_rows, row_stride, vector_load);
        Isa::store_f64x(acc + j, Isa::add_widened(Isa::load_f64x(acc + j), sum));
      }
    }
    for (; j < cols; ++j) {
      float value = scalar_load(block + j);
      float sum = value * value;
      for (int64_t q = 1; q < block_rows; ++q) {
        value = scalar_load(block + q * row_stride + j);
        sum = sum + value * value;
      }
      acc[j] += static_cast<double>(sum);
    }
  }
}

template <class Isa>
void column_sq_accumulate_f32(const float* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc) {
  column_sq_accumulate<Isa>(
      x, rows, cols, row_stride, acc, [](const float* p) { return Isa::load_f32(p); },
      [](const float* p) { return *p; });
}

template <class Isa>
void column_sq_accumulate_bf16(const uint16_t* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc) {
  column_sq_accumulate<Isa>(
      x, rows, cols, row_stride, acc, [](const uint16_t* p) { return Isa::load_bf16(p); },
      [](const uint16_t* p) { return zf::bf16_to_f32(*p); });
}

template <class Isa>
void column_sq_accumulate_f16(const uint16_t* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc) {
  column_sq_accumulate<Isa>(
      x, rows, cols, row_stride, acc, [](const uint16_t* p) { return Isa::load_f16(p); },
      [](const uint16_t* p) { return zf::f16_to_f32(*p); });
}

// The streaming roof's pass (kernels.hpp, StreamPassArgs). Vectors first; the tail (fewer
// than kLanes elements) element by element with plain stores.
template <class Isa>
void stream_pass(const zf::simd::StreamPassArgs& a, int64_t count) {
  using F32 = typename Isa::F32;
  const F32 scale = Isa::set1(a.scale);
  int64_t i = 0;
  for (; i + Isa::kLanes <= count; i += Isa::kLanes) {
    F32 sum = Isa::set1(0.0f);
    for (int s = 0; s < a.streams; ++s) {
      if (!a.read[s]) continue;
      if (a.prefetch && i + kPrefetchElements < count) {
        __builtin_prefetch(static_cast<const unsigned char*>(a.data[s]) + (i + kPrefetchElements) * a.bytes[s], 0, 3);
      }
      sum = Isa::add(sum, a.bytes[s] == 2 ? Isa::load_bf16(static_cast<const uint16_t*>(a.data[s]) + i)
                                          : Isa::load_f32(static_cast<const float*>(a.data[s]) + i));
    }
    const F32 value = Isa::mul(sum, scale);
    for (int s = 0; s < a.streams; ++s) {
      if (!a.write[s]) continue;
      const bool non_temporal = a.stream && !a.read[s];
      if (a.bytes[s] == 2) {
        uint16_t* out = static_cast<uint16_t*>(a.data[s]) + i;
        non_temporal ? Isa::stream_bf16(out, value) : Isa::store_bf16(out, value);
      } else {
        float* out = static_cast<float*>(a.data[s]) + i;
        non_temporal ? Isa::stream_f32(out, value) : Isa::store_f32(out, value);
      }
    }
  }
  for (; i < count; ++i) {
    float sum = 0.0f;
    for (int s = 0; s < a.streams; ++s) {
      if (!a.read[s]) continue;
      sum += a.bytes[s] == 2 ? zf::bf16_to_f32(static_cast<const uint16_t*>(a.data[s])[i])
                             : static_cast<const float*>(a.data[s])[i];
    }
    for (int s = 0; s < a.streams; ++s) {
      if (!a.write[s]) continue;
      if (a.bytes[s] == 2) {
        static_cast<uint16_t*>(a.data[s])[i] = zf::f32_to_bf16(sum * a.scale);
      } else {
        static_cast<float*>(a.data[s])[i] = sum * a.scale;
      }
    }
  }
  if (a.stream) Isa::stream_fence();
}

// PackTile: the 8x8 tile of the pack and scatter kernels (kernels_pack_impl.hpp).
template <class Isa, class PackTile>
zf::simd::KernelTable make_kernel_table(zf_simd_level level) {
  zf::simd::KernelTable table{};
  table.level = level;
  table.column_sq_accumulate_f32 = &column_sq_accumulate_f32<Isa>;
  table.column_sq_accumulate_bf16 = &column_sq_accumulate_bf16<Isa>;
  table.column_sq_accumulate_f16 = &column_sq_accumulate_f16<Isa>;
  table.adam_step = &adam_step<Isa>;
  table.accumulate = &accumulate<Isa>;
  table.pack_block = &pack_block<PackTile>;
  table.scatter_block = &scatter_block<PackTile>;
  table.stream_pass = &stream_pass<Isa>;
  return table;
}

}  // namespace
