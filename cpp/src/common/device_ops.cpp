#include "common/device_ops.hpp"

namespace zf {

CudaOps& cuda_ops() {
  static CudaOps table;
  return table;
}

void check_device_compiled(const zf_device& device, const ArgName& name) {
  if (device.type != ZF_DEVICE_CUDA) return;
  require(zf_cuda_compiled() != 0, ZF_ERROR_NOT_SUPPORTED, name, ": is a CUDA tensor but ", kNoCudaBuild, " (",
          zf_cuda_build_note(), "). ", kRebuildWithCuda);
  require(device.index >= 0, ZF_ERROR_INVALID_VALUE, name, ": invalid CUDA device index ", device.index);
}

bool workspace_query(void* workspace, size_t* workspace_bytes, size_t required) {
  if (workspace == nullptr && workspace_bytes != nullptr) {
    *workspace_bytes = required;
    return true;
  }
  if (required == 0) return false;
  require(workspace != nullptr, ZF_ERROR_INVALID_VALUE, "workspace: NULL, but this call needs ", required,
          " bytes (query the size first)");
  require(workspace_bytes == nullptr || *workspace_bytes >= required, ZF_ERROR_INVALID_VALUE,
          "workspace_bytes: ", workspace_bytes ? *workspace_bytes : 0, " is less than the ", required,
          " bytes required");
  return false;
}

}  // namespace zf
