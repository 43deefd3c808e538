#include "common/tensor.hpp"

#include <sstream>

namespace zf {

std::string arg_name(const char* name, size_t index) { return std::string(name) + "[" + std::to_string(index) + "]"; }

std::string describe_device(const zf_device& device) {
  if (device.type == ZF_DEVICE_CPU) return "cpu";
  if (device.type == ZF_DEVICE_CUDA) return "cuda:" + std::to_string(device.index);
  return "unknown device " + std::to_string(static_cast<int>(device.type));
}

int64_t numel(const zf_tensor& t) {
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

void check_descriptor(const zf_tensor* t, const std::string& name) {
  require(t != nullptr, ZF_ERROR_INVALID_VALUE, name, ": descriptor is NULL");
  require(zf_dtype_size(t->dtype) != 0, ZF_ERROR_INVALID_TYPE, name, ": unknown dtype code ",
          static_cast<int>(t->dtype));
  require(t->device.type == ZF_DEVICE_CPU || t->device.type == ZF_DEVICE_CUDA, ZF_ERROR_INVALID_TYPE, name,
          ": unsupported device type ", static_cast<int>(t->device.type));
  require(t->ndim >= 0 && t->ndim <= ZF_MAX_DIMS, ZF_ERROR_INVALID_VALUE, name, ": ndim ", t->ndim, " is outside [0, ",
          ZF_MAX_DIMS, "]");
  for (int d = 0; d < t->ndim; ++d) {
    require(t->shape[d] >= 0, ZF_ERROR_INVALID_VALUE, name, ": negative size ", t->shape[d], " in dimension ", d);
  }
  if (numel(*t) == 0) return;
  require(t->data != nullptr, ZF_ERROR_INVALID_VALUE, name, ": data is NULL for a non-empty tensor");
  const auto address = reinterpret_cast<uintptr_t>(t->data);
  require(address % zf_dtype_size(t->dtype) == 0, ZF_ERROR_INVALID_VALUE, name,
          ": data pointer is not aligned to its element size (", zf_dtype_size(t->dtype), " bytes)");
}

void check_dtype(const zf_tensor& t, const std::string& name, std::initializer_list<zf_dtype> allowed) {
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

void check_ndim(const zf_tensor& t, const std::string& name, int ndim) {
  require(t.ndim == ndim, ZF_ERROR_INVALID_VALUE, name, ": expected a ", ndim, "-D tensor, got shape ",
          shape_string(t));
}

void check_contiguous(const zf_tensor& t, const std::string& name) {
  require(is_contiguous(t), ZF_ERROR_INVALID_VALUE, name, ": expected a contiguous (row-major) tensor of shape ",
          shape_string(t), ", got non-contiguous strides");
}

void check_same_device(const zf_tensor& t, const std::string& name, const zf_device& expected,
                       const std::string& expected_from) {
  require(same_device(t.device, expected), ZF_ERROR_INVALID_TYPE, name, ": is on ", describe_device(t.device), " but ",
          expected_from, " is on ", describe_device(expected));
}

void check_numel(const zf_tensor& t, const std::string& name, int64_t expected) {
  require(numel(t) == expected, ZF_ERROR_INVALID_VALUE, name, ": expected ", expected, " elements, got shape ",
          shape_string(t));
}

}  // namespace zf
