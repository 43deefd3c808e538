// The one batching helper of the multi-tensor launchers: a list of per-matrix entries is
// launched in batches that fit the kernel's by-value metadata table, each batch one
// launch, with the blocks of its entries numbered from 0 within the launch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/error.hpp"

namespace zf {
namespace cuda {

// Calls launch(begin, end) for consecutive ranges of at most `per_launch` entries.
template <class Launch>
void for_each_launch_batch(size_t count, size_t per_launch, Launch&& launch) {
  for (size_t begin = 0; begin < count; begin += per_launch) launch(begin, std::min(count, begin + per_launch));
}

// Numbers the blocks of entries [0, count): entry i gets (entries[i].*first) = the blocks of
// the entries before it; returns the total, checked to fit one grid's x dimension.
template <class Entry, class BlocksOf>
unsigned number_blocks(Entry* entries, size_t count, int64_t Entry::*first, BlocksOf&& blocks_of, const char* what) {
  int64_t blocks = 0;
  for (size_t i = 0; i < count; ++i) {
    entries[i].*first = blocks;
    blocks += blocks_of(entries[i]);
  }
  require(blocks <= INT32_MAX, ZF_ERROR_INVALID_VALUE, what, ": too many blocks for one launch");
  return static_cast<unsigned>(blocks);
}

}  // namespace cuda
}  // namespace zf
