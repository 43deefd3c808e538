// The engine's CUDA backend (docs/design.md section 7): the Backend interface on one device
// (an engine over several devices runs one backend per device: engine_group.hpp).
//
//   compute  the caller's stream (set_stream): statistics, the step scalars, the selected
//            AdamW, pack and scatter, device-to-device copies
//   down     a non-blocking stream of the backend's: staging slots and readbacks to the host
//   up       a second non-blocking stream: the upload buffer and state uploads
//   reduce   a third, made at its first use: data parallel's gradient reductions during
//            backward (compute_on), so that the caller's stream runs the rest of the backward
//
// Every hand-over between the lanes is a CUDA event the engine records and waits for
// (Backend::record / wait); the host lane waits for a slot's copy with cudaEventSynchronize
// on its own thread, never the training thread. That thread selects this backend's device
// once (bind_engine_thread) and uses the thread-local capture mode; every call of the
// training thread runs in a device scope that gives the caller's context back and creates
// none elsewhere (cpp/src/common/cuda_rules.hpp). Kernels are the ops' launchers (the
// cuda_ops() table); the only kernel of its own is the one-thread step-scalars kernel.
// Every call makes the backend's device current and restores the caller's.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/device_ops.hpp"
#include "common/error.hpp"
#include "common/matrix_view.hpp"
#include "common/step_scalars.hpp"
#include "common/tensor.hpp"
#include "cuda/common/cuda_check.cuh"
#include "engine/backend.hpp"

namespace zf {
namespace cuda {
namespace {

constexpr int kScalarThreads = 256;

// One block: the chunk sums in parallel, then thread 0 adds them in chunk order (the host's
// order exactly, step_scalars.hpp) into this device's partial.
__device__ void block_scalar_partial(ScalarPartial* partial, const float* col_sq, int64_t columns, const int32_t* flags,
                                     int64_t flag_count, double* chunk_sums) {
  const int64_t chunks = (columns + kTotalChunk - 1) / kTotalChunk;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) chunk_sums[c] = column_chunk_sum(col_sq, columns, c);
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) total = __dadd_rn(total, chunk_sums[c]);
  int32_t nonfinite = 0;
  for (int64_t f = 0; f < flag_count; ++f) nonfinite |= flags[f] != 0 ? 1 : 0;
  partial->total_sq = total;
  partial->nonfinite = nonfinite;
}

// One engine: its partial, combined alone (0 + total is the total: a group of one's bits).
__global__ void __launch_bounds__(kScalarThreads)
    step_scalars_kernel(StepScalars* scalars, const float* col_sq, int64_t columns, const int32_t* flags,
                        int64_t flag_count, double* chunk_sums, double loss_scale, double max_grad_norm) {
  __shared__ ScalarPartial partial;
  block_scalar_partial(&partial, col_sq, columns, flags, flag_count, chunk_sums);
  if (threadIdx.x != 0) return;
  combine_scalar_partials(scalars, &partial, 1);
  compute_step_scalars(scalars, loss_scale, max_grad_norm);
}

__global__ void __launch_bounds__(kScalarThreads)
    scalar_partial_kernel(ScalarPartial* partial, const float* col_sq, int64_t columns, const int32_t* flags,
                          int64_t flag_count, double* chunk_sums) {
  block_scalar_partial(partial, col_sq, columns, flags, flag_count, chunk_sums);
}

__global__ void combine_scalars_kernel(StepScalars* scalars, const ScalarPartial* partials, int64_t count,
                                       double loss_scale, double max_grad_norm) {
  combine_scalar_partials(scalars, partials, count);
  compute_step_scalars(scalars, loss_scale, max_grad_norm);
}

// Events come from a pool: a record reuses an event no one refers to any more instead of
// creating and destroying one per record (driver calls each). They use blocking
// synchronisation, so a thread waiting for one (the host lane for a slot's copy, the training
// thread in a flush) sleeps instead of spinning on a core the host AdamW needs. The pool
// lives as long as its last event: an event held by a queued host-lane job may outlive the
// backend's own reference.
class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool() {
    const ScopedDeviceNoThrow guard(device_);
    for (cudaEvent_t event : free_) cudaEventDestroy(event);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event for one record; back in the pool once the last reference is gone. The caller
  // has made the pool's device current.
  Event acquire();

 private:
  void release(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(event);
  }

  int device_;
  std::mutex mutex_;  // records on the training thread, releases on the host lane too
  std::vector<cudaEvent_t> free_;
};

class CudaEvent final : public BackendEvent {
 public:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_;
};

Event EventPool::acquire() {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      event = free_.back();
      free_.pop_back();
    }
  }
  if (event == nullptr) {
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync),
               "cudaEventCreateWithFlags");
  }
  std::shared_ptr<EventPool> pool = shared_from_this();
  return Event(new CudaEvent(event), [pool](BackendEvent* recorded) {
    pool->release(static_cast<CudaEvent*>(recorded)->get());
    delete recorded;
  });
}

