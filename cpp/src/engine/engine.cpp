// The engine: setup, device memory, state initialisation and argument checks (engine.hpp);
// the step itself is in step.cpp.
#include "engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/device_ops.hpp"
#include "common/error.hpp"
#include "common/float_convert.hpp"
#include "common/matrix_view.hpp"
#include "common/tensor.hpp"
#include "engine/config_table.hpp"
#include "engine/host_backend.hpp"

namespace zf {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

bool finite_at_least(double value, double low) { return std::isfinite(value) && value >= low; }

// Every field's rules live in the configuration table (config_table.cpp).
// Checked before any member reads it: an enum field may hold a value outside its type.
const zf_engine_config& checked_config(const zf_engine_config& c) {
  check_config_table(c);
  return c;
}

ScheduleConfig schedule_config(const zf_engine_config& c) {
  ScheduleConfig s;
  s.warm_up_rounds = c.full_warm_up_rounds;
  s.auto_warm_up_rounds = c.auto_warm_up_rounds;
  s.update_interval = c.update_interval;
  s.max_update_interval = c.max_update_interval;
  s.auto_ratio = c.auto_ratio;
  s.strategy = c.select_strategy;
  s.select_interval = c.select_interval;
  s.steps_per_epoch = c.steps_per_epoch;
  s.update_lag = c.update_lag;
  return s;
}

int64_t selected_count(double ratio, int64_t n) {
  if (ratio == 0.0) return 0;
  const auto k = static_cast<int64_t>(std::floor(ratio * static_cast<double>(n)));
  return std::min(n, std::max<int64_t>(1, k));
}

float read_float(const void* data, zf_dtype dtype, int64_t i) {
  switch (dtype) {
    case ZF_DTYPE_BF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case ZF_DTYPE_F16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}

// Overlap off with one-step windows (synchronous offload), or nothing deferred: no host work
// ever runs while the caller computes.
bool runs_synchronously(const zf_engine_config& c) {
  return (c.overlap_step == 0 && c.update_interval == 1) || c.topk_ratio >= 1.0;
}

}  // namespace

void validate_config(const zf_engine_config& config) { check_config_table(config); }

zf_engine_thread_plan thread_plan(const zf_engine_config& config) {
  // This rank's cores: a launcher that pins each rank already split the host (the affinity is
  // narrower than the host); otherwise the ranks on the host share its cores evenly, so that
  // 8 ranks do not each start threads for every core.
  const int affinity = host_cpu_count();
  const int online = std::max(affinity, online_cpu_count());
  const int ranks = std::max(1, config.ranks_per_host);
  const int cores = affinity < online ? affinity : std::max(1, affinity / ranks);
  // The cores are split between the framework (and the compute lane) and the host lane only
  // when host work can run beside the model's compute. A synchronous configuration waits for
  // every host update inside its step, so everything takes every core.
  const bool synchronous = runs_synchronously(config);
  const int host_auto = synchronous ? cores : reserved_split_thread_count(cores, config.pt_reserved_cores_perc);
  zf_engine_thread_plan plan{};
  plan.cores = cores;
  plan.host_threads = config.host_threads > 0 ? config.host_threads : host_auto;
  // The framework and the compute lane (which runs while the framework waits for the step)
  // take what the host lane leaves.
  const int rest = synchronous ? cores : std::max(1, cores - host_auto);
  plan.compute_threads = config.compute_threads > 0 ? config.compute_threads : rest;
  plan.framework_threads = synchronous ? cores : std::max(1, cores - plan.host_threads);
  return plan;
}

void automatic_thread_counts(const zf_engine_config& config, int* compute_threads, int* host_threads) {
  const zf_engine_thread_plan plan = thread_plan(config);
  *host_threads = plan.host_threads;
  *compute_threads = plan.compute_threads;
}

Engine::Engine(const zf_tensor* params, const int32_t* param_groups, size_t param_count, const zf_engine_group* groups,
               size_t group_count, const zf_engine_config& config, EnginePart part)
    : config_(checked_config(config)), part_(std::move(part)), schedule_(schedule_config(config_)) {
  hparams_ = zf_adam_hparams{config.beta1, config.beta2, config.eps, ZF_ADAM_MODE_ADAMW};
  require(param_count == 0 || (params != nullptr && param_groups != nullptr), ZF_ERROR_INVALID_VALUE,
          "params, param_groups: NULL with param_count ", param_count);
  require(group_count == 0 || groups != nullptr, ZF_ERROR_INVALID_VALUE, "groups: NULL with group_count ", group_count);
  groups_.assign(groups, groups + group_count);
  for (size_t g = 0; g < group_count; ++g) {
    require(finite_at_least(groups[g].lr, 0.0), ZF_ERROR_INVALID_VALUE, "groups[", g, "].lr: must be finite and >= 0");
    require(finite_at_least(groups[g].weight_decay, 0.0), ZF_ERROR_INVALID_VALUE, "groups[", g,
            "].weight_decay: must be finite and >= 0");
  }
  for (size_t i = 0; i < param_count; ++i) {
    const ArgName name("params", param_name(i));
    check_descriptor(&params[i], name);
    if (i == 0) check_device_compiled(params[0].device, name);
    // EngineGroup gives each engine one device's parameters.
    require(params[i].device.type == params[0].device.type && params[i].device.index == params[0].device.index,
            ZF_ERROR_INVALID_VALUE, name, ": on ", describe_device(params[i].device), " while params[0] is on ",
            describe_device(params[0].device), " (one engine drives the parameters of one device)");
    check_dtype(params[i], name, {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
    check_contiguous(params[i], name);
    require(numel(params[i]) > 0, ZF_ERROR_INVALID_VALUE, name, ": has no elements");
    require(param_groups[i] >= 0 && static_cast<size_t>(param_groups[i]) < group_count, ZF_ERROR_INVALID_VALUE,
            "param_groups[", param_name(i), "]: ", param_groups[i], " is not a group index (", group_count, " groups)");
    const MatrixView view = matrix_view(params[i]);
    Param p{params[i], param_groups[i], is_matrix(params[i], groups[param_groups[i]].dense != 0),
            view.rows, view.cols,       numel(params[i]),
            0};
    const bool has_master = config.master_weights == ZF_MASTER_FP32 && params[i].dtype != ZF_DTYPE_F32;
    if (p.matrix) {
      p.index = matrices_.size();
      Matrix m;
      m.param = i;
      m.rows = p.rows;
      m.cols = p.cols;
      m.k = selected_count(config.topk_ratio, p.cols);
      m.has_master = has_master;
      matrices_.push_back(std::move(m));
    } else {
      p.index = dense_.size();
      Dense d;
      d.param = i;
      d.has_master = has_master;
      dense_.push_back(std::move(d));
    }
    params_.push_back(p);
  }
  int host_threads = 1;
  automatic_thread_counts(config, &compute_threads_, &host_threads);
  window_.init(groups_, hparams_);
  loss_scale_ = config.loss_scaling == ZF_LOSS_SCALING_DYNAMIC ? config.initial_scale : 1.0;
  create_backend(compute_threads_);
  set_ownership();
  setup_buckets_and_memory();
  lane_ = make_host_lane(host_threads);
}

std::unique_ptr<Backend> make_cuda_backend(int device, int host_threads) {
  Backend* (*factory)(int, int) = cuda_ops().make_engine_backend;
  require(factory != nullptr, ZF_ERROR_NOT_SUPPORTED, "params: CUDA tensors need the engine's CUDA backend, but ",
          kNoCudaBuild, " (", zf_cuda_build_note(), "). ", kRebuildWithCuda);
  return std::unique_ptr<Backend>(factory(device, host_threads));
}

std::unique_ptr<HostLane> Engine::make_host_lane(int threads) {
  Backend* backend = backend_.get();  // the lane is rebuilt whenever the backend is replaced
  return std::make_unique<HostLane>(threads, [backend] { backend->bind_engine_thread(); });
}

namespace {
[[noreturn]] void fail_capturing(const char* call) {
  fail(ZF_ERROR_NOT_SUPPORTED, call,
       ": the compute stream is capturing a CUDA graph. An engine call cannot be captured: it hands work to the "
       "engine's host threads and copies through pinned host memory, which a graph replay would not do. Capture "
       "the forward and backward passes only, and call the optimizer step outside the capture");
}
}  // namespace

void Engine::check_hyperparameters(double beta1, double beta2, double eps, const double* weight_decays,
                                   size_t group_count) const {
  zf_adam_hparams h{beta1, beta2, eps, ZF_ADAM_MODE_ADAMW};
  check_adam_hparams(&h);
  require(weight_decays == nullptr || group_count == groups_.size(), ZF_ERROR_INVALID_VALUE,
          "weight_decays: ", group_count, " values for ", groups_.size(), " groups");
  for (size_t g = 0; weight_decays != nullptr && g < group_count; ++g)
    require(finite_at_least(weight_decays[g], 0.0), ZF_ERROR_INVALID_VALUE, "weight_decays[", g,
            "]: must be finite and >= 0, got ", weight_decays[g]);
}

void Engine::set_hyperparameters(double beta1, double beta2, double eps, const double* weight_decays,
                                 size_t group_count) {
  check_hyperparameters(beta1, beta2, eps, weight_decays, group_count);
  hparams_ = zf_adam_hparams{beta1, beta2, eps, ZF_ADAM_MODE_ADAMW};
  for (size_t g = 0; weight_decays != nullptr && g < group_count; ++g) groups_[g].weight_decay = weight_decays[g];
}

void Engine::refuse_capture(const char* call) const {
  if (backend_->capturing(backend_->compute_stream())) fail_capturing(call);
}

void Engine::set_stream(zf_stream stream) {
  if (backend_->capturing(stream)) fail_capturing("set_stream");
  backend_->set_stream(stream);
}

void Engine::create_backend(int compute_threads) {
  const bool cuda = !params_.empty() && params_[0].tensor.device.type == ZF_DEVICE_CUDA;
  if (cuda) {
    backend_ = make_cuda_backend(params_[0].tensor.device.index, compute_threads);
  } else {
    backend_ = std::make_unique<HostBackend>(compute_threads);
  }
}

void Engine::replace_backend_for_testing(std::unique_ptr<Backend> backend) {
  require(!initialized_ && !arena_.exists(), ZF_ERROR_INVALID_VALUE,
          "the backend is replaced before the first step, with no device memory attached");
  const int lane_threads = lane_->threads();
  lane_.reset();          // no job refers to the old buffers
  release_host_memory();  // pinned through the old backend
  backend_ = std::move(backend);
  buckets_.clear();
  setup_buckets_and_memory();
  lane_ = make_host_lane(lane_threads);
}

Engine::~Engine() {
  lane_.reset();  // joins the host lane first: no job touches the buffers below any more
  try {
    backend_->synchronize();  // no copy still reads or writes the buffers freed below
  } catch (const std::exception&) {
    // A failed device: nothing will run any more; free what is ours.
  }
  scalar_readback_.release();
  ring_.forget_copies();
  last_scatter_.reset();
  window_.forget_uploaded();
  ring_.release();
  upload_ = PinnedBuffer();
  arena_.free(*backend_);
}

void Engine::setup_buckets_and_memory() {
  std::vector<ColumnStatsMatrix> stats;
  for (const Param& p : params_) stats.push_back(ColumnStatsMatrix{p.rows, p.cols, p.tensor.dtype});
  stats_plan_ = std::make_unique<ColumnStatsPlan>(std::move(stats));
  // Buckets: consecutive matrices of one dtype, at most bucket_bytes of packed gradient with
  // nothing selected (the largest a bucket gets); a larger matrix is a bucket of its own.
  // The buckets are decided from the whole matrices, so that every rank of a data-parallel
  // run has the same; the staging slots and U hold this rank's columns.
  size_t upload_bytes = 0;
  slot_bytes_ = 0;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    Matrix& m = matrices_[i];
    const zf_dtype dtype = params_[m.param].tensor.dtype;
    const size_t bytes = static_cast<size_t>(m.rows * m.cols) * zf_dtype_size(dtype);
    const size_t own_bytes = static_cast<size_t>(m.rows * m.own_cols) * zf_dtype_size(dtype);
    if (buckets_.empty() || buckets_.back().dtype != dtype ||
        buckets_.back().max_bytes + bytes > config_.bucket_bytes) {
      Bucket b;
      b.first = b.last = i;
      b.dtype = dtype;
      b.max_bytes = 0;
      b.own_max_bytes = 0;
      upload_bytes = (upload_bytes + 63) / 64 * 64;  // a bucket of another dtype starts aligned
      b.upload_offset = upload_bytes;
      buckets_.push_back(std::move(b));
    }
    Bucket& b = buckets_.back();
    m.bucket = buckets_.size() - 1;
    b.last = i + 1;
    b.max_bytes += bytes;
    b.gradient_bytes += bytes;
    b.own_max_bytes += own_bytes;
    upload_bytes += own_bytes;
    slot_bytes_ = std::max(slot_bytes_, b.own_max_bytes);
    m.window_score.resize(2 * static_cast<size_t>(m.cols));
  }
  // The host state and the pinned buffers are sized here and allocated at first use
  // (ensure_host_memory): a data-parallel engine is re-planned for its rank's columns before
  // that, so a rank's resident memory is its share, not the whole model's.
  release_host_memory();
  // Device memory: compact state per matrix, dense state, the selections, the column sums
  // of every parameter, the step scalars, the statistics workspace, the staging ring, one
  // upload bucket.
  arena_.start_layout();
  auto take = [this](size_t bytes) { return arena_.take(bytes); };
  for (Matrix& m : matrices_) {
    const size_t floats = static_cast<size_t>(m.rows * m.k) * 4;
    const size_t start = arena_.bytes();
    if (m.has_master) m.dev_master = take(floats);
    m.dev_exp_avg = take(floats);
    m.dev_exp_avg_sq = take(floats);
    m.dev_steps = take(static_cast<size_t>(m.k) * 4);
    m.compact_bytes = arena_.bytes() - start;
  }
  for (Dense& d : dense_) {
    const Param& p = params_[d.param];
    const size_t floats = static_cast<size_t>(p.numel) * 4;
    if (d.has_master) d.dev_master = take(floats);
    d.dev_exp_avg = take(floats);
    d.dev_exp_avg_sq = take(floats);
    d.dev_steps = take(4);  // one count: the update sees a dense parameter as [numel, 1]
  }
  device_state_bytes_ = arena_.bytes();
  size_t selected_ints = 0;
  for (Matrix& m : matrices_) {
    m.dev_selected = selected_ints * 4;  // relative to selected_offset_
    selected_ints += static_cast<size_t>(m.k);
  }
  selected_bytes_ = selected_ints * 4;
  selected_offset_ = take(selected_bytes_);
  for (Matrix& m : matrices_) m.dev_selected += selected_offset_;
  // Every parameter's column sums: the matrices' first, in matrix order, then the dense
  // parameters' (data parallel shares only the matrices' part).
  col_sq_floats_ = 0;
  for (Matrix& m : matrices_) {
    m.col_offset = col_sq_floats_;
    params_[m.param].col_offset = col_sq_floats_;
    col_sq_floats_ += static_cast<size_t>(m.cols);
  }
  matrix_col_floats_ = col_sq_floats_;
  for (const Dense& d : dense_) {
    params_[d.param].col_offset = col_sq_floats_;
    col_sq_floats_ += static_cast<size_t>(params_[d.param].cols);
  }
  col_sq_offset_ = take(col_sq_floats_ * 4);
  scalars_offset_ = take(sizeof(StepScalars));
  scalar_ring_offset_ = take(ScalarReadback::device_bytes());
  flags_offset_ = take((flag_count() + agreement_slots()) * 4);  // one per statistics pass, at its first parameter
  total_sink_offset_ = take(4);
  chunk_sums_offset_ =
      take(static_cast<size_t>(std::max<int64_t>(1, column_chunks(static_cast<int64_t>(col_sq_floats_)))) * 8);
  partials_offset_ = take(part_.count * sizeof(ScalarPartial));  // a group's exchange
  {
    std::vector<zf_tensor> tensors;
    for (const Param& p : params_) tensors.push_back(p.tensor);
    stats_workspace_bytes_ = backend_->column_stats_workspace_bytes(tensors.data(), tensors.size());
  }
  stats_workspace_offset_ = take(stats_workspace_bytes_);
  const auto device_slots = static_cast<size_t>(config_.staging_slots);
  ring_.plan(slot_bytes_, releasing() ? std::max(device_slots, buckets_.size()) : device_slots, device_slots,
             backend_->host_visible());
  staging_offset_ = take(ring_.device_bytes());
  ring_.place(arena_.base_address(), staging_offset_);
  closing_header_offset_ = take(2 * kSlotHeaderBytes);  // one per upload copy
  // release_gradients: per bucket, a region of its matrices' selected columns in the
  // gradient's dtype, one matrix after the other.
  for (Bucket& b : buckets_) {
    if (!releasing()) break;
    size_t bytes = 0;
    for (size_t i = b.first; i < b.last; ++i) {
      matrices_[i].dev_compact_grad = bytes;  // relative to the bucket's region until it is taken
      bytes += static_cast<size_t>(matrices_[i].rows * matrices_[i].k) * zf_dtype_size(b.dtype);
    }
    b.compact_grad_offset = take(bytes);
    for (size_t i = b.first; i < b.last; ++i) matrices_[i].dev_compact_grad += b.compact_grad_offset;
  }
  upload_buffer_offset_ = take(backend_->host_visible() ? 0 : slot_bytes_);  // the host backend scatters from U
  parallel_memory();
  upload_bytes_ = upload_bytes;
  upload_copies_ = upload_copies_needed();
  col_sq_host_.assign(backend_->host_visible() ? 0 : col_sq_floats_, 0.0f);
}

void Engine::release_host_memory() {
  for (Matrix& m : matrices_) {
    for (StreamedVector<float>* v : m.host_arrays()) StreamedVector<float>().swap(*v);
    std::vector<int32_t>().swap(m.steps);
  }
  ring_.release();
  upload_ = PinnedBuffer();
  scalar_readback_.release();
  host_memory_ready_ = false;
}

void Engine::ensure_host_memory() {
  if (host_memory_ready_) return;
  for (Matrix& m : matrices_) {
    const size_t elements = static_cast<size_t>(m.rows * m.own_cols);
    for (StreamedVector<float>* v : m.host_arrays()) v->assign(elements, 0.0f);
    m.steps.assign(static_cast<size_t>(m.own_cols), 0);
  }
  ring_.allocate(backend_.get());
  // The upload copies, then the closing step's header (CUDA copies it down there; the host
  // backend reads it in the engine's memory).
  upload_stride_ = (upload_bytes_ + 255) / 256 * 256;
  closing_header_at_ = upload_stride_ * static_cast<size_t>(upload_copies_);
  upload_ = PinnedBuffer(
      backend_.get(),
      closing_header_at_ + (backend_->host_visible() ? 0 : kSlotHeaderBytes * static_cast<size_t>(upload_copies_)));
  scalar_readback_.allocate(backend_.get());
  host_memory_ready_ = true;
}

void Engine::attach_device_memory(void* memory, size_t bytes) {
  require(!initialized_, ZF_ERROR_INVALID_VALUE,
          "memory: device memory is attached once, before the first step or load");
  arena_.attach(memory, bytes);
  on_device_memory();
}

void Engine::on_device_memory() {
  backend_->fill_device_zero(arena_.base(), arena_.bytes());
  backend_->synchronize();  // once: whatever stream the first step runs on sees zeroed memory
  // Each parameter's column sums, at its place in the col_sq region.
  col_sq_tensors_.clear();
  for (const Param& p : params_)
    col_sq_tensors_.push_back(
        contiguous_descriptor(device_float(col_sq_offset_) + p.col_offset, ZF_DTYPE_F32, p.tensor.device, {p.cols}));
}

void Engine::ensure_device_memory() {
  if (arena_.ensure(*backend_)) on_device_memory();
}

void Engine::initialize_state() {
  if (initialized_) return;
  ensure_device_memory();
  ensure_host_memory();
  // Host masters from the weights: a pack with nothing selected writes W^T in fp32, which is
  // the deferred host layout while nothing is selected. Of this rank's columns only: the
  // pack skips the others.
  for (Matrix& m : matrices_) {
    std::vector<int32_t> others;
    for (int64_t j = 0; j < m.cols; ++j)
      if (j < m.own_lo || j >= m.own_lo + m.own_cols) others.push_back(static_cast<int32_t>(j));
    PackedLayout layout;
    layout.add(m.rows, m.cols, static_cast<int64_t>(others.size()));
    PackPlan plan(layout, {params_[m.param].tensor.dtype}, ZF_DTYPE_F32);
    std::vector<uint8_t> weights = download_param(m.param);
    void* param = weights.empty() ? params_[m.param].tensor.data : weights.data();
    const int32_t* skip = others.empty() ? nullptr : others.data();
    plan.run(backend_->host_pool(), &param, &skip, m.master.data(), 1.0f, true);
    if (parallel()) upload_selection(m);
  }
  for (Dense& d : dense_) {
    if (!d.has_master) continue;
    const Param& p = params_[d.param];
    std::vector<uint8_t> weights = download_param(d.param);
    const void* source = weights.empty() ? p.tensor.data : weights.data();
    std::vector<float> master(static_cast<size_t>(p.numel));
    for (int64_t i = 0; i < p.numel; ++i) master[static_cast<size_t>(i)] = read_float(source, p.tensor.dtype, i);
    upload(device_float(d.dev_master), master.data(), master.size() * 4);
  }
  rebuild_plans();
  initialized_ = true;
}

void Engine::download(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
  backend_->wait(Lane::kDown, backend_->record(Lane::kCompute));
  backend_->copy_down(host, device, bytes);
  backend_->host_wait(backend_->record(Lane::kDown));
}

void Engine::upload(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  backend_->wait(Lane::kUp, backend_->record(Lane::kCompute));  // after every earlier reader
  backend_->copy_up(device, host, bytes);
  const Event copied = backend_->record(Lane::kUp);
  backend_->wait(Lane::kCompute, copied);  // before every later reader
  backend_->host_wait(copied);             // `host` may go away
}

std::vector<uint8_t> Engine::download_param(size_t index) {
  // The host backend reads parameters in place: an empty result says so.
  if (backend_->host_visible()) return {};
  const Param& p = params_[index];
  std::vector<uint8_t> weights(static_cast<size_t>(p.numel) * zf_dtype_size(p.tensor.dtype));
  download(weights.data(), p.tensor.data, weights.size());
  return weights;
}

zf_column_state Engine::host_state(Matrix& m, bool with_master) {
  zf_column_state s{};
  const int64_t shape[2] = {m.own_deferred(), m.rows};
  auto tensor = [&](void* data, zf_dtype dtype, int ndim, const int64_t* dims) {
    zf_tensor t{};
    t.data = data;
    t.dtype = dtype;
    t.device = zf_device{ZF_DEVICE_CPU, 0};
    t.ndim = ndim;
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      t.shape[d] = dims[d];
      t.strides[d] = stride;
      stride *= dims[d];
    }
    return t;
  };
  const int64_t empty[1] = {0};
  s.master = with_master ? tensor(m.master.data(), ZF_DTYPE_F32, 2, shape) : tensor(nullptr, ZF_DTYPE_F32, 1, empty);
  s.exp_avg = tensor(m.exp_avg.data(), ZF_DTYPE_F32, 2, shape);
  s.exp_avg_sq = tensor(m.exp_avg_sq.data(), ZF_DTYPE_F32, 2, shape);
  s.steps = tensor(m.steps.data(), ZF_DTYPE_I32, 1, shape);
  return s;
}

// ---- checks ----

void Engine::check_usable() const {
  if (sticky_) throw Error(sticky_status_, sticky_message_);
}

void Engine::poll_host_lane() {
  // A failure of a finished job, or a non-finite gradient found after its step on the
  // device, surfaces at the next call (docs/design.md section 7).
  check_usable();
  for (const auto& job : ring_.jobs()) {
    if (job && job->done()) wait_job(job, nullptr);
  }
  if (window_.job() && window_.job()->done()) wait_job(window_.job(), nullptr);
  check_recorded_scalars(false);
  check_usable();
}

void Engine::fail_sticky(zf_status status, const std::string& message) {
  sticky_ = true;
  sticky_status_ = status;
  sticky_message_ = message;
  throw Error(status, message);
}

void Engine::wait_job(const std::shared_ptr<WorkJob>& job, double* stall) {
  const auto start = Clock::now();
  try {
    job->wait();
  } catch (const Error& e) {
    sticky_ = true;
    sticky_status_ = e.status();
    sticky_message_ =
        std::string("engine host lane failed (the engine refuses steps until it loads a state): ") + e.what();
  } catch (const std::exception& e) {
    sticky_ = true;
    sticky_status_ = ZF_ERROR_INTERNAL;
    sticky_message_ =
        std::string("engine host lane failed (the engine refuses steps until it loads a state): ") + e.what();
  }
  if (stall != nullptr) *stall += seconds_since(start);
  if (!in_parallel_step_) check_usable();
}

void Engine::check_grad(const zf_tensor& grad, size_t index) const {
  const ArgName name("grads", param_name(index));
  const Param& p = params_[index];
  check_descriptor(&grad, name);
  check_same_device(grad, name, p.tensor.device, ArgName("params", param_name(index)));
  require(grad.dtype == p.tensor.dtype, ZF_ERROR_INVALID_TYPE, name, ": dtype ", zf_dtype_name(grad.dtype),
          " differs from the parameter's ", zf_dtype_name(p.tensor.dtype));
  bool same_shape = grad.ndim == p.tensor.ndim;
  for (int d = 0; same_shape && d < grad.ndim; ++d) same_shape = grad.shape[d] == p.tensor.shape[d];
  require(same_shape, ZF_ERROR_INVALID_VALUE, name, ": shape differs from the parameter's");
  check_contiguous(grad, name);
}

void Engine::check_lrs(const double* lrs, size_t lr_count) const {
  if (lrs == nullptr) return;
  require(lr_count == groups_.size(), ZF_ERROR_INVALID_VALUE, "lrs: ", lr_count, " values for ", groups_.size(),
          " groups");
  for (size_t g = 0; g < lr_count; ++g)
    require(finite_at_least(lrs[g], 0.0), ZF_ERROR_INVALID_VALUE, "lrs[", g, "]: must be finite and >= 0");
}

}  // namespace zf
