// CUDA error handling for the launchers: a failed runtime call becomes a zf::Error
// (ZF_ERROR_CUDA) that the C boundary turns into a status and message.
#pragma once

#include <cuda_runtime.h>

#include "common/error.hpp"

namespace zf {
namespace cuda {

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) fail(ZF_ERROR_CUDA, what, ": ", cudaGetErrorString(error));
}

// After a launch: reports a bad configuration or a sticky error from earlier work.
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

// Makes `device` current for the launcher's lifetime and restores the caller's device:
// a library call must not change which GPU the framework's next call lands on.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~ScopedDevice() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
};

inline size_t align_up(size_t bytes, size_t alignment = 256) { return (bytes + alignment - 1) / alignment * alignment; }

}  // namespace cuda
}  // namespace zf
