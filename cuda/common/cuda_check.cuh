// CUDA error handling for the launchers: a failed runtime call becomes a zf::Error
// (ZF_ERROR_CUDA) that the C boundary turns into a status and message. The rules behind
// the launch check and the device scope are in cpp/src/common/cuda_rules.hpp.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_rules.hpp"
#include "common/error.hpp"
#include "cuda/common/cuda_runtime.cuh"

namespace zf {
namespace cuda {

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) fail(ZF_ERROR_CUDA, what, ": ", cudaGetErrorString(error));
}

// After a launch: reports a bad configuration or a sticky error from earlier work (never a
// query's "not ready" left behind as the last error).
inline void check_launch(const char* kernel) { check_cuda(launch_status(runtime()), kernel); }

// Makes `device` current for the launcher's lifetime and gives the caller's thread back its
// own context (or none): a library call must not change which GPU the framework's next call
// lands on, nor create a context on a device it does not use.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : scope_(runtime(), device) { check_cuda(scope_.status(), "cudaSetDevice"); }

 private:
  BasicDeviceScope<CudaRuntime> scope_;
};

// For destructors and frees, which must not throw (a failed device must not end the
// process): the same scope, its failure ignored.
class ScopedDeviceNoThrow {
 public:
  explicit ScopedDeviceNoThrow(int device) : scope_(runtime(), device) {}

 private:
  BasicDeviceScope<CudaRuntime> scope_;
};

inline size_t align_up(size_t bytes, size_t alignment = 256) { return (bytes + alignment - 1) / alignment * alignment; }

}  // namespace cuda
}  // namespace zf
