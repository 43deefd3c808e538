// zf_host_stream_bandwidth (types.h): the host's streaming roof for a pass of a given shape.
// The pass itself is the active SIMD level's stream_pass kernel (simd/kernels_impl.hpp).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "common/error.hpp"
#include "common/float_convert.hpp"
#include "common/host_memory.hpp"
#include "common/thread_pool.hpp"
#include "simd/kernels.hpp"
#include "zenflow/types.h"

namespace zf {
namespace {

// The roof streams the memory the host lane streams (host_memory.hpp: cache-line aligned,
// on huge pages where the system allows).
struct StreamedFree {
  size_t bytes = 0;
  void operator()(unsigned char* p) const { free_streamed(p, bytes); }
};
using StreamBuffer = std::unique_ptr<unsigned char[], StreamedFree>;

StreamBuffer allocate(size_t bytes) {
  unsigned char* p = nullptr;
  try {
    p = static_cast<unsigned char*>(allocate_streamed(bytes));
  } catch (const std::bad_alloc&) {
  }
  require(p != nullptr, ZF_ERROR_OUT_OF_MEMORY, "zf_host_stream_bandwidth: cannot allocate ", bytes,
          " bytes for a stream");
  return StreamBuffer(p, StreamedFree{bytes});
}

// Thread t's elements: whole blocks of 1024 (split_range over the blocks), so that every
// thread's start keeps the streams' 64-byte alignment (the non-temporal stores need it).
void thread_range(int64_t elements, int t, int threads, int64_t* begin, int64_t* end) {
  constexpr int64_t kBlock = 1024;
  int64_t first = 0, last = 0;
  split_range(0, (elements + kBlock - 1) / kBlock, t, threads, &first, &last);
  *begin = std::min(elements, first * kBlock);
  *end = std::min(elements, last * kBlock);
}

double measure(const zf_stream_spec* streams, size_t count, int64_t elements, int threads, int repetitions) {
  require(streams != nullptr, ZF_ERROR_INVALID_VALUE, "streams: NULL");
  require(count >= 1 && count <= static_cast<size_t>(simd::kMaxStreamPassStreams), ZF_ERROR_INVALID_VALUE,
          "count: must be in [1, ", simd::kMaxStreamPassStreams, "], got ", count);
  require(elements >= 1 && elements <= (int64_t{1} << 40), ZF_ERROR_INVALID_VALUE,
          "elements: must be in [1, 2^40], got ", elements);
  const int most_threads = max_thread_count();
  require(threads >= 1 && threads <= most_threads, ZF_ERROR_INVALID_VALUE, "threads: must be in [1, ", most_threads,
          "], got ", threads);
  require(repetitions >= 1 && repetitions <= 1000, ZF_ERROR_INVALID_VALUE, "repetitions: must be in [1, 1000], got ",
          repetitions);
  simd::StreamPassArgs args{};
  args.streams = static_cast<int>(count);
  int reads = 0;
  bool any_write = false, any_write_only = false;
  double pass_bytes = 0.0;
  for (size_t s = 0; s < count; ++s) {
    // The fields' bytes as integers: a C caller may hold any value in an enum field, and
    // reading it as the C++ enum type would not be defined.
    int32_t dtype = 0, access = 0;
    static_assert(sizeof(streams[s].dtype) == sizeof(dtype) && sizeof(streams[s].access) == sizeof(access));
    std::memcpy(&dtype, &streams[s].dtype, sizeof(dtype));
    std::memcpy(&access, &streams[s].access, sizeof(access));
    require(dtype == ZF_DTYPE_F32 || dtype == ZF_DTYPE_BF16 || dtype == ZF_DTYPE_F16, ZF_ERROR_INVALID_VALUE,
            "streams[", s, "].dtype: must be F32, BF16 or F16, got ", dtype);
    require(access >= ZF_STREAM_READ && access <= ZF_STREAM_READ_WRITE, ZF_ERROR_INVALID_VALUE, "streams[", s,
            "].access: must be ZF_STREAM_READ, ZF_STREAM_WRITE or ZF_STREAM_READ_WRITE, got ", access);
    args.bytes[s] = static_cast<int>(zf_dtype_size(static_cast<zf_dtype>(dtype)));
    args.read[s] = access != ZF_STREAM_WRITE;
    args.write[s] = access != ZF_STREAM_READ;
    reads += args.read[s] ? 1 : 0;
    any_write = any_write || args.write[s];
    any_write_only = any_write_only || access == ZF_STREAM_WRITE;
    pass_bytes += static_cast<double>(elements) * args.bytes[s] * (access == ZF_STREAM_READ_WRITE ? 2 : 1);
  }
  require(reads > 0 && any_write, ZF_ERROR_INVALID_VALUE,
          "streams: a pass needs at least one stream read and one written");
  std::vector<StreamBuffer> buffers;
  for (size_t s = 0; s < count; ++s) {
    buffers.push_back(allocate(static_cast<size_t>(elements) * static_cast<size_t>(args.bytes[s])));
    args.data[s] = buffers.back().get();
  }
  // A sum that stays 1: every pass reads ones and writes ones (no growth, no subnormals).
  args.scale = 1.0f / static_cast<float>(reads);
  ThreadPool pool(threads);
  const simd::KernelTable& kernels = simd::active_kernels();
  auto pass = [&](const simd::StreamPassArgs& a) {
    pool.run([&](int t, int n) {
      int64_t begin = 0, end = 0;
      thread_range(elements, t, n, &begin, &end);
      if (begin >= end) return;
      simd::StreamPassArgs mine = a;
      for (int s = 0; s < a.streams; ++s) mine.data[s] = static_cast<unsigned char*>(a.data[s]) + begin * a.bytes[s];
      kernels.stream_pass(mine, end - begin);
    });
  };
  // First touch by the threads that run the passes (their pages land on their nodes).
  pool.run([&](int t, int n) {
    int64_t begin = 0, end = 0;
    thread_range(elements, t, n, &begin, &end);
    for (size_t s = 0; s < count; ++s) {
      for (int64_t i = begin; i < end; ++i) {
        if (args.bytes[s] == 2) {
          reinterpret_cast<uint16_t*>(args.data[s])[i] = f32_to_bf16(1.0f);
        } else {
          reinterpret_cast<float*>(args.data[s])[i] = 1.0f;
        }
      }
    }
  });
  // The variants (simd/kernels.hpp, StreamPassArgs): vector by vector or block by block, with
  // write-only streams stored plainly or non-temporally, the read streams prefetched or not.
  // The roof is the fastest: which form streams best depends on the shape and the machine
  // (simd/kernels_impl.hpp, stream_pass_blocked). Without a write-only stream the
  // non-temporal variants are the plain ones and are not run again.
  double best = 0.0;
  for (const bool blocked : {false, true}) {
    for (const bool non_temporal : {false, true}) {
      if (non_temporal && !any_write_only) continue;
      for (const bool prefetch : {false, true}) {
        simd::StreamPassArgs variant = args;
        variant.blocked = blocked;
        variant.stream = non_temporal;
        variant.prefetch = prefetch;
        pass(variant);  // untimed: the variant's first pass
        for (int r = 0; r < repetitions; ++r) {
          const auto start = std::chrono::steady_clock::now();
          pass(variant);
          const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (seconds > 0.0) best = std::max(best, pass_bytes / seconds);
        }
      }
    }
  }
  return best;
}

}  // namespace
}  // namespace zf

ZF_API zf_status zf_host_stream_bandwidth(const zf_stream_spec* streams, size_t count, int64_t elements, int threads,
                                          int repetitions, double* bytes_per_second) {
  return zf::api_call([&] {
    zf::require(bytes_per_second != nullptr, ZF_ERROR_INVALID_VALUE, "bytes_per_second: NULL");
    *bytes_per_second = zf::measure(streams, count, elements, threads, repetitions);
  });
}
