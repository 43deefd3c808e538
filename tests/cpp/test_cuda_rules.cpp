// The CUDA runtime rules of cpp/src/common/cuda_rules.hpp, checked on the CPU against a
// model of the parts of the CUDA runtime they touch (one thread's view): the thread's last
// error, which a "not ready" query answer sets; the thread's current context; and primary
// contexts, which cudaSetDevice and any runtime call made with no context create. The
// models of the two defects the rules exist for are checked too, so the model is known to
// reproduce them.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "common/cuda_rules.hpp"

namespace {

class ModelRuntime {
 public:
  using Status = int;
  using Context = const int*;  // a device's primary context: the address of its number
  using Event = int;
  static constexpr Status kSuccess = 0;
  static constexpr Status kNotReady = 600;        // cudaErrorNotReady
  static constexpr Status kInvalidDevice = 101;   // cudaErrorInvalidDevice
  static constexpr Status kIllegalAddress = 700;  // a device fault, sticky

  static constexpr int kDevices = 4;

  // ---- the runtime's calls ----
  Status get_last_error() {
    const Status status = last_error_;
    last_error_ = kSuccess;
    return status;
  }
  Status event_query(Event event) {
    use_context();
    const Status status = event_state_[event];
    if (status != kSuccess) last_error_ = status;
    return status;
  }
  Status current_context(Context* context) {
    *context = current_;
    return kSuccess;
  }
  Status get_device(int* device) {
    *device = current_ != nullptr ? *current_ : selected_;
    return kSuccess;
  }
  Status set_device(int device) {
    ++set_device_calls;
    if (device < 0 || device >= kDevices) {
      last_error_ = kInvalidDevice;
      return kInvalidDevice;
    }
    contexts_created.insert(device);  // CUDA 12 and later: cudaSetDevice initialises it
    selected_ = device;
    current_ = &kDeviceNumbers[device];
    return kSuccess;
  }
  Status set_current_context(Context context) {
    current_ = context;
    return kSuccess;
  }
  Status relax_capture_mode() {
    capture_mode_relaxed = true;
    return kSuccess;
  }

  // ---- what the tests do and look at ----
  // A launch or any other runtime call: in the current context, or, with none, in the
  // primary context of the selected device (device 0 on a new thread), created on the spot.
  void launch(Status outcome = kSuccess) {
    use_context();
    if (outcome != kSuccess) last_error_ = outcome;
  }
  void complete(Event event) { event_state_[event] = kSuccess; }
  void start(Event event) { event_state_[event] = kNotReady; }
  void fail(Event event, Status status) { event_state_[event] = status; }
  Context current() const { return current_; }
  static Context context_of(int device) { return &kDeviceNumbers[device]; }

  std::set<int> contexts_created;
  int set_device_calls = 0;
  bool capture_mode_relaxed = false;

 private:
  void use_context() {
    if (current_ != nullptr) return;
    contexts_created.insert(selected_);
    current_ = &kDeviceNumbers[selected_];
  }

