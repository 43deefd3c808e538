// The host backend: the "device" is the CPU. Device ops are the host twins of the kernels,
// run on the calling (training) thread and the engine's compute pool, which is separate from
// the host lane's pool, so a window update on the host lane never delays them. Copies are
// memcpy on the calling thread; every call is complete when it returns.
#pragma once

#include <memory>

#include "common/thread_pool.hpp"
#include "engine/backend.hpp"

namespace zf {

class HostBackend final : public Backend {
 public:
  explicit HostBackend(int compute_threads);

  void column_stats(ColumnStatsPlan& plan, const void* const* grads, float* const* col_sq, float* total_sq,
                    int32_t* nonfinite) override;
  void select_topk(const SelectTopkPlan& plan, const float* const* scores, int32_t* const* indices) override;
  void adamw_selected(AdamwSelectedPlan& plan, const AdamwSelectedPointers* pointers, float grad_scale) override;
  void pack(const PackPlan& plan, void* const* grads, const int32_t* const* selected, void* packed) override;
  void scatter(const PackPlan& plan, void* const* params, const int32_t* const* selected, const void* packed) override;
  void exchange(const zf_tensor& old_selected, const zf_tensor& new_selected, const zf_column_state& old_state,
                const zf_column_state& new_state, const zf_column_state& entering,
                const zf_column_state& leaving) override;
  void copy_down(void* host, const void* device, size_t bytes) override;
  void copy_up(void* device, const void* host, size_t bytes) override;
  void copy_device(void* dst, const void* src, size_t bytes) override;
  void fill_device_zero(void* device, size_t bytes) override;
  void synchronize() override {}
  void* allocate_device(size_t bytes) override;
  void free_device(void* memory) override;
  zf_device device() const override { return zf_device{ZF_DEVICE_CPU, 0}; }

  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool pool_;
};

}  // namespace zf
