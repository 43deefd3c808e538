// The engine's backend interface (docs/design.md section 7): the device ops of the compute
// lane, the down / up / device copies, the events that order the lanes, and the memory.
// The state machine (engine.cpp, step.cpp, selection.cpp, checkpoint.cpp) reaches device
// memory only through this interface, and orders every hand-over between lanes with an
// explicit record / wait, so one state machine runs on every backend:
//
//   HostBackend   the "device" is the CPU: every call completes before it returns, events
//                 are always complete (nullptr), device memory is host memory.
//   CudaBackend   compute on the caller's stream, copies on two streams of the engine's,
//                 data parallel's in-backward reductions on a third, events are CUDA events
//                 (cuda_backend.cpp; CUDA builds only).
//   the simulated asynchronous backend of the tests, which runs each lane's work lazily and
//   in a random interleaving, so a missing record / wait changes the results.
//
// Work on one lane runs in the order it is enqueued; work on two lanes is unordered unless an
// event orders it. Host memory given to copy_down / copy_up must stay untouched until the
// copy's event completes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/step_scalars.hpp"
#include "common/thread_pool.hpp"
#include "ops/adamw_selected_plan.hpp"
#include "ops/column_stats_plan.hpp"
#include "ops/pack_plan.hpp"
#include "zenflow/optim.h"

namespace zf {

// A point on a lane: complete once everything enqueued on the lane before it has completed.
// nullptr is an event that is already complete.
class BackendEvent {
 public:
  virtual ~BackendEvent() = default;
};
using Event = std::shared_ptr<BackendEvent>;

// kReduce: data parallel's gradient reductions during backward (Backend::compute_on).
enum class Lane { kCompute = 0, kDown = 1, kUp = 2, kReduce = 3 };

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- compute lane ----
  // Device workspace column_stats needs for these shapes (the gradients have the parameters').
  virtual size_t column_stats_workspace_bytes(const zf_tensor* params, size_t count) = 0;
  // col_sq[i] <- column sums of squares of grads[i]; *nonfinite <- 1 if an element is Inf or
  // NaN, else 0; *total_sq <- the pass's total (unused by the engine: see step_scalars).
  virtual void column_stats(ColumnStatsPlan& plan, const zf_tensor* grads, const zf_tensor* col_sq, float* total_sq,
                            int32_t* nonfinite, void* workspace, size_t workspace_bytes) = 0;
  // The step's scalars (step_scalars.hpp): total_sq from the `columns` column sums at col_sq
  // (chunk_sums: scratch of column_chunks(columns) doubles), nonfinite from the OR of
  // flags[0, flag_count), then the gradient scale and the skip flag.
  virtual void step_scalars(StepScalars* scalars, const float* col_sq, int64_t columns, const int32_t* flags,
                            int64_t flag_count, double* chunk_sums, double loss_scale, double max_grad_norm) = 0;
  // An engine of a group over several devices (engine_group.hpp) forms the step's scalars in
  // two parts: its own partial (the total and the flags of its parameters, as step_scalars
  // sums them), then, once every device's partial has been copied in, the scalars from all
  // `count` partials in device order (combine_scalar_partials).
  virtual void scalar_partial(ScalarPartial* partial, const float* col_sq, int64_t columns, const int32_t* flags,
                              int64_t flag_count, double* chunk_sums) = 0;
  virtual void combine_scalars(StepScalars* scalars, const ScalarPartial* partials, int64_t count, double loss_scale,
                               double max_grad_norm) = 0;
  // AdamW of the selected columns and the dense parameters; reads scalars->grad_scale and
  // does nothing when scalars->skip is set. pointers[i].selected is device memory.
  virtual void adamw_selected(AdamwSelectedPlan& plan, const AdamwSelectedPointers* pointers,
                              const StepScalars* scalars) = 0;
  // packed <- raw G[:, unselected] (matrices: the gradients), or W[:, unselected] <- packed
  // (matrices: the parameters). selected[i]: device memory, nullptr when k_i == 0.
  virtual void pack(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected, void* packed) = 0;
  virtual void scatter(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected,
                       const void* packed) = 0;
  virtual void copy_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_device_zero(void* device, size_t bytes) = 0;
  // dst (this backend's device memory) <- src (device memory of `source`, the backend of
  // another device of the group), on this compute lane.
  virtual void copy_from_peer(void* dst, const Backend& source, const void* src, size_t bytes) = 0;

