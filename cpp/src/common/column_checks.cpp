#include "common/column_checks.hpp"

#include <algorithm>
#include <limits>

#include "common/error.hpp"

namespace zf {

MatrixView check_float_matrix(const zf_tensor* t, const ArgName& name, const zf_device& device,
                              const ArgName& device_source) {
  check_descriptor(t, name);
  check_dtype(*t, name, {ZF_DTYPE_F32, ZF_DTYPE_F16, ZF_DTYPE_BF16});
  check_contiguous(*t, name);
  check_same_device(*t, name, device, device_source);
  const MatrixView view = matrix_view(*t);
  require(view.cols <= INT32_MAX, ZF_ERROR_INVALID_VALUE, name, ": more columns than int32 indices can address");
  return view;
}

int64_t check_selected(const zf_tensor* t, const ArgName& name, int64_t n, const zf_device& device,
                       const ArgName& device_source) {
  check_descriptor(t, name);
  check_dtype(*t, name, {ZF_DTYPE_I32});
  check_ndim(*t, name, 1);
  check_contiguous(*t, name);
  check_same_device(*t, name, device, device_source);
  const int64_t k = t->shape[0];
  require(k <= n, ZF_ERROR_INVALID_VALUE, name, ": k=", k, " indices for ", n, " columns");
  if (t->device.type == ZF_DEVICE_CPU) {
    const int32_t* indices = static_cast<const int32_t*>(t->data);
    for (int64_t c = 0; c < k; ++c) {
      if (indices[c] >= 0 && indices[c] < n && (c == 0 || indices[c] > indices[c - 1])) continue;
      require(indices[c] >= 0 && indices[c] < n, ZF_ERROR_INVALID_VALUE, name, ": index ", indices[c], " at position ",
              c, " is outside [0, ", n, ")");
      fail(ZF_ERROR_INVALID_VALUE, name, ": indices must be ascending and distinct (strictly increasing); position ",
           c - 1, " holds ", indices[c - 1], ", position ", c, " holds ", indices[c]);
    }
  }
  return k;
}

void check_state_tensor(const zf_tensor& t, const ArgName& name, zf_dtype dtype, int64_t elements,
                        const zf_device& device, const ArgName& device_source) {
  check_descriptor(&t, name);
  check_dtype(t, name, {dtype});
  check_contiguous(t, name);
  check_same_device(t, name, device, device_source);
  check_numel(t, name, elements);
}

bool check_master(const zf_tensor& t, const ArgName& name, int64_t elements, const zf_device& device,
                  const ArgName& device_source) {
  check_descriptor(&t, name);
  check_same_device(t, name, device, device_source);
  if (numel(t) == 0 && elements != 0) return false;
  check_state_tensor(t, name, ZF_DTYPE_F32, elements, device, device_source);
  return elements != 0;
}

void check_step_counts(const int32_t* counts, int64_t count, const ArgName& name, int32_t minimum, int32_t headroom,
                       int64_t first_index) {
  const int32_t maximum = std::numeric_limits<int32_t>::max() - headroom;
  for (int64_t c = 0; c < count; ++c) {
    if (counts[c] >= minimum && counts[c] <= maximum) continue;
    const int64_t index = first_index + c;
    if (counts[c] < minimum) {
      fail(ZF_ERROR_INVALID_VALUE, name, "[", index, "]: step count ", counts[c], " is below ", minimum);
    }
    fail(ZF_ERROR_INVALID_VALUE, name, "[", index, "]: step count ", counts[c],
         " cannot be incremented (it would pass INT32_MAX)");
  }
}

void OverlapCheck::add(const zf_tensor& t, const ArgName& name, bool written) {
  const int64_t bytes = numel(t) * static_cast<int64_t>(zf_dtype_size(t.dtype));
  if (bytes == 0) return;
  const auto begin = reinterpret_cast<uintptr_t>(t.data);
  ranges_.push_back(Range{begin, begin + static_cast<uintptr_t>(bytes), static_cast<int>(t.device.type), t.device.index,
                          written, name});
}

void OverlapCheck::check() {
  // Sorts small keys, not the ranges (with their names) themselves: a call over hundreds
  // of matrices checks thousands of ranges, and this sort was a visible part of its cost.
  struct Key {
    uint64_t device;  // type in the high half, index in the low half
    uintptr_t begin;
    size_t range;
  };
  std::vector<Key> keys(ranges_.size());
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const Range& r = ranges_[i];
    keys[i] =
        Key{(static_cast<uint64_t>(static_cast<uint32_t>(r.device_type)) << 32) | static_cast<uint32_t>(r.device_index),
            r.begin, i};
  }
  std::sort(keys.begin(), keys.end(),
            [](const Key& a, const Key& b) { return a.device != b.device ? a.device < b.device : a.begin < b.begin; });
  // Sweep in address order. Against each range, only earlier ranges that reach past its
  // start can overlap it: track the one reaching furthest, and the furthest written one.
  const Range* furthest = nullptr;
  const Range* furthest_written = nullptr;
  for (size_t i = 0; i < keys.size(); ++i) {
    const Range& r = ranges_[keys[i].range];
    if (i > 0 && keys[i - 1].device != keys[i].device) furthest = furthest_written = nullptr;
    const Range* other = nullptr;
    if (r.written && furthest != nullptr && furthest->end > r.begin) other = furthest;
    if (!r.written && furthest_written != nullptr && furthest_written->end > r.begin) other = furthest_written;
    if (other != nullptr) {
      fail(ZF_ERROR_INVALID_VALUE, r.name, ": overlaps ", other->name,
           " in memory (a buffer the call writes must not share memory with any other argument)");
    }
    if (furthest == nullptr || r.end > furthest->end) furthest = &r;
    if (r.written && (furthest_written == nullptr || r.end > furthest_written->end)) furthest_written = &r;
  }
}

}  // namespace zf
