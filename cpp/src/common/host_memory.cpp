// allocate_streamed / free_streamed (host_memory.hpp).
#include "common/host_memory.hpp"

#include <cstdint>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace zf {
namespace {

#if defined(__linux__)
size_t base_page_bytes() {
  static const size_t bytes = [] {
    const long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? static_cast<size_t>(page) : size_t{4096};
  }();
  return bytes;
}

size_t round_up(size_t value, size_t to) { return (value + to - 1) / to * to; }

// The block's own mapping: the block's bytes rounded up to a base page.
size_t mapped_bytes(size_t bytes) { return round_up(bytes, base_page_bytes()); }
#endif

bool mapped_on_its_own(size_t bytes) {
#if defined(__linux__)
  return bytes >= kHugePageBytes;
#else
  (void)bytes;
  return false;
#endif
}

}  // namespace

void* allocate_streamed(size_t bytes, size_t alignment) {
  // A block mapped on its own starts on a huge page, which is aligned to any `alignment`.
  if (!mapped_on_its_own(bytes)) return ::operator new (bytes, std::align_val_t{alignment});
#if defined(__linux__)
  // Map a huge page more than needed, keep the stretch that starts on a huge page and give the
  // rest back: the block's start is then the first byte of a huge page.
  const size_t length = mapped_bytes(bytes);
  const size_t reserved = length + kHugePageBytes;
  void* mapping = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(mapping);
  const uintptr_t aligned = round_up(start, kHugePageBytes);
  if (aligned > start) munmap(mapping, aligned - start);
  const uintptr_t end = aligned + length;
  if (start + reserved > end) munmap(reinterpret_cast<void*>(end), start + reserved - end);
#if defined(MADV_HUGEPAGE)
  // Advice: refused (THP compiled out, or "never"), the block stays on base pages.
  madvise(reinterpret_cast<void*>(aligned), length, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<void*>(aligned);
#else
  return nullptr;
#endif
}

void free_streamed(void* memory, size_t bytes, size_t alignment) noexcept {
  if (memory == nullptr) return;
  if (!mapped_on_its_own(bytes)) {
    ::operator delete (memory, std::align_val_t{alignment});
    return;
  }
#if defined(__linux__)
  munmap(memory, mapped_bytes(bytes));
#endif
}

}  // namespace zf
