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

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

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

// The prefetch variant's distance (StreamPassArgs::prefetch), in elements.
constexpr int64_t kRoofPrefetchElements = 256;

// The roof pass's tail, element by element with plain stores: elements [begin, end) of every
// stream of `a` (the same sums and roundings as the vector forms).
inline void stream_pass_elements(const zf::simd::StreamPassArgs& a, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
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
}

// The streaming roof's pass (kernels.hpp, StreamPassArgs), one instantiation per stream
// count and variant: the stream loops unroll, and every stream's pointer and flags are
// locals the compiler keeps in registers. Read from `a` inside the loop, they were loaded
// again after every store (a store may alias `a`, as far as the compiler knows), and the
// pass was bound by those instructions rather than by memory: on a 2-core AMD EPYC (Zen 4)
// it streamed ~50 GB/s per core in L1, below the fp32 Adam step's 60, and read 45-48 GB/s
// on two threads past the cache where the fp32 Adam step itself streamed 53-56. A roof must
// not sit below the kernel it bounds. Vectors first; the tail (fewer than kLanes elements)
// element by element with plain stores.
template <class Isa, int kStreams, bool kNonTemporal, bool kPrefetch>
void stream_pass_fixed(const zf::simd::StreamPassArgs& a, int64_t count) {
  using F32 = typename Isa::F32;
  unsigned char* data[kStreams];
  bool narrow[kStreams], read[kStreams], write[kStreams];
  for (int s = 0; s < kStreams; ++s) {
    data[s] = static_cast<unsigned char*>(a.data[s]);
    narrow[s] = a.bytes[s] == 2;
    read[s] = a.read[s];
    write[s] = a.write[s];
  }
  const F32 scale = Isa::set1(a.scale);
  int64_t i = 0;
  for (; i + Isa::kLanes <= count; i += Isa::kLanes) {
    F32 sum = Isa::set1(0.0f);
#pragma GCC unroll 16
    for (int s = 0; s < kStreams; ++s) {
      if (!read[s]) continue;
      if (kPrefetch && i + kRoofPrefetchElements < count) {
        __builtin_prefetch(data[s] + (i + kRoofPrefetchElements) * (narrow[s] ? 2 : 4), 0, 3);
      }
      sum = Isa::add(sum, narrow[s] ? Isa::load_bf16(reinterpret_cast<const uint16_t*>(data[s]) + i)
                                    : Isa::load_f32(reinterpret_cast<const float*>(data[s]) + i));
    }
    const F32 value = Isa::mul(sum, scale);
#pragma GCC unroll 16
    for (int s = 0; s < kStreams; ++s) {
      if (!write[s]) continue;
      const bool non_temporal = kNonTemporal && !read[s];
      if (narrow[s]) {
        uint16_t* out = reinterpret_cast<uint16_t*>(data[s]) + i;
        non_temporal ? Isa::stream_bf16(out, value) : Isa::store_bf16(out, value);
      } else {
        float* out = reinterpret_cast<float*>(data[s]) + i;
        non_temporal ? Isa::stream_f32(out, value) : Isa::store_f32(out, value);
      }
    }
  }
  stream_pass_elements(a, i, count);
  if (kNonTemporal) Isa::stream_fence();
}

// Calls pass(std::bool_constant<a.stream>, std::bool_constant<a.prefetch>): a variant's two
// flags as template arguments, one instantiation each, for both forms of the roof's pass.
template <class Pass>
void with_variant_flags(const zf::simd::StreamPassArgs& a, Pass pass) {
  if (a.stream) {
    a.prefetch ? pass(std::true_type{}, std::true_type{}) : pass(std::true_type{}, std::false_type{});
  } else {
    a.prefetch ? pass(std::false_type{}, std::true_type{}) : pass(std::false_type{}, std::false_type{});
  }
}

template <class Isa, int kStreams>
void stream_pass_variant(const zf::simd::StreamPassArgs& a, int64_t count) {
  with_variant_flags(a, [&](auto non_temporal, auto prefetch) {
    stream_pass_fixed<Isa, kStreams, decltype(non_temporal)::value, decltype(prefetch)::value>(a, count);
  });
}

template <class Isa, size_t... kCounts>
void stream_pass_dispatch(const zf::simd::StreamPassArgs& a, int64_t count, std::index_sequence<kCounts...>) {
  using Pass = void (*)(const zf::simd::StreamPassArgs&, int64_t);
  static constexpr Pass passes[] = {&stream_pass_variant<Isa, static_cast<int>(kCounts) + 1>...};
  passes[a.streams - 1](a, count);
}

// The roof's pass block by block (StreamPassArgs::blocked): each read stream's block is added
// into a block of sums in L1, then each written stream's block is stored from it, every inner
// loop over one stream with its width and store kind fixed at compile time. Vector by vector
// (stream_pass_fixed) each vector visits every stream with a compare and branch on its width
// and kind: on two AVX2 cores the copy shape (one fp32 stream read, one written
// non-temporally) ran at 20-23 GB/s that way, where a plain loop and the lane's first
// accumulate ran at 29-31 (the lane's first accumulate measured 120-158% of "its roof"); block
// by block it runs at 27-30. With many streams, vector by vector is the faster (the update's
// shape 30-37 against 25-27 GB/s there): the roof takes the faster of the two.
constexpr int64_t kRoofBlockElements = 512;

