// Shared helpers for the C++ tests: inputs in every dtype, and descriptor builders.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "common/float_convert.hpp"
#include "common/thread_pool.hpp"
#include "zenflow/zenflow.hpp"

namespace zf_test {

// Storage for a row-major matrix in one dtype plus the exact values it holds (as double).
struct HostMatrix {
  zf_dtype dtype;
  int64_t rows, cols;
  std::vector<float> f32;
  std::vector<uint16_t> half;  // bf16 or f16 bits
  std::vector<double> values;  // what the stored elements are, exactly

  void* data() { return dtype == ZF_DTYPE_F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(half.data()); }
  zf_tensor tensor() { return zenflow::contiguous_tensor(data(), dtype, {rows, cols}); }

  void set(int64_t i, float value) {
    if (dtype == ZF_DTYPE_F32) {
      f32[i] = value;
      values[i] = value;
    } else if (dtype == ZF_DTYPE_BF16) {
      half[i] = zf::f32_to_bf16(value);
      values[i] = zf::bf16_to_f32(half[i]);
    } else {
      half[i] = zf::f32_to_f16(value);
      values[i] = zf::f16_to_f32(half[i]);
    }
  }
};

inline HostMatrix random_matrix(zf_dtype dtype, int64_t rows, int64_t cols, std::mt19937_64& rng, double scale = 1.0) {
  HostMatrix m{dtype, rows, cols, {}, {}, {}};
  const size_t n = static_cast<size_t>(rows * cols);
  if (dtype == ZF_DTYPE_F32) {
    m.f32.resize(n);
  } else {
    m.half.resize(n);
  }
  m.values.resize(n);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(scale));
  for (size_t i = 0; i < n; ++i) m.set(static_cast<int64_t>(i), normal(rng));
  return m;
}

// k distinct columns of [0, n), sorted ascending (a selection as select_topk returns it).
inline std::vector<int32_t> random_selection(int64_t n, int64_t k, std::mt19937_64& rng) {
  std::vector<int32_t> all(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) all[static_cast<size_t>(j)] = static_cast<int32_t>(j);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(k));
  std::sort(all.begin(), all.end());
  return all;
}

// Runs empty regions on the global pool from a second thread for as long as `change` runs on
// this one (a resize, a runtime swap): the regions must neither fail nor hang. Returns how
// many ran.
inline int regions_run_during(const std::function<void()>& change) {
  std::atomic<bool> stop{false};
  std::atomic<int> runs{0};
  std::thread worker([&] {
    while (!stop.load()) {
      zf::global_thread_pool()->run([](int, int) {});
      runs++;
    }
  });
  change();
  stop = true;
  worker.join();
  return runs.load();
}

}  // namespace zf_test
