#include "engine/host_backend.hpp"

#include <cstdlib>
#include <cstring>
#include <new>

#include "common/error.hpp"
#include "zenflow/pack.h"

namespace zf {

HostBackend::HostBackend(int compute_threads) : pool_(compute_threads) {}

void HostBackend::column_stats(ColumnStatsPlan& plan, const void* const* grads, float* const* col_sq, float* total_sq,
                               int32_t* nonfinite) {
  plan.run(pool_, grads, col_sq, total_sq, nonfinite, false);
}

void HostBackend::select_topk(const SelectTopkPlan& plan, const float* const* scores, int32_t* const* indices) {
  plan.run(pool_, scores, indices);
}

void HostBackend::adamw_selected(AdamwSelectedPlan& plan, const AdamwSelectedPointers* pointers, float grad_scale) {
  plan.run(pool_, pointers, grad_scale);
}

void HostBackend::pack(const PackPlan& plan, void* const* grads, const int32_t* const* selected, void* packed) {
  plan.run(pool_, grads, selected, packed, 1.0f, true);
}

void HostBackend::scatter(const PackPlan& plan, void* const* params, const int32_t* const* selected,
                          const void* packed) {
  plan.run(pool_, params, selected, const_cast<void*>(packed), 1.0f, false);
}

void HostBackend::exchange(const zf_tensor& old_selected, const zf_tensor& new_selected,
                           const zf_column_state& old_state, const zf_column_state& new_state,
                           const zf_column_state& entering, const zf_column_state& leaving) {
  const zf_status status = zf_exchange_selected_columns(&old_selected, &new_selected, &old_state, &new_state, &entering,
                                                        &leaving, 1, nullptr, nullptr, nullptr);
  if (status != ZF_SUCCESS) fail(status, "selection exchange: ", zf_last_error());
}

void HostBackend::copy_down(void* host, const void* device, size_t bytes) {
  if (bytes > 0) std::memcpy(host, device, bytes);
}

void HostBackend::copy_up(void* device, const void* host, size_t bytes) {
  if (bytes > 0) std::memcpy(device, host, bytes);
}

void HostBackend::copy_device(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void HostBackend::fill_device_zero(void* device, size_t bytes) {
  if (bytes > 0) std::memset(device, 0, bytes);
}

void* HostBackend::allocate_device(size_t bytes) {
  void* memory = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (memory == nullptr) throw std::bad_alloc();
  return memory;
}

void HostBackend::free_device(void* memory) { std::free(memory); }

}  // namespace zf
