// std::vector storage that starts on a cache line, for the engine's host state (master,
// moments, accumulators): the host lane streams it against buffers that start on one (the
// staging slots, the upload copies). malloc puts a block it maps 16 bytes off a line (and one
// from its heap at any multiple of 16); then every vector access to the state straddles two
// lines, and a streamed accumulate's head, which aligns its stores, leaves the gradient's
// loads off the line instead. Measured in the engine (2-core Zen 4 VM, 40 x [1024, 2048]
// fp32, windows of 4 steps, each pass against the streaming roof timed around it), 16 bytes
// off against on the line: the window's first accumulate 76% -> 93% of the roof, its update
// 73% -> 96%; with the memory in its fast state 55% -> 93% and 57% -> 91%
// (benchmarks/results/2026-12-07-host-lane-fast-state.md).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace zf {

constexpr size_t kCacheLineBytes = 64;

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(size_t count) {
    return static_cast<T*>(::operator new (count * sizeof(T), std::align_val_t{kCacheLineBytes}));
  }
  void deallocate(T* p, size_t) noexcept { ::operator delete (p, std::align_val_t{kCacheLineBytes}); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const CacheLineAllocator<U>&) const noexcept {
    return false;
  }
};

template <class T>
using CacheLineVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace zf
