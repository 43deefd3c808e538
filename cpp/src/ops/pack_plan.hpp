// The host plan of zf_pack_columns / zf_scatter_columns: the packed layout and the work
// split, derived once per selection (the engine builds it then), run every step with fresh
// pointers.
#pragma once

#include <cstdint>
#include <vector>

#include "common/packed_layout.hpp"
#include "common/thread_pool.hpp"
#include "zenflow/zenflow.h"

namespace zf {

class PackPlan {
 public:
  // layout: the matrices' [rows, cols] views and selected counts; dtypes[i] the dtype of
  // matrix i (f32, f16 or bf16); packed_dtype the buffer's.
  PackPlan(PackedLayout layout, std::vector<zf_dtype> dtypes, zf_dtype packed_dtype);

  // packed <- scale * M[:, unselected] (to_packed), or M[:, unselected] <- packed.
  // selected[i]: matrix i's k_i ascending indices (nullptr when k_i == 0).
  void run(ThreadPool& pool, void* const* matrices, const int32_t* const* selected, void* packed, float scale,
           bool to_packed) const;

  const PackedLayout& layout() const { return layout_; }

 private:
  struct Block {  // a range of one matrix's unselected columns, walked row by row
    size_t matrix;
    int64_t first, last;
  };
  PackedLayout layout_;
  std::vector<zf_dtype> dtypes_;
  zf_dtype packed_dtype_;
  std::vector<Block> blocks_;
};

}  // namespace zf
