// Validation shared by every op that takes matrices, selected-index lists and column
// states, host and device alike: one validator for each kind of argument, and one overlap
// check for every buffer a call touches.
#pragma once

#include <cstdint>
#include <vector>

#include "common/matrix_view.hpp"
#include "common/tensor.hpp"
#include "zenflow/optim.h"

namespace zf {

// Descriptor, dtype f32/f16/bf16, contiguous, on `device`, fewer than 2^31 columns.
MatrixView check_float_matrix(const zf_tensor* t, const ArgName& name, const zf_device& device,
                              const ArgName& device_source);

// The one validator of selected-index lists: i32, 1-D, contiguous, k <= n, on `device`;
// returns k. On the host (CPU tensors) also checks that the indices are strictly
// increasing and in [0, n) (device tensors are not read by the host).
int64_t check_selected(const zf_tensor* t, const ArgName& name, int64_t n, const zf_device& device,
                       const ArgName& device_source);

// A contiguous tensor of `dtype` with exactly `elements` elements on `device`.
void check_state_tensor(const zf_tensor& t, const ArgName& name, zf_dtype dtype, int64_t elements,
                        const zf_device& device, const ArgName& device_source);

// True when the master tensor is present (non-empty); then it must be f32 of `elements`.
// An empty master's descriptor and device are checked too.
bool check_master(const zf_tensor& t, const ArgName& name, int64_t elements, const zf_device& device,
                  const ArgName& device_source);

// Host step counts (i32, `count` of them at `counts`): each must be >= minimum and
// <= INT32_MAX - headroom (headroom 1 when the call increments them). `counts` may start
// inside the tensor `name`: at its element first_index, which messages then count from.
void check_step_counts(const int32_t* counts, int64_t count, const ArgName& name, int32_t minimum, int32_t headroom,
                       int64_t first_index = 0);

// Every buffer of one call, for one check that no buffer the call writes overlaps any
// other buffer of the call (read or written). Byte ranges [data, data + numel * size) of
// tensors on the same device; empty tensors take no memory. O(n log n).
class OverlapCheck {
 public:
  void reserve(size_t count) { ranges_.reserve(count); }
  void add(const zf_tensor& t, const ArgName& name, bool written);
  // Throws INVALID_VALUE naming both buffers when a written one overlaps another.
  void check();

 private:
  struct Range {
    uintptr_t begin, end;
    int device_type, device_index;
    bool written;
    ArgName name;
  };
  std::vector<Range> ranges_;
};

}  // namespace zf
