// The host plan of zf_column_stats: shapes and dtypes validated once, then run any number
// of times with fresh pointers (the engine builds it at registration).
#pragma once

#include <cstdint>
#include <vector>

#include "common/thread_pool.hpp"
#include "zenflow/zenflow.h"

namespace zf {

struct ColumnStatsMatrix {
  int64_t rows;
  int64_t cols;
  zf_dtype dtype;  // f32, f16 or bf16
};

class ColumnStatsPlan {
 public:
  explicit ColumnStatsPlan(std::vector<ColumnStatsMatrix> matrices);

  // col_sq[i][j] = sum_r grads[i][r, j]^2 (added to col_sq when accumulate); *total_sq the
  // sum of everything, *nonfinite 1 if any element is Inf or NaN. Bitwise identical for
  // every pool size (a column is always summed in row order; the total in a fixed order).
  void run(ThreadPool& pool, const void* const* grads, float* const* col_sq, float* total_sq, int32_t* nonfinite,
           bool accumulate);

  size_t size() const { return matrices_.size(); }

 private:
  struct Piece {
    size_t matrix;
    int64_t col_begin, col_end;
    int64_t work;  // elements read
    int owner;     // thread that sums it
  };
  void split_for(int threads);

  std::vector<ColumnStatsMatrix> matrices_;
  std::vector<size_t> sum_offsets_;  // matrix i's sums start at sum_offsets_[i]
  std::vector<double> sums_;
  std::vector<Piece> pieces_;
  int pieces_threads_ = 0;  // pool size the pieces were split for
};

}  // namespace zf
