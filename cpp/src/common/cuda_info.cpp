// CUDA availability queries. With a statically linked cudart, libcuda is opened only on
// the first call here, so a machine without a driver loads libzenflow fine and sees 0 GPUs.
#include <cstring>

#include "common/error.hpp"
#include "zenflow/zenflow.h"

#if defined(ZENFLOW_WITH_CUDA)
#include <cuda_runtime.h>
#endif

extern "C" {

ZF_API int zf_cuda_compiled(void) {
#if defined(ZENFLOW_WITH_CUDA)
  return 1;
#else
  return 0;
#endif
}

ZF_API const char* zf_cuda_architectures(void) {
#if defined(ZENFLOW_WITH_CUDA)
  return ZENFLOW_CUDA_ARCHS_STRING;
#else
  return "";
#endif
}

ZF_API const char* zf_cuda_build_note(void) {
#if defined(ZENFLOW_WITH_CUDA)
  return "";
#elif defined(ZENFLOW_CUDA_BUILD_NOTE)
  return ZENFLOW_CUDA_BUILD_NOTE;
#else
  return "built without CUDA";
#endif
}

ZF_API int zf_cuda_device_count(void) {
#if defined(ZENFLOW_WITH_CUDA)
  int count = 0;
  // No driver gives cudaErrorInsufficientDriver rather than "no device": every error
  // means "no usable GPU" here. Clear it so it does not leak into later calls.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

ZF_API zf_status zf_cuda_device_name(int index, char* buf, size_t buf_size) {
  return zf::api_call([&] {
    zf::require(buf != nullptr && buf_size > 0, ZF_ERROR_INVALID_VALUE, "buf: NULL or empty");
    const int count = zf_cuda_device_count();
    zf::require(index >= 0 && index < count, ZF_ERROR_INVALID_VALUE, "index: ", index, " is not a CUDA device (", count,
                " visible)");
#if defined(ZENFLOW_WITH_CUDA)
    cudaDeviceProp properties;
    const cudaError_t error = cudaGetDeviceProperties(&properties, index);
    zf::require(error == cudaSuccess, ZF_ERROR_CUDA, "cudaGetDeviceProperties: ", cudaGetErrorString(error));
    std::strncpy(buf, properties.name, buf_size - 1);
    buf[buf_size - 1] = '\0';
#endif
  });
}

}  // extern "C"
