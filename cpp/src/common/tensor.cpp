#include "common/tensor.hpp"

#include <cstddef>
#include <limits>
#include <sstream>

namespace zf {

std::string ArgName::str() const {
  std::string out = base_ ? base_ : "?";
  if (index_ >= 0) out += "[" + std::to_string(index_) + "]";
  if (field_ != nullptr) out += std::string(".") + field_;
  return out;
}

std::ostream& operator<<(std::ostream& out, const ArgName& name) { return out << name.str(); }

std::string arg_name(const char* name, size_t index) { return std::string(name) + "[" + std::to_string(index) + "]"; }

std::string describe_device(const zf_device& device) {
  if (device.type == ZF_DEVICE_CPU) return "cpu";
  if (device.type == ZF_DEVICE_CUDA) return "cuda:" + std::to_string(device.index);
  return "unknown device " + std::to_string(static_cast<int>(device.type));
}

zf_tensor contiguous_descriptor(const void* data, zf_dtype dtype, zf_device device,
                                std::initializer_list<int64_t> shape) {
  zf_tensor t{};
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int32_t>(shape.size());
  int d = 0;
  for (int64_t s : shape) t.shape[d++] = s;
  int64_t stride = 1;
  for (d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

int64_t numel(const zf_tensor& t) {
  // A zero dimension makes the tensor empty whatever the others hold, and check_descriptor
  // accepts any size beside a 0 (the product of the others may overflow): look for it first.
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return 0;
  }
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

bool is_contiguous(const zf_tensor& t) {
  if (numel(t) == 0) return true;  // no element to address: strides are meaningless
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    // Size-1 dimensions may carry any stride (torch gives them arbitrary ones).
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

static std::string shape_string(const zf_tensor& t) {
  std::ostringstream out;
  out << "[";
  for (int d = 0; d < t.ndim; ++d) out << (d ? ", " : "") << t.shape[d];
  out << "]";
  return out.str();
}

void check_descriptor(const zf_tensor* t, const ArgName& name) {
  require(t != nullptr, ZF_ERROR_INVALID_VALUE, name, ": descriptor is NULL");
  // Enums arrive from C as raw integers: compare them as integers, read without going
  // through the enum type.
  const int dtype_code = raw_enum_value(t->dtype);
  require(dtype_code >= ZF_DTYPE_F32 && dtype_code <= ZF_DTYPE_I64, ZF_ERROR_INVALID_TYPE, name,
          ": unknown dtype code ", dtype_code);
  const int device_code = raw_enum_value(t->device.type);
  require(device_code == ZF_DEVICE_CPU || device_code == ZF_DEVICE_CUDA, ZF_ERROR_INVALID_TYPE, name,
          ": unsupported device type ", device_code);
  require(t->device.type == ZF_DEVICE_CPU || t->device.index >= 0, ZF_ERROR_INVALID_TYPE, name,
          ": invalid CUDA device index ", t->device.index);
  require(t->ndim >= 0 && t->ndim <= ZF_MAX_DIMS, ZF_ERROR_INVALID_VALUE, name, ": ndim ", t->ndim, " is outside [0, ",
          ZF_MAX_DIMS, "]");
  // Element count and byte size must fit in ptrdiff_t: a product that wraps would make a
  // huge tensor look empty (and accept a NULL pointer for it).
  const int64_t element_bytes = static_cast<int64_t>(zf_dtype_size(t->dtype));
  const int64_t max_elements = std::numeric_limits<std::ptrdiff_t>::max() / element_bytes;
  int64_t elements = 1;
  bool empty = false;
  for (int d = 0; d < t->ndim; ++d) {
    require(t->shape[d] >= 0, ZF_ERROR_INVALID_VALUE, name, ": negative size ", t->shape[d], " in dimension ", d);
    if (t->shape[d] == 0) empty = true;
  }
  if (empty) return;
  for (int d = 0; d < t->ndim; ++d) {
    if (elements > max_elements / t->shape[d]) {
      fail(ZF_ERROR_INVALID_VALUE, name, ": shape ", shape_string(*t), " holds more than PTRDIFF_MAX bytes");
    }
    elements *= t->shape[d];
  }
  require(t->data != nullptr, ZF_ERROR_INVALID_VALUE, name, ": data is NULL for a non-empty tensor");
  const auto address = reinterpret_cast<uintptr_t>(t->data);
  require(address % static_cast<uintptr_t>(element_bytes) == 0, ZF_ERROR_INVALID_VALUE, name,
          ": data pointer is not aligned to its element size (", element_bytes, " bytes)");
}

void check_dtype(const zf_tensor& t, const ArgName& name, std::initializer_list<zf_dtype> allowed) {
  for (zf_dtype d : allowed) {
    if (t.dtype == d) return;
  }
  std::ostringstream expected;
  bool first = true;
  for (zf_dtype d : allowed) {
    expected << (first ? "" : ", ") << zf_dtype_name(d);
    first = false;
  }
  fail(ZF_ERROR_INVALID_TYPE, name, ": expected dtype ", expected.str(), ", got ", zf_dtype_name(t.dtype));
}

void check_ndim(const zf_tensor& t, const ArgName& name, int ndim) {
  if (t.ndim == ndim) return;
  fail(ZF_ERROR_INVALID_VALUE, name, ": expected a ", ndim, "-D tensor, got shape ", shape_string(t));
}

void check_contiguous(const zf_tensor& t, const ArgName& name) {
  if (is_contiguous(t)) return;
  // A transposed view (torch's x.t(), strides [1, rows]) is the likeliest cause: say so, since
  // its shape alone looks right for an argument taken in the transposed layout.
  if (t.ndim == 2 && t.strides[0] == 1 && t.strides[1] == t.shape[0]) {
    fail(ZF_ERROR_INVALID_VALUE, name, ": is a transposed view (shape ", shape_string(t), ", strides [1, ", t.shape[0],
         "]); every tensor is read row-major from its memory: pass a contiguous copy (x.t().contiguous()) in the "
         "layout the call documents");
  }
  fail(ZF_ERROR_INVALID_VALUE, name, ": expected a contiguous (row-major) tensor of shape ", shape_string(t),
       ", got non-contiguous strides");
}

void check_same_device(const zf_tensor& t, const ArgName& name, const zf_device& expected,
                       const ArgName& expected_from) {
  if (same_device(t.device, expected)) return;
  fail(ZF_ERROR_INVALID_TYPE, name, ": is on ", describe_device(t.device), " but ", expected_from, " is on ",
       describe_device(expected));
}

void check_numel(const zf_tensor& t, const ArgName& name, int64_t expected) {
  if (numel(t) == expected) return;
  fail(ZF_ERROR_INVALID_VALUE, name, ": expected ", expected, " elements, got shape ", shape_string(t));
}

namespace {

// The sizes of `shape` other than 1: the shape as a layout sees it.
int squeezed(const int64_t* shape, int ndim, int64_t out[ZF_MAX_DIMS]) {
  int count = 0;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] != 1) out[count++] = shape[d];
  }
  return count;
}

bool same_squeezed(const int64_t* a, int a_ndim, const int64_t* b, int b_ndim) {
  int64_t sa[ZF_MAX_DIMS], sb[ZF_MAX_DIMS];
  const int na = squeezed(a, a_ndim, sa), nb = squeezed(b, b_ndim, sb);
  if (na != nb) return false;
  for (int d = 0; d < na; ++d) {
    if (sa[d] != sb[d]) return false;
  }
  return true;
}

}  // namespace

void check_matrix_layout(const zf_tensor& t, const ArgName& name, int64_t rows, int64_t cols, const char* layout,
                         const ArgName& reference) {
  if (t.ndim < 2 || numel(t) == 0) return;
  const int64_t expected[2] = {rows, cols};
  if (same_squeezed(t.shape, t.ndim, expected, 2)) return;
  fail(ZF_ERROR_INVALID_VALUE, name, ": shape ", shape_string(t), " is not [", rows, ", ", cols, "], ", layout,
       " given by ", reference,
       " (the same elements in another shape would be read in the wrong order); pass it in "
       "that shape, or flattened to 1-D if its elements are already in that order");
}

void check_same_layout(const zf_tensor& t, const ArgName& name, const zf_tensor& reference,
                       const ArgName& reference_name) {
  if (t.ndim < 2 || reference.ndim < 2 || numel(t) == 0) return;
  if (same_squeezed(t.shape, t.ndim, reference.shape, reference.ndim)) return;
  fail(ZF_ERROR_INVALID_VALUE, name, ": shape ", shape_string(t), " differs from the shape ", shape_string(reference),
       " of ", reference_name,
       " (the same number of elements in another layout, e.g. transposed, would update "
       "the wrong elements); pass it in ",
       reference_name, "'s shape, or flattened to 1-D");
}

void check_cpu(const zf_tensor& t, const ArgName& name) {
  if (t.device.type == ZF_DEVICE_CPU) return;
  fail(ZF_ERROR_INVALID_TYPE, name, ": must be a CPU tensor, is on ", describe_device(t.device));
}

}  // namespace zf