  static constexpr int kDeviceNumbers[kDevices] = {0, 1, 2, 3};
  Context current_ = nullptr;  // a new thread has none
  int selected_ = 0;
  Status last_error_ = kSuccess;
  std::map<Event, Status> event_state_;
};

using Scope = zf::BasicDeviceScope<ModelRuntime>;

// ---- the device scope ----

TEST(CudaRules, AScopeOnAThreadWithoutContextCreatesOnlyItsDevicesAndLeavesNone) {
  ModelRuntime runtime;
  {
    const Scope scope(runtime, 2);
    EXPECT_EQ(scope.status(), ModelRuntime::kSuccess);
    EXPECT_EQ(runtime.current(), ModelRuntime::context_of(2));
    runtime.launch();
  }
  EXPECT_EQ(runtime.current(), nullptr);
  EXPECT_EQ(runtime.contexts_created, std::set<int>({2}));
}

TEST(CudaRules, AScopeGivesTheCallerItsOwnContextBack) {
  ModelRuntime runtime;
  ASSERT_EQ(runtime.set_device(1), ModelRuntime::kSuccess);  // the framework works on GPU 1
  {
    const Scope scope(runtime, 3);
    EXPECT_EQ(runtime.current(), ModelRuntime::context_of(3));
    const Scope nested(runtime, 0);
    EXPECT_EQ(runtime.current(), ModelRuntime::context_of(0));
  }
  EXPECT_EQ(runtime.current(), ModelRuntime::context_of(1));
  EXPECT_EQ(runtime.contexts_created, std::set<int>({0, 1, 3}));
}

TEST(CudaRules, AScopeOnTheCurrentDeviceChangesNothing) {
  ModelRuntime runtime;
  ASSERT_EQ(runtime.set_device(2), ModelRuntime::kSuccess);
  const int calls = runtime.set_device_calls;
  {
    const Scope scope(runtime, 2);
    EXPECT_EQ(scope.status(), ModelRuntime::kSuccess);
  }
  EXPECT_EQ(runtime.set_device_calls, calls);
  EXPECT_EQ(runtime.current(), ModelRuntime::context_of(2));
}

TEST(CudaRules, AScopeThatCannotSelectItsDeviceChangesNothing) {
  ModelRuntime runtime;
  ASSERT_EQ(runtime.set_device(1), ModelRuntime::kSuccess);
  {
    const Scope scope(runtime, 7);
    EXPECT_EQ(scope.status(), ModelRuntime::kInvalidDevice);
  }
  EXPECT_EQ(runtime.current(), ModelRuntime::context_of(1));
  EXPECT_EQ(runtime.contexts_created, std::set<int>({1}));
}

// The rule before 2026-12-05, on this model: "remember cudaGetDevice, select, select the
// remembered device again" creates GPU 0's context on every thread that had none.
TEST(CudaRules, TheModelReproducesTheContextOnGpuZeroOfRestoringByDevice) {
  ModelRuntime runtime;
  int previous = -1;
  runtime.get_device(&previous);
  runtime.set_device(2);
  runtime.launch();
  runtime.set_device(previous);
  EXPECT_EQ(runtime.contexts_created, std::set<int>({0, 2}));
}

// ---- event queries and launch checks ----

TEST(CudaRules, ANotReadyQueryIsNotLeftForTheNextLaunchCheck) {
  ModelRuntime runtime;
  const Scope scope(runtime, 0);
  runtime.start(5);
  bool complete = true;
  EXPECT_EQ(zf::query_event(runtime, 5, &complete), ModelRuntime::kSuccess);
  EXPECT_FALSE(complete);
  runtime.launch();
  EXPECT_EQ(zf::launch_status(runtime), ModelRuntime::kSuccess);
  runtime.complete(5);
  EXPECT_EQ(zf::query_event(runtime, 5, &complete), ModelRuntime::kSuccess);
  EXPECT_TRUE(complete);
}

// The defect the rule fixes, on this model: a raw query's "not ready" is what the next
// launch check reads as the launch's failure.
TEST(CudaRules, TheModelReproducesTheNotReadyLaunchFailureOfARawQuery) {
  ModelRuntime runtime;
  const Scope scope(runtime, 0);
  runtime.start(5);
  EXPECT_EQ(runtime.event_query(5), ModelRuntime::kNotReady);
  runtime.launch();
  EXPECT_EQ(runtime.get_last_error(), ModelRuntime::kNotReady);
}

TEST(CudaRules, ALaunchCheckIgnoresAStaleNotReadyButReportsARealFailure) {
  ModelRuntime runtime;
  const Scope scope(runtime, 0);
  runtime.start(1);
  runtime.event_query(1);  // someone else's query, not cleared
  runtime.launch();
  EXPECT_EQ(zf::launch_status(runtime), ModelRuntime::kSuccess);
  runtime.launch(ModelRuntime::kIllegalAddress);
  EXPECT_EQ(zf::launch_status(runtime), ModelRuntime::kIllegalAddress);
}

TEST(CudaRules, AFailedEventIsReportedByTheQuery) {
  ModelRuntime runtime;
  const Scope scope(runtime, 0);
  runtime.fail(3, ModelRuntime::kIllegalAddress);
  bool complete = true;
  EXPECT_EQ(zf::query_event(runtime, 3, &complete), ModelRuntime::kIllegalAddress);
  EXPECT_FALSE(complete);
}

// ---- engine threads ----

TEST(CudaRules, AnEngineThreadBindsItsDeviceOnceAndWaitsWithoutTouchingGpuZero) {
  ModelRuntime runtime;  // the host lane's new thread: no context
  EXPECT_EQ(zf::bind_engine_thread(runtime, 3), ModelRuntime::kSuccess);
  EXPECT_TRUE(runtime.capture_mode_relaxed);
  runtime.start(8);
  bool complete = true;
  for (int wait = 0; wait < 3; ++wait) {
    const Scope scope(runtime, 3);  // each wait's scope: nothing to do on a bound thread
    EXPECT_EQ(zf::query_event(runtime, 8, &complete), ModelRuntime::kSuccess);
  }
  EXPECT_EQ(runtime.set_device_calls, 1);
  EXPECT_EQ(runtime.contexts_created, std::set<int>({3}));
}

// Without the binding, the first wait on a new thread lands on GPU 0.
TEST(CudaRules, TheModelReproducesTheContextOnGpuZeroOfAnUnboundWait) {
  ModelRuntime runtime;
  runtime.start(8);
  runtime.event_query(8);
  EXPECT_EQ(runtime.contexts_created, std::set<int>({0}));
}

TEST(CudaRules, BindingAnEngineThreadToAMissingDeviceFails) {
  ModelRuntime runtime;
  EXPECT_EQ(zf::bind_engine_thread(runtime, 9), ModelRuntime::kInvalidDevice);
  EXPECT_FALSE(runtime.capture_mode_relaxed);
  EXPECT_TRUE(runtime.contexts_created.empty());
}

}  // namespace
