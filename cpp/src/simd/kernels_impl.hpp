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
//   add_square(F64x, F32)        acc + widen(x) * widen(x), exact product, one rounding
#pragma once

#include <cstdint>

#include "common/float_convert.hpp"
#include "simd/kernels.hpp"

namespace {

template <class Isa, class Storage, class VectorLoad, class ScalarLoad>
void column_sq_accumulate(const Storage* x, int64_t rows, int64_t cols, int64_t row_stride, double* acc,
                          VectorLoad vector_load, ScalarLoad scalar_load) {
  constexpr int64_t kRowsPerPass = 4;  // keeps acc in registers across four rows
  int64_t r = 0;
  for (; r + kRowsPerPass <= rows; r += kRowsPerPass) {
    const Storage* row0 = x + r * row_stride;
    const Storage* row1 = row0 + row_stride;
    const Storage* row2 = row1 + row_stride;
    const Storage* row3 = row2 + row_stride;
    int64_t j = 0;
    for (; j + Isa::kLanes <= cols; j += Isa::kLanes) {
      auto sum = Isa::load_f64x(acc + j);
      sum = Isa::add_square(sum, vector_load(row0 + j));
      sum = Isa::add_square(sum, vector_load(row1 + j));
      sum = Isa::add_square(sum, vector_load(row2 + j));
      sum = Isa::add_square(sum, vector_load(row3 + j));
      Isa::store_f64x(acc + j, sum);
    }
    for (; j < cols; ++j) {
      const Storage* const four_rows[kRowsPerPass] = {row0, row1, row2, row3};
      double sum = acc[j];
      for (int64_t q = 0; q < kRowsPerPass; ++q) {
        const double value = scalar_load(four_rows[q] + j);
        sum += value * value;
      }
      acc[j] = sum;
    }
  }
  for (; r < rows; ++r) {
    const Storage* row = x + r * row_stride;
    int64_t j = 0;
    for (; j + Isa::kLanes <= cols; j += Isa::kLanes) {
      Isa::store_f64x(acc + j, Isa::add_square(Isa::load_f64x(acc + j), vector_load(row + j)));
    }
    for (; j < cols; ++j) {
      const double value = scalar_load(row + j);
      acc[j] += value * value;
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

template <class Isa>
zf::simd::KernelTable make_kernel_table(zf_simd_level level) {
  zf::simd::KernelTable table{};
  table.level = level;
  table.column_sq_accumulate_f32 = &column_sq_accumulate_f32<Isa>;
  table.column_sq_accumulate_bf16 = &column_sq_accumulate_bf16<Isa>;
  table.column_sq_accumulate_f16 = &column_sq_accumulate_f16<Isa>;
  return table;
}

}  // namespace
