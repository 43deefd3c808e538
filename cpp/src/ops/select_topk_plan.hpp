// The host plan of zf_select_topk_columns: sizes validated once, run with fresh pointers
// (the engine builds it at registration and runs it at every selection).
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.hpp"

namespace zf {

struct TopkVector {
  int64_t n;  // scores
  int64_t k;  // indices to select, k <= n
};

class SelectTopkPlan {
 public:
  explicit SelectTopkPlan(std::vector<TopkVector> vectors) : vectors_(std::move(vectors)) {}
  // out_indices[i] <- the k_i best columns of scores[i], ascending (ties: lower index).
  // Throws INVALID_VALUE, writing nothing, when a score is NaN.
  void run(ThreadPool& pool, const float* const* scores, int32_t* const* out_indices) const;
  size_t size() const { return vectors_.size(); }

 private:
  std::vector<TopkVector> vectors_;
};

}  // namespace zf
