#include "engine/host_backend.hpp"

#include <cstring>

#include "common/error.hpp"
#include "common/host_memory.hpp"

namespace zf {

HostBackend::HostBackend(int compute_threads) : pool_(compute_threads) {}

void HostBackend::column_stats(ColumnStatsPlan& plan, const zf_tensor* grads, const zf_tensor* col_sq, float* total_sq,
                               int32_t* nonfinite, void*, size_t) {
  inputs_.resize(plan.size());
  col_sq_.resize(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    inputs_[i] = grads[i].data;
    col_sq_[i] = static_cast<float*>(col_sq[i].data);
  }
  plan.run(pool_, inputs_.data(), col_sq_.data(), total_sq, nonfinite, false);
}

void HostBackend::step_scalars(StepScalars* scalars, const float* col_sq, int64_t columns, const int32_t* flags,
                               int64_t flag_count, double* chunk_sums, double loss_scale, double max_grad_norm) {
  // One partial combined alone: 0 + total is the total, so the bits are a group's of one.
  ScalarPartial partial{};
  scalar_partial(&partial, col_sq, columns, flags, flag_count, chunk_sums);
  combine_scalars(scalars, &partial, 1, loss_scale, max_grad_norm);
}

void HostBackend::scalar_partial(ScalarPartial* partial, const float* col_sq, int64_t columns, const int32_t* flags,
                                 int64_t flag_count, double*) {
  double total = 0.0;
  for (int64_t c = 0; c < column_chunks(columns); ++c) total += column_chunk_sum(col_sq, columns, c);
  int32_t nonfinite = 0;
  for (int64_t f = 0; f < flag_count; ++f) nonfinite |= flags[f] != 0 ? 1 : 0;
  partial->total_sq = total;
  partial->nonfinite = nonfinite;
}

void HostBackend::combine_scalars(StepScalars* scalars, const ScalarPartial* partials, int64_t count, double loss_scale,
                                  double max_grad_norm) {
  combine_scalar_partials(scalars, partials, count);
  compute_step_scalars(scalars, loss_scale, max_grad_norm);
}

void HostBackend::adamw_selected(AdamwSelectedPlan& plan, const AdamwSelectedPointers* pointers,
                                 const StepScalars* scalars) {
  if (scalars->skip) return;
  plan.run(pool_, pointers, scalars->grad_scale);
}

void HostBackend::pack(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected, void* packed) {
  const size_t count = plan.layout().size();
  outputs_.resize(count);
  for (size_t i = 0; i < count; ++i) outputs_[i] = matrices[i].data;
  plan.run(pool_, outputs_.data(), selected, packed, 1.0f, true);
}

void HostBackend::scatter(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected,
                          const void* packed) {
  const size_t count = plan.layout().size();
  outputs_.resize(count);
  for (size_t i = 0; i < count; ++i) outputs_[i] = matrices[i].data;
  plan.run(pool_, outputs_.data(), selected, const_cast<void*>(packed), 1.0f, false);
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

void HostBackend::set_stream(zf_stream stream) {
  require(stream == nullptr, ZF_ERROR_INVALID_VALUE,
          "stream: the engine's parameters are CPU tensors (host backend), which has no streams; pass NULL");
}

namespace {
// The "device" memory of the host backend is the host lane's (its staging slots and upload
// copies are read in place): streamed memory (common/host_memory.hpp), 256-byte aligned as
// CUDA's allocations are, with 256 bytes of slack past the end.
constexpr size_t kDeviceAlignment = 256;
size_t arena_allocation_bytes(size_t bytes) {
  return (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment + kDeviceAlignment;
}
}  // namespace

void* HostBackend::allocate_device(size_t bytes) {
  return allocate_streamed(arena_allocation_bytes(bytes), kDeviceAlignment);
}

void HostBackend::free_device(void* memory, size_t bytes) {
  free_streamed(memory, arena_allocation_bytes(bytes), kDeviceAlignment);
}

}  // namespace zf