  // ---- copy lanes ----
  virtual void copy_down(void* host, const void* device, size_t bytes) = 0;  // down lane
  virtual void copy_up(void* device, const void* host, size_t bytes) = 0;    // up lane

  // ---- events ----
  virtual Event record(Lane lane) = 0;
  // The lane waits; the caller does not. The event may be another device's (a group's
  // exchange of the step's scalars).
  virtual void wait(Lane lane, const Event& event) = 0;
  // Blocks the calling thread (training thread or host lane) until the event completes;
  // throws zf::Error with the device's error text if the device failed.
  virtual void host_wait(const Event& event) = 0;
  virtual bool done(const Event& event) = 0;
  virtual void synchronize() = 0;  // every lane of the backend (the host lane excluded)
  // Called once on each thread the engine owns (its host lane), before the thread's first
  // call into the backend: the CUDA backend selects its device there for the thread's life
  // and relaxes the thread's stream-capture mode (cpp/src/common/cuda_rules.hpp).
  virtual void bind_engine_thread() {}
  // Whether `stream` is capturing a CUDA graph (or, for the legacy default stream, whether
  // using it would join another stream's capture). Engine calls refuse to run then.
  virtual bool capturing(zf_stream /*stream*/) { return false; }

  // ---- memory and placement ----
  // true: device memory is host memory (the host backend); the engine reads it in place.
  virtual bool host_visible() const = 0;
  // The compute lane: the caller's stream (CUDA); the host backend accepts only nullptr.
  virtual void set_stream(zf_stream stream) = 0;
  // The compute lane's stream, given to the collectives (data parallel); nullptr on the host.
  virtual zf_stream compute_stream() const { return nullptr; }
  // Data parallel reduces each bucket's gradients while backward goes on (step.cpp): with
  // Lane::kReduce, every compute-lane op, compute_stream() and record / wait of kCompute run
  // on the reduction lane, until compute_on(Lane::kCompute). The caller's stream is then free
  // for the rest of the backward; the engine orders the two lanes with events.
  virtual void compute_on(Lane lane) { (void)lane; }
  virtual void* allocate_device(size_t bytes) = 0;           // when the caller attaches none
  virtual void free_device(void* memory, size_t bytes) = 0;  // bytes: as allocated
  // Host memory a copy lane reads or writes (page-locked on CUDA).
  virtual void* allocate_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* memory, size_t bytes) = 0;
  // Host-side work of the compute lane's thread (top-k, the exchange, initialisation).
  virtual ThreadPool& host_pool() = 0;
  virtual zf_device device() const = 0;
};

// Host memory from Backend::allocate_pinned, freed with it.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(Backend* backend, size_t bytes)
      : backend_(backend),
        data_(bytes > 0 ? static_cast<uint8_t*>(backend->allocate_pinned(bytes)) : nullptr),
        bytes_(bytes) {}
  ~PinnedBuffer() {
    if (data_ != nullptr) backend_->free_pinned(data_, bytes_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& other) noexcept { swap(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    PinnedBuffer moved(std::move(other));
    swap(moved);
    return *this;
  }
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void swap(PinnedBuffer& other) noexcept {
    std::swap(backend_, other.backend_);
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }
  Backend* backend_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// The CUDA backend for `device`, in a build with CUDA (NOT_SUPPORTED otherwise).
std::unique_ptr<Backend> make_cuda_backend(int device, int host_threads);

}  // namespace zf
