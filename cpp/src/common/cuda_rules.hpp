// The rules every CUDA runtime call of libzenflow follows, written once against a small
// interface so that they can be tested on the CPU against a model of the CUDA runtime
// (tests/cpp/test_cuda_rules.cpp). cuda/common/cuda_runtime.cuh is the real runtime; no
// CUDA header is needed here.
//
// Why each rule exists:
//  * A "not ready" answer is not an error, but the runtime stores it as the thread's last
//    error. Left there, the next launch check (cudaGetLastError after a launch) reports it
//    as the launch's failure ("device not ready"). A query therefore clears it at once, and
//    a launch check never takes it for a failure.
//  * A library call must leave the caller's thread as it found it, and must not create a
//    CUDA context anywhere but on the device it works on. cudaSetDevice creates the primary
//    context of its device (CUDA 12 and later), so restoring "the previous device" with it
//    creates one on GPU 0 for every thread that had none (about 0.5 GB per process on an
//    8-GPU node). The scope therefore saves the driver's current context (possibly none)
//    and puts exactly that back.
//  * Threads the engine owns (its host lane) select their device once, and use the
//    thread-local stream-capture mode: their waits (cudaEventSynchronize) then never
//    invalidate a CUDA graph that the caller captures on another thread in global mode.
//
// Runtime is a class with these members:
//   using Status, Context, Event;
//   static constexpr Status kSuccess, kNotReady;
//   Status get_last_error();                 cudaGetLastError: returns and clears it
//   Status event_query(Event);               cudaEventQuery
//   Status current_context(Context*);        cuCtxGetCurrent: the thread's context, or none
//                                            (a null Context); never creates one
//   Status get_device(int*);                 cudaGetDevice (the current context's device)
//   Status set_device(int);                  cudaSetDevice: makes the device's primary
//                                            context current, creating it if needed
//   Status set_current_context(Context);     cuCtxSetCurrent (null: none)
//   Status relax_capture_mode();             cudaThreadExchangeStreamCaptureMode(relaxed)
#pragma once

namespace zf {

// The status of a launch just made: the thread's last error, where "not ready" (a query's
// answer left behind by code that did not clear it) is no failure of the launch.
template <class Runtime>
typename Runtime::Status launch_status(Runtime& runtime) {
  const typename Runtime::Status status = runtime.get_last_error();
  return status == Runtime::kNotReady ? Runtime::kSuccess : status;
}

// Whether `event` has completed; a "not ready" answer is cleared from the last error.
// Returns the query's failure (a device error), else kSuccess.
template <class Runtime>
typename Runtime::Status query_event(Runtime& runtime, typename Runtime::Event event, bool* complete) {
  const typename Runtime::Status status = runtime.event_query(event);
  *complete = status == Runtime::kSuccess;
  if (status == Runtime::kNotReady) {
    runtime.get_last_error();
    return Runtime::kSuccess;
  }
  return status;
}

// Makes `device` current on this thread for the scope's lifetime, then puts the thread's
// own context (or none) back. Creates a context on `device` only, and only when the thread
// was not already on it.
template <class Runtime>
class BasicDeviceScope {
 public:
  BasicDeviceScope(Runtime& runtime, int device) : runtime_(runtime) {
    typename Runtime::Context context{};
    status_ = runtime.current_context(&context);
    if (status_ != Runtime::kSuccess) return;
    if (context != typename Runtime::Context{}) {
      int current = -1;
      status_ = runtime.get_device(&current);
      if (status_ != Runtime::kSuccess || current == device) return;
    }
    saved_ = context;
    status_ = runtime.set_device(device);
    changed_ = status_ == Runtime::kSuccess;
  }
  ~BasicDeviceScope() {
    if (changed_) runtime_.set_current_context(saved_);
  }
  BasicDeviceScope(const BasicDeviceScope&) = delete;
  BasicDeviceScope& operator=(const BasicDeviceScope&) = delete;

  // kSuccess when `device` is current; otherwise the failed call's status (nothing changed).
  typename Runtime::Status status() const { return status_; }

 private:
  Runtime& runtime_;
  typename Runtime::Context saved_{};
  typename Runtime::Status status_ = Runtime::kSuccess;
  bool changed_ = false;
};

// Once, on a thread the engine owns, before its first CUDA call: `device` stays current
// for the thread's life, and the thread's capture mode is relaxed.
template <class Runtime>
typename Runtime::Status bind_engine_thread(Runtime& runtime, int device) {
  const typename Runtime::Status status = runtime.set_device(device);
  if (status != Runtime::kSuccess) return status;
  return runtime.relax_capture_mode();
}

}  // namespace zf
