#include "ops/column_ops.hpp"

#include "common/error.hpp"

namespace zf {

MatrixView check_float_matrix(const zf_tensor* t, const std::string& name, const zf_device& device,
                              const std::string& device_source) {
  check_descriptor(t, name);
  check_dtype(*t, name, {ZF_DTYPE_F32, ZF_DTYPE_F16, ZF_DTYPE_BF16});
  check_contiguous(*t, name);
  check_same_device(*t, name, device, device_source);
  const MatrixView view = matrix_view(*t);
  require(view.cols <= INT32_MAX, ZF_ERROR_INVALID_VALUE, name, ": more columns than int32 indices can address");
  return view;
}

int64_t check_selected(const zf_tensor* t, const std::string& name, int64_t n, const zf_device& device,
                       const std::string& device_source) {
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
      require(indices[c] >= 0 && indices[c] < n, ZF_ERROR_INVALID_VALUE, name, ": index ", indices[c], " at position ",
              c, " is outside [0, ", n, ")");
      require(c == 0 || indices[c] > indices[c - 1], ZF_ERROR_INVALID_VALUE, name,
              ": indices must be ascending and distinct (position ", c, ")");
    }
  }
  return k;
}

void check_state_tensor(const zf_tensor& t, const std::string& name, zf_dtype dtype, int64_t elements,
                        const zf_device& device, const std::string& device_source) {
  check_descriptor(&t, name);
  check_dtype(t, name, {dtype});
  check_contiguous(t, name);
  check_same_device(t, name, device, device_source);
  check_numel(t, name, elements);
}

bool check_master(const zf_tensor& t, const std::string& name, int64_t elements, const zf_device& device,
                  const std::string& device_source) {
  check_descriptor(&t, name);
  if (numel(t) == 0) return false;
  check_state_tensor(t, name, ZF_DTYPE_F32, elements, device, device_source);
  return true;
}

}  // namespace zf
