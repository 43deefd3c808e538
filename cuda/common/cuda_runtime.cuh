// The CUDA runtime behind the rules of cpp/src/common/cuda_rules.hpp. The two driver calls
// (the thread's current context, read and restored without creating one) are looked up
// through the runtime's entry-point query, so libzenflow does not link libcuda and still
// loads on a machine without a driver.
#pragma once

#include <cuda.h>  // CUcontext and CUresult only: the driver is reached through entry points
#include <cuda_runtime.h>

#include "common/cuda_rules.hpp"

namespace zf {
namespace cuda {

class CudaRuntime {
 public:
  using Status = cudaError_t;
  using Context = CUcontext;
  using Event = cudaEvent_t;
  static constexpr Status kSuccess = cudaSuccess;
  static constexpr Status kNotReady = cudaErrorNotReady;

  Status get_last_error() { return cudaGetLastError(); }
  Status event_query(Event event) { return cudaEventQuery(event); }
  Status current_context(Context* context) {
    const Driver& d = driver();
    if (d.get_current == nullptr) return d.lookup_status;
    return d.get_current(context) == CUDA_SUCCESS ? cudaSuccess : cudaErrorDeviceUninitialized;
  }
  Status get_device(int* device) { return cudaGetDevice(device); }
  Status set_device(int device) { return cudaSetDevice(device); }
  Status set_current_context(Context context) {
    const Driver& d = driver();
    if (d.set_current == nullptr) return d.lookup_status;
    return d.set_current(context) == CUDA_SUCCESS ? cudaSuccess : cudaErrorDeviceUninitialized;
  }
  Status relax_capture_mode() {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    return cudaThreadExchangeStreamCaptureMode(&mode);
  }

 private:
  struct Driver {
    CUresult (*get_current)(CUcontext*) = nullptr;
    CUresult (*set_current)(CUcontext) = nullptr;
    Status lookup_status = cudaSuccess;
  };
  static const Driver& driver() {
    static const Driver loaded = [] {
      Driver d;
      void* get = nullptr;
      void* set = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
      d.lookup_status = cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &found);
      if (d.lookup_status == cudaSuccess && found == cudaDriverEntryPointSuccess) {
        d.lookup_status = cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &found);
      }
      if (d.lookup_status == cudaSuccess && found != cudaDriverEntryPointSuccess)
        d.lookup_status = cudaErrorSymbolNotFound;
      if (d.lookup_status == cudaSuccess) {
        d.get_current = reinterpret_cast<CUresult (*)(CUcontext*)>(get);
        d.set_current = reinterpret_cast<CUresult (*)(CUcontext)>(set);
      }
      return d;
    }();
    return loaded;
  }
};

inline CudaRuntime& runtime() {
  static CudaRuntime instance;
  return instance;
}

}  // namespace cuda
}  // namespace zf
