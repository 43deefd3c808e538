// The engine's backend interface (docs/design.md section 7): the "device" ops of the compute
// lane, the down / up / device copies, and the device memory. The state machine
// (engine.cpp) calls only this interface for device-side work, so a CUDA backend (streams,
// events, pinned buffers) is added beside the host backend without touching it.
//
// Lanes and ordering. On the host backend every call completes before it returns (compute
// runs on the calling thread and the compute pool, copies are memcpy), so the events of
// the CUDA design (slot packed -> copied down, upload copied -> scattered) are complete as
// soon as they are recorded; the host lane's completion flags (WorkJob) order the rest.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/adamw_selected_plan.hpp"
#include "ops/column_stats_plan.hpp"
#include "ops/pack_plan.hpp"
#include "ops/select_topk_plan.hpp"
#include "zenflow/optim.h"

namespace zf {

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- compute lane ----
  // Statistics of this step's raw gradients; *total_sq and *nonfinite are read by the
  // host right after (on CUDA: after the small copy of the two scalars).
  virtual void column_stats(ColumnStatsPlan& plan, const void* const* grads, float* const* col_sq, float* total_sq,
                            int32_t* nonfinite) = 0;
  virtual void select_topk(const SelectTopkPlan& plan, const float* const* scores, int32_t* const* indices) = 0;
  virtual void adamw_selected(AdamwSelectedPlan& plan, const AdamwSelectedPointers* pointers, float grad_scale) = 0;
  // packed <- raw G[:, unselected] (the host lane applies the scale); params[:, unselected] <- packed.
  virtual void pack(const PackPlan& plan, void* const* grads, const int32_t* const* selected, void* packed) = 0;
  virtual void scatter(const PackPlan& plan, void* const* params, const int32_t* const* selected,
                       const void* packed) = 0;
  // The device side of a selection change, one matrix (zf_exchange_selected_columns).
  virtual void exchange(const zf_tensor& old_selected, const zf_tensor& new_selected, const zf_column_state& old_state,
                        const zf_column_state& new_state, const zf_column_state& entering,
                        const zf_column_state& leaving) = 0;

  // ---- copies ----
  virtual void copy_down(void* host, const void* device, size_t bytes) = 0;  // down lane
  virtual void copy_up(void* device, const void* host, size_t bytes) = 0;    // up lane
  virtual void copy_device(void* dst, const void* src, size_t bytes) = 0;    // compute lane
  virtual void fill_device_zero(void* device, size_t bytes) = 0;
  // Waits for every lane of the backend (the host lane excluded).
  virtual void synchronize() = 0;

  // ---- memory ----
  // Device memory of `bytes` owned by the backend, for callers that attach none (host
  // backend only; the CUDA backend requires the caller's).
  virtual void* allocate_device(size_t bytes) = 0;
  virtual void free_device(void* memory) = 0;
  virtual zf_device device() const = 0;
};

}  // namespace zf