// A contiguous descriptor on the device: [rows] when cols < 0, else [rows, cols].
zf_tensor device_tensor(const void* data, zf_dtype dtype, int device, int64_t rows, int64_t cols) {
  const zf_device where{ZF_DEVICE_CUDA, device};
  return cols < 0 ? contiguous_descriptor(data, dtype, where, {rows})
                  : contiguous_descriptor(data, dtype, where, {rows, cols});
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, int host_threads)
      : device_(device), events_(std::make_shared<EventPool>(device)), pool_(host_threads) {
    const ScopedDevice guard(device_);
    check_cuda(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags(down)");
    const cudaError_t status = cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking);
    if (status != cudaSuccess) cudaStreamDestroy(down_);  // the destructor will not run
    check_cuda(status, "cudaStreamCreateWithFlags(up)");
  }
  ~CudaBackend() override {
    const ScopedDeviceNoThrow guard(device_);
    cudaStreamDestroy(down_);
    cudaStreamDestroy(up_);
    if (reduce_ != nullptr) cudaStreamDestroy(reduce_);
  }

  size_t column_stats_workspace_bytes(const zf_tensor* params, size_t count) override {
    const std::vector<zf_tensor>& views = matrix_views(params, count);
    return cuda_ops().column_stats_workspace_bytes(views.data(), count);
  }

  void column_stats(ColumnStatsPlan& plan, const zf_tensor* grads, const zf_tensor* col_sq, float* total_sq,
                    int32_t* nonfinite, void* workspace, size_t workspace_bytes) override {
    // The launcher reads [rows, cols] descriptors (the op's validation reshapes for it):
    // a bias [n] is [1, n], a [5, 3, 4] weight is [5, 12].
    const std::vector<zf_tensor>& views = matrix_views(grads, plan.size());
    cuda_ops().column_stats(views.data(), col_sq, plan.size(), total_sq, nonfinite, device_, false, workspace,
                            workspace_bytes, ops_stream());
  }

  void step_scalars(StepScalars* scalars, const float* col_sq, int64_t columns, const int32_t* flags,
                    int64_t flag_count, double* chunk_sums, double loss_scale, double max_grad_norm) override {
    const ScopedDevice guard(device_);
    step_scalars_kernel<<<1, kScalarThreads, 0, stream(Lane::kCompute)>>>(scalars, col_sq, columns, flags, flag_count,
                                                                          chunk_sums, loss_scale, max_grad_norm);
    check_launch("step_scalars_kernel");
  }

  void scalar_partial(ScalarPartial* partial, const float* col_sq, int64_t columns, const int32_t* flags,
                      int64_t flag_count, double* chunk_sums) override {
    const ScopedDevice guard(device_);
    scalar_partial_kernel<<<1, kScalarThreads, 0, stream(Lane::kCompute)>>>(partial, col_sq, columns, flags, flag_count,
                                                                            chunk_sums);
    check_launch("scalar_partial_kernel");
  }

  void combine_scalars(StepScalars* scalars, const ScalarPartial* partials, int64_t count, double loss_scale,
                       double max_grad_norm) override {
    const ScopedDevice guard(device_);
    combine_scalars_kernel<<<1, 1, 0, stream(Lane::kCompute)>>>(scalars, partials, count, loss_scale, max_grad_norm);
    check_launch("combine_scalars_kernel");
  }

  void adamw_selected(AdamwSelectedPlan& plan, const AdamwSelectedPointers* pointers,
                      const StepScalars* scalars) override {
    const std::vector<AdamwSelectedMatrix>& matrices = plan.matrices();
    const size_t count = matrices.size();
    params_.resize(count);
    grads_.resize(count);
    selected_.resize(count);
    states_.resize(count);
    lr_.resize(count);
    weight_decay_.resize(count);
    grads_compact_.resize(count);
    for (size_t i = 0; i < count; ++i) {
      const AdamwSelectedMatrix& m = matrices[i];
      const AdamwSelectedPointers& p = pointers[i];
      grads_compact_[i] = p.grad_compact ? 1 : 0;
      params_[i] = device_tensor(p.param, m.param_dtype, device_, m.rows, m.cols);
      grads_[i] = device_tensor(p.grad, m.grad_dtype, device_, m.rows, m.cols);
      // A dense parameter is [numel, 1] with its one column selected: index 0.
      selected_[i] =
          device_tensor(p.selected != nullptr ? p.selected : &scalars->zero_index, ZF_DTYPE_I32, device_, m.k, -1);
      const int64_t elements = m.rows * m.k;
      states_[i].master = m.has_master ? device_tensor(p.master, ZF_DTYPE_F32, device_, elements, -1)
                                       : device_tensor(nullptr, ZF_DTYPE_F32, device_, 0, -1);
      states_[i].exp_avg = device_tensor(p.exp_avg, ZF_DTYPE_F32, device_, elements, -1);
      states_[i].exp_avg_sq = device_tensor(p.exp_avg_sq, ZF_DTYPE_F32, device_, elements, -1);
      states_[i].steps = device_tensor(p.steps, ZF_DTYPE_I32, device_, m.k, -1);
      lr_[i] = p.lr;
      weight_decay_[i] = p.weight_decay;
    }
    const AdamwSelectedArgs args{
        params_.data(),       grads_.data(), selected_.data(), states_.data(),       count,          lr_.data(),
        weight_decay_.data(), nullptr,       plan.hparams(),   &scalars->grad_scale, &scalars->skip, device_,
        grads_compact_.data()};
    cuda_ops().adamw_selected_columns(args, ops_stream());
  }

  void pack(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected, void* packed) override {
    pack_or_scatter(plan, matrices, selected, packed, true);
  }

  void scatter(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected,
               const void* packed) override {
    pack_or_scatter(plan, matrices, selected, const_cast<void*>(packed), false);
  }

  void copy_device(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const ScopedDevice guard(device_);
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(Lane::kCompute)),
               "cudaMemcpyAsync(device to device)");
  }

  void fill_device_zero(void* device, size_t bytes) override {
    if (bytes == 0) return;
    const ScopedDevice guard(device_);
    check_cuda(cudaMemsetAsync(device, 0, bytes, stream(Lane::kCompute)), "cudaMemsetAsync");
  }

  void copy_from_peer(void* dst, const Backend& source, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const ScopedDevice guard(device_);
    // Through the driver without peer access enabled (a 16-byte copy per device and step).
    check_cuda(cudaMemcpyPeerAsync(dst, device_, src, source.device().index, bytes, stream(Lane::kCompute)),
               "cudaMemcpyPeerAsync");
  }

  void copy_down(void* host, const void* device, size_t bytes) override {
    if (bytes == 0) return;
    const ScopedDevice guard(device_);
    check_cuda(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, down_), "cudaMemcpyAsync(down)");
  }

  void copy_up(void* device, const void* host, size_t bytes) override {
    if (bytes == 0) return;
    const ScopedDevice guard(device_);
    check_cuda(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, up_), "cudaMemcpyAsync(up)");
  }

  Event record(Lane lane) override {
    const ScopedDevice guard(device_);
    Event event = events_->acquire();
    check_cuda(cudaEventRecord(cuda_event(event), stream(lane)), "cudaEventRecord");
    return event;
  }

  void wait(Lane lane, const Event& event) override {
    if (!event) return;
    const ScopedDevice guard(device_);
    check_cuda(cudaStreamWaitEvent(stream(lane), cuda_event(event), 0), "cudaStreamWaitEvent");
  }

  // On the host lane the device is already current (bind_engine_thread), so the scope costs
  // a context lookup; on the training thread it keeps the wait off any other device.
  void host_wait(const Event& event) override {
    if (!event) return;
    const ScopedDevice guard(device_);
    check_cuda(cudaEventSynchronize(cuda_event(event)), "cudaEventSynchronize");
  }

  bool done(const Event& event) override {
    if (!event) return true;
    const ScopedDevice guard(device_);
    bool complete = false;
    check_cuda(query_event(runtime(), cuda_event(event), &complete), "cudaEventQuery");
    return complete;
  }

  void synchronize() override {
    const ScopedDevice guard(device_);
    check_cuda(cudaStreamSynchronize(stream(Lane::kCompute)), "cudaStreamSynchronize(compute)");
    check_cuda(cudaStreamSynchronize(down_), "cudaStreamSynchronize(down)");
    check_cuda(cudaStreamSynchronize(up_), "cudaStreamSynchronize(up)");
    if (reduce_ != nullptr) check_cuda(cudaStreamSynchronize(reduce_), "cudaStreamSynchronize(reduce)");
  }

  void bind_engine_thread() override { check_cuda(zf::bind_engine_thread(runtime(), device_), "cudaSetDevice"); }

  bool capturing(zf_stream compute) override {
    const ScopedDevice guard(device_);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t error = cudaStreamIsCapturing(static_cast<cudaStream_t>(compute), &status);
    if (error == cudaErrorStreamCaptureImplicit) {
      // The legacy default stream while another stream captures: using it would join that
      // capture. Not sticky: clear it.
      cudaGetLastError();
      return true;
    }
    check_cuda(error, "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  bool host_visible() const override { return false; }
  zf_stream compute_stream() const override { return ops_stream(); }

  void compute_on(Lane lane) override {
    if (lane == Lane::kReduce && reduce_ == nullptr) {
      const ScopedDevice guard(device_);
      check_cuda(cudaStreamCreateWithFlags(&reduce_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags(reduce)");
    }
    on_reduce_lane_ = lane == Lane::kReduce;
  }

  void set_stream(zf_stream stream) override {
    if (stream == compute_) return;
    // The engine's device state was last written on the old stream: the new one starts after it.
    const Event last = record(Lane::kCompute);
    compute_ = stream;
    wait(Lane::kCompute, last);
  }

  void* allocate_device(size_t bytes) override {
    const ScopedDevice guard(device_);
    void* memory = nullptr;
    const cudaError_t status = cudaMalloc(&memory, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it
      fail(ZF_ERROR_OUT_OF_MEMORY, "engine device memory: cudaMalloc of ", bytes, " bytes failed");
    }
    check_cuda(status, "cudaMalloc");
    return memory;
  }

  void free_device(void* memory, size_t) override {
    const ScopedDeviceNoThrow guard(device_);  // called by the engine's destructor
    cudaFree(memory);
  }

  void* allocate_pinned(size_t bytes) override {
    const ScopedDevice guard(device_);
    void* memory = nullptr;
    const cudaError_t status = cudaHostAlloc(&memory, bytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      fail(ZF_ERROR_OUT_OF_MEMORY, "engine pinned host memory: cudaHostAlloc of ", bytes, " bytes failed");
    }
    check_cuda(status, "cudaHostAlloc");
    return memory;
  }

  void free_pinned(void* memory, size_t) override {
    const ScopedDeviceNoThrow guard(device_);  // no context on another device for the free
    cudaFreeHost(memory);
  }

  ThreadPool& host_pool() override { return pool_; }
  zf_device device() const override { return zf_device{ZF_DEVICE_CUDA, device_}; }

 private:
  cudaStream_t stream(Lane lane) const {
    switch (lane) {
      case Lane::kDown:
        return down_;
      case Lane::kUp:
        return up_;
      case Lane::kReduce:
        return reduce_;
      default:
        return on_reduce_lane_ ? reduce_ : static_cast<cudaStream_t>(compute_);
    }
  }
  // Where the compute lane's ops run now: the caller's stream, or the reduction lane.
  zf_stream ops_stream() const { return stream(Lane::kCompute); }

  const std::vector<zf_tensor>& matrix_views(const zf_tensor* tensors, size_t count) {
    views_.resize(count);
    for (size_t i = 0; i < count; ++i) {
      const MatrixView view = matrix_view(tensors[i]);
      views_[i] = device_tensor(tensors[i].data, tensors[i].dtype, device_, view.rows, view.cols);
    }
    return views_;
  }

  static cudaEvent_t cuda_event(const Event& event) { return static_cast<const CudaEvent&>(*event).get(); }

  void pack_or_scatter(const PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected, void* packed,
                       bool to_packed) {
    const PackedLayout& layout = plan.layout();
    const size_t count = layout.size();
    selected_.resize(count);
    for (size_t i = 0; i < count; ++i)
      selected_[i] = device_tensor(selected[i], ZF_DTYPE_I32, device_, layout[i].selected, -1);
    const zf_dtype dtype = count > 0 ? matrices[0].dtype : ZF_DTYPE_F32;
    const zf_tensor packed_tensor = device_tensor(packed, dtype, device_, layout.total(), -1);
    cuda_ops().pack_or_scatter_columns(matrices, selected_.data(), layout, packed_tensor, nullptr, to_packed,
                                       ops_stream());
  }

  int device_;
  std::shared_ptr<EventPool> events_;
  zf_stream compute_ = nullptr;  // the caller's stream; nullptr = the legacy default stream
  cudaStream_t down_ = nullptr, up_ = nullptr, reduce_ = nullptr;
  bool on_reduce_lane_ = false;  // compute_on(Lane::kReduce) until compute_on(Lane::kCompute)
  ThreadPool pool_;
  // argument arrays, kept for capacity (the launchers read them during the call only)
  std::vector<zf_tensor> params_, grads_, selected_, views_;
  std::vector<zf_column_state> states_;
  std::vector<double> lr_, weight_decay_;
  std::vector<uint8_t> grads_compact_;  // per matrix: its gradient is the compact copy
};

const bool registered = [] {
  cuda_ops().make_engine_backend = [](int device, int host_threads) -> Backend* {
    return new CudaBackend(device, host_threads);
  };
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace zf
