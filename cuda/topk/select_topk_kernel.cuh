// Segmented top-k over the column scores of many matrices in one launch: one thread
// block per score vector.
//
// Algorithm: scores map to 32-bit keys that order like the floats (-0 folded into +0), a
// 4-pass radix select (8 bits per pass, warp-aggregated shared-memory histogram) finds the
// key T of the k-th best score and how many scores equal to T are still to take, then one
// pass in index order picks every key > T and the first `remaining` keys == T (the lower
// index wins a tie) and writes their indices through a block-wide prefix sum, so the
// output is ascending without a sort. Every step depends on the data only, never on timing: the
// result is deterministic and equal to the host's (the total order is the same).
#pragma once

#include <cstdint>
#include <cub/block/block_scan.cuh>

namespace zf {
namespace cuda {

constexpr int kTopkThreads = 256;  // also the number of histogram bins
constexpr int kTopkItemsPerThread = 4;
constexpr int kTopkMaxSegmentsPerLaunch = 1024;  // by-value table of 24 KiB (limit: 32 KiB)
constexpr uint32_t kNoDigit = 0xffffffffu;       // a lane with no key in the histogram

struct TopkSegment {
  const float* scores;
  int32_t* out;
  int32_t n;
  int32_t k;  // 1 <= k <= n (empty selections are not launched)
};

struct TopkLaunchTable {
  TopkSegment segments[kTopkMaxSegmentsPerLaunch];
};

__device__ __forceinline__ bool score_is_nan(float score) {
  return (__float_as_uint(score) & 0x7fffffffu) > 0x7f800000u;
}

// Monotone map float -> uint32 (larger key = larger score); +0 and -0 share a key, as
// they compare equal on the host.
__device__ __forceinline__ uint32_t score_key(float score) {
  uint32_t bits = __float_as_uint(score);
  if ((bits & 0x7fffffffu) == 0) bits = 0;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads) select_topk_kernel(const TopkLaunchTable table) {
  using BlockScan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int histogram[kTopkThreads];
  __shared__ uint32_t chosen_prefix;
  __shared__ int chosen_remaining;

  const TopkSegment seg = table.segments[blockIdx.x];
  const float* __restrict__ scores = seg.scores;
  const int tid = threadIdx.x;

  // A NaN score has no rank. The launcher cannot fail the call without synchronising, so
  // the device contract (zenflow/topk.h) is to fill the segment's output with -1.
  bool has_nan = false;
  for (int32_t j = tid; j < seg.n; j += kTopkThreads) has_nan |= score_is_nan(__ldg(scores + j));
  if (__syncthreads_or(has_nan)) {
    for (int32_t p = tid; p < seg.k; p += kTopkThreads) seg.out[p] = -1;
    return;
  }
  if (seg.k == seg.n) {
    for (int32_t p = tid; p < seg.k; p += kTopkThreads) seg.out[p] = p;
    return;
  }

  // Radix select of the k-th largest key, most significant digit first. `remaining` is the
  // number of keys still to take among those that match `prefix` on the digits fixed so far.
  uint32_t prefix = 0, mask = 0;
  int remaining = seg.k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    histogram[tid] = 0;
    __syncthreads();
    // Warp-aggregated: the lanes with the same digit add their count once, from the
    // lowest of them. Column scores are mostly positive floats of a few binades, so in the
    // first pass nearly every key has the same top digit; one shared atomic per lane would
    // serialise the whole block on that bin. The base is uniform, so every lane reaches
    // the match together; lanes past the end or off the prefix carry no digit.
    for (int32_t base = 0; base < seg.n; base += kTopkThreads) {
      const int32_t j = base + tid;
      uint32_t digit = kNoDigit;
      if (j < seg.n) {
        const uint32_t key = score_key(__ldg(scores + j));
        if ((key & mask) == prefix) digit = (key >> shift) & 0xffu;
      }
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (digit != kNoDigit && (tid % 32) == __ffs(peers) - 1) atomicAdd(&histogram[digit], __popc(peers));
    }
    __syncthreads();
    // Thread t looks at digit 255 - t: the inclusive sum counts the keys with that digit or
    // a larger one. Exactly one digit brackets `remaining`.
    const int digit = kTopkThreads - 1 - tid;
    const int count = histogram[digit];
    int at_or_above;
    BlockScan(scan_storage).InclusiveSum(count, at_or_above);
    const int above = at_or_above - count;
    if (above < remaining && at_or_above >= remaining) {
      chosen_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
      chosen_remaining = remaining - above;
    }
    __syncthreads();
    prefix = chosen_prefix;
    remaining = chosen_remaining;
    mask |= 0xffu << shift;
  }
  const uint32_t threshold = prefix;

  // Index-ordered pass: blocked arrangement (thread t owns items t*4 .. t*4+3 of a tile), so
  // exclusive sums follow the index order and the output comes out ascending.
  int written = 0, equal_seen = 0;
  for (int64_t base = 0; base < seg.n; base += kTopkThreads * kTopkItemsPerThread) {
    uint32_t keys[kTopkItemsPerThread];
    int equal[kTopkItemsPerThread], equal_before[kTopkItemsPerThread];
    int take[kTopkItemsPerThread], position[kTopkItemsPerThread];
#pragma unroll
    for (int i = 0; i < kTopkItemsPerThread; ++i) {
      const int64_t j = base + tid * kTopkItemsPerThread + i;
      keys[i] = j < seg.n ? score_key(__ldg(scores + j)) : 0u;
      equal[i] = (j < seg.n && keys[i] == threshold) ? 1 : 0;
    }
    int equal_in_tile;
    BlockScan(scan_storage).ExclusiveSum(equal, equal_before, equal_in_tile);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTopkItemsPerThread; ++i) {
      take[i] = (keys[i] > threshold || (equal[i] && equal_seen + equal_before[i] < remaining)) ? 1 : 0;
    }
    int taken_in_tile;
    BlockScan(scan_storage).ExclusiveSum(take, position, taken_in_tile);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTopkItemsPerThread; ++i) {
      if (take[i]) seg.out[written + position[i]] = static_cast<int32_t>(base + tid * kTopkItemsPerThread + i);
    }
    written += taken_in_tile;
    equal_seen += equal_in_tile;
    if (written >= seg.k) break;  // uniform across the block
  }
}

}  // namespace cuda
}  // namespace zf
