// The host backend: the "device" is the CPU. Device ops are the host twins of the kernels,
// run on the calling (training) thread and the engine's compute pool, which is separate from
// the host lane's pool, so a window update on the host lane never delays them. Copies are
// memcpy on the calling thread; every call is complete when it returns, so every event is
// complete (nullptr) and waits are no-ops.
#pragma once

#include "common/thread_pool.hpp"
#include "engine/backend.hpp"

namespace zf {

class HostBackend final : public Backend {
 public:
  explicit HostBackend(int compute_threads);

  size_t column_stats_workspace_bytes(const zf_tensor*, size_t) override { return 0; }
  void column_stats(ColumnStatsPlan& plan, const zf_tensor* grads, const zf_tensor* col_sq, float* total_sq,
                    int32_t* nonfinite, void* workspace, size_t workspace_bytes) override;
  void step_scalars(StepScalars* scalars, const float* col_sq, int64_t columns, const int32_t* flags,
                    int64_t flag_count, double* chunk_sums, double loss_scale, double max_grad_norm) override;
  void scalar_partial(ScalarPartial* partial, const float* col_sq, int64_t columns, const int32_t* flags,
                      int64_t flag_count, double* chunk_sums) override;
  void combine_scalars(StepScalars* scalars, const ScalarPartial* partials, int64_t count, double loss_scale,
                       double max_grad_norm) override;
  void adamw_selected(AdamwSelectedPlan& plan, const AdamwSelectedPointers* pointers,
                      const StepScalars* scalars) override;
  void pack(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected, void* packed) override;
  void scatter(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected,
               const void* packed) override;
  void copy_device(void* dst, const void* src, size_t bytes) override;
  void fill_device_zero(void* device, size_t bytes) override;
  void copy_from_peer(void* dst, const Backend&, const void* src, size_t bytes) override {
    copy_device(dst, src, bytes);
  }
  void copy_down(void* host, const void* device, size_t bytes) override;
  void copy_up(void* device, const void* host, size_t bytes) override;
  Event record(Lane) override { return nullptr; }
  void wait(Lane, const Event&) override {}
  void host_wait(const Event&) override {}
  bool done(const Event&) override { return true; }
  void synchronize() override {}
  bool host_visible() const override { return true; }
  void set_stream(zf_stream stream) override;
  void* allocate_device(size_t bytes) override;
  void free_device(void* memory, size_t bytes) override;
  void* allocate_pinned(size_t bytes) override { return allocate_device(bytes); }
  void free_pinned(void* memory, size_t bytes) override { free_device(memory, bytes); }
  ThreadPool& host_pool() override { return pool_; }
  zf_device device() const override { return zf_device{ZF_DEVICE_CPU, 0}; }

 private:
  ThreadPool pool_;
  std::vector<const void*> inputs_;
  std::vector<void*> outputs_;
  std::vector<float*> col_sq_;
};

}  // namespace zf
