// Host memory that the host lane streams: the engine's host state (master, moments,
// accumulators), the host backend's arena (staging slots, upload copies) and the streaming
// roof's buffers, so that the roof is timed on the memory the lane runs on.
//
// Every block starts on a cache line. malloc puts a block it maps 16 bytes off a line; then
// every vector access straddles two lines, and a streamed accumulate's head, which aligns its
// stores, leaves the gradient's loads off the line instead. Measured in the engine (2-core
// Zen 4 VM, 40 x [1024, 2048] fp32, windows of 4 steps, each pass against the streaming roof
// timed around it), 16 bytes off against on the line: the window's first accumulate 76% ->
// 93% of the roof, its update 73% -> 96% (benchmarks/results/2026-12-07-host-lane-fast-state.md).
//
// A block of kHugePageBytes or more is mapped on its own, starts on a huge page and is advised
// for transparent huge pages (Linux madvise(MADV_HUGEPAGE): honoured where the system's setting
// is "madvise" or "always"; elsewhere, and off Linux, it stays on base pages, with the same
// contents and alignment to a cache line). With base pages of 4 KiB a stream crosses a page
// every 64 lines, each a TLB entry and, for the hardware prefetchers, which stop at a page's
// end, a new start. The lane's kernels on the engine's array shapes ran at 94-104% of the
// (base-page) streaming roof on huge pages against 79-95% on base pages in the VM's fast
// memory state, 96-101% against 90-98% in its slow one; in the engine itself that VM's
// run-to-run spread hid the difference (benchmarks/results/2026-12-07-host-lane-huge-pages.md).
// Only whole huge pages inside the block are huge: the tail past the last one stays on base
// pages, so the advice costs no resident memory, only up to one huge page of address space
// for the alignment.
//
// Thread-safe (plain mmap/munmap and operator new). Contents are uninitialised.
#pragma once

#include <cstddef>
#include <vector>

namespace zf {

constexpr size_t kCacheLineBytes = 64;
constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` of host memory as above, starting on a multiple of `alignment` (a power of two
// from kCacheLineBytes to kHugePageBytes; the host backend's arena takes CUDA's 256); throws
// std::bad_alloc. bytes == 0 gives a unique pointer.
void* allocate_streamed(size_t bytes, size_t alignment = kCacheLineBytes);
// Frees a block of allocate_streamed with the same `bytes` and `alignment`. nullptr is ignored.
void free_streamed(void* memory, size_t bytes, size_t alignment = kCacheLineBytes) noexcept;

template <class T>
struct StreamedAllocator {
  using value_type = T;
  StreamedAllocator() = default;
  template <class U>
  StreamedAllocator(const StreamedAllocator<U>&) noexcept {}
  T* allocate(size_t count) { return static_cast<T*>(allocate_streamed(count * sizeof(T))); }
  void deallocate(T* p, size_t count) noexcept { free_streamed(p, count * sizeof(T)); }
  template <class U>
  bool operator==(const StreamedAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const StreamedAllocator<U>&) const noexcept {
    return false;
  }
};

// The engine's host state arrays.
template <class T>
using StreamedVector = std::vector<T, StreamedAllocator<T>>;

}  // namespace zf