template <class Isa, bool kNarrow, bool kPrefetch, bool kFirst>
void roof_read_block(const unsigned char* stream, int64_t block, float* sums, int64_t prefetch_limit) {
  for (int64_t j = 0; j < block; j += Isa::kLanes) {
    if (kPrefetch && j + kRoofPrefetchElements < prefetch_limit) {
      __builtin_prefetch(stream + (j + kRoofPrefetchElements) * (kNarrow ? 2 : 4), 0, 3);
    }
    const typename Isa::F32 x = kNarrow ? Isa::load_bf16(reinterpret_cast<const uint16_t*>(stream) + j)
                                        : Isa::load_f32(reinterpret_cast<const float*>(stream) + j);
    Isa::store_f32(sums + j, kFirst ? x : Isa::add(Isa::load_f32(sums + j), x));
  }
}

template <class Isa, bool kNarrow, bool kNonTemporal>
void roof_write_block(unsigned char* stream, int64_t block, const float* sums, typename Isa::F32 scale) {
  for (int64_t j = 0; j < block; j += Isa::kLanes) {
    const typename Isa::F32 value = Isa::mul(Isa::load_f32(sums + j), scale);
    if constexpr (kNarrow) {
      uint16_t* out = reinterpret_cast<uint16_t*>(stream) + j;
      kNonTemporal ? Isa::stream_bf16(out, value) : Isa::store_bf16(out, value);
    } else {
      float* out = reinterpret_cast<float*>(stream) + j;
      kNonTemporal ? Isa::stream_f32(out, value) : Isa::store_f32(out, value);
    }
  }
}

// Write-only streams are stored non-temporally when kNonTemporal (their data aligned to 64
// bytes, every block's start too); read streams prefetched kRoofPrefetchElements ahead when
// kPrefetch. Whole vectors in blocks; the tail (fewer than kLanes elements) through
// stream_pass_elements.
template <class Isa, bool kNonTemporal, bool kPrefetch>
void stream_pass_blocked(const zf::simd::StreamPassArgs& a, int64_t count) {
  const int streams = a.streams;
  unsigned char* data[zf::simd::kMaxStreamPassStreams];
  for (int s = 0; s < streams; ++s) data[s] = static_cast<unsigned char*>(a.data[s]);
  const typename Isa::F32 scale = Isa::set1(a.scale);
  alignas(64) float sums[kRoofBlockElements];
  const int64_t vectors_end = count / Isa::kLanes * Isa::kLanes;
  for (int64_t i = 0; i < vectors_end; i += kRoofBlockElements) {
    const int64_t block = std::min(kRoofBlockElements, vectors_end - i);
    bool first = true;
    for (int s = 0; s < streams; ++s) {
      if (!a.read[s]) continue;
      const unsigned char* stream = data[s] + i * a.bytes[s];
      const int64_t prefetch_limit = count - i;
      if (a.bytes[s] == 2) {
        first ? roof_read_block<Isa, true, kPrefetch, true>(stream, block, sums, prefetch_limit)
              : roof_read_block<Isa, true, kPrefetch, false>(stream, block, sums, prefetch_limit);
      } else {
        first ? roof_read_block<Isa, false, kPrefetch, true>(stream, block, sums, prefetch_limit)
              : roof_read_block<Isa, false, kPrefetch, false>(stream, block, sums, prefetch_limit);
      }
      first = false;
    }
    if (first) std::fill(sums, sums + block, 0.0f);
    for (int s = 0; s < streams; ++s) {
      if (!a.write[s]) continue;
      unsigned char* stream = data[s] + i * a.bytes[s];
      const bool non_temporal = kNonTemporal && !a.read[s];
      if (a.bytes[s] == 2) {
        non_temporal ? roof_write_block<Isa, true, true>(stream, block, sums, scale)
                     : roof_write_block<Isa, true, false>(stream, block, sums, scale);
      } else {
        non_temporal ? roof_write_block<Isa, false, true>(stream, block, sums, scale)
                     : roof_write_block<Isa, false, false>(stream, block, sums, scale);
      }
    }
  }
  stream_pass_elements(a, vectors_end, count);
  if (kNonTemporal) Isa::stream_fence();
}

// a.streams in [1, kMaxStreamPassStreams] (zf_host_stream_bandwidth checks it).
template <class Isa>
void stream_pass(const zf::simd::StreamPassArgs& a, int64_t count) {
  if (a.blocked) {
    return with_variant_flags(a, [&](auto non_temporal, auto prefetch) {
      stream_pass_blocked<Isa, decltype(non_temporal)::value, decltype(prefetch)::value>(a, count);
    });
  }
  stream_pass_dispatch<Isa>(a, count, std::make_index_sequence<zf::simd::kMaxStreamPassStreams>{});
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
