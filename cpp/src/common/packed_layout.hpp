// The packed layout of unselected columns, owned by one type: every producer and consumer
// of a packed buffer (host and CUDA pack/scatter, accumulate, the host step, the Python
// packed_offsets, validation) derives offsets here and nowhere else.
//
// Matrix i, viewed as [rows_i, cols_i] with k_i selected columns, holds its u_i = cols_i - k_i
// unselected columns in ascending column order, each as rows_i contiguous values
// (column-major), from offset_i = sum_{j<i} rows_j * u_j, with no padding:
//
//   packed[offset_i + j * rows_i + r] = G_i[r, j-th unselected column]
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/column_index.hpp"

namespace zf {

struct PackedMatrix {
  int64_t rows;
  int64_t cols;
  int64_t selected;  // k: columns not in the packed buffer
  int64_t offset;    // first element of this matrix in the buffer

  int64_t unselected() const { return cols - selected; }
  int64_t elements() const { return rows * (cols - selected); }
};

class PackedLayout {
 public:
  PackedLayout() = default;
  // Appends a matrix. Throws zf::Error (INVALID_VALUE, naming `name`) on a negative size,
  // k > cols, or a total beyond PTRDIFF_MAX bytes of fp32.
  void add(int64_t rows, int64_t cols, int64_t selected, const char* name = "matrix");
  void clear() {
    matrices_.clear();
    total_ = 0;
  }
  void reserve(size_t count) { matrices_.reserve(count); }

  size_t size() const { return matrices_.size(); }
  const PackedMatrix& operator[](size_t i) const { return matrices_[i]; }
  const std::vector<PackedMatrix>& matrices() const { return matrices_; }
  // Elements in the whole buffer.
  int64_t total() const { return total_; }
  // Index of element (r, j) of matrix i: j-th unselected column, row r.
  int64_t index(size_t i, int64_t j, int64_t r) const {
    const PackedMatrix& m = matrices_[i];
    return packed_index(m.offset, m.rows, j, r);
  }

 private:
  std::vector<PackedMatrix> matrices_;
  int64_t total_ = 0;
};

}  // namespace zf
