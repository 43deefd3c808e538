// The engine's C ABI (zenflow/engine.h): argument checks and exception-to-status conversion.
#include "zenflow/engine.h"

#include <pthread.h>

#include <memory>
#include <mutex>
#include <unordered_set>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "engine/config_table.hpp"
#include "engine/engine_group.hpp"

struct zf_engine {
  zf::EngineGroup engine;
  uint64_t fork_generation = zf::fork_generation();  // the process that owns its threads
  template <class... Args>
  explicit zf_engine(Args&&... args) : engine(std::forward<Args>(args)...) {}
};

namespace {

// An engine copied into a forked child has no threads there (its host lane and pools were
// the parent's) and its locks may be copies taken while held: it cannot run, and destroying
// it would wait for threads that do not exist. The child gets a clear error instead.
bool inherited_through_fork(const zf_engine* e) { return e->fork_generation != zf::fork_generation(); }

// The handles zf_engine_create returned and zf_engine_destroy has not yet destroyed. Every
// call looks its handle up here before touching it, so a destroyed handle (use after destroy,
// double destroy) or a pointer that never was an engine fails with INVALID_VALUE instead of
// reading freed memory. What it cannot see: a stale handle whose address a newer engine has
// since been given (the allocator reuses it) reaches that engine. The lock is held for the
// lookup only; a child forked while another thread holds it gets it unlocked (pthread_atfork).
class LiveEngines {
 public:
  static LiveEngines& instance() {
    static LiveEngines* registry = new LiveEngines();  // never destroyed: calls may come at exit
    return *registry;
  }
  void add(const zf_engine* e) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.insert(e);
  }
  bool remove(const zf_engine* e) {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.erase(e) == 1;
  }
  bool contains(const zf_engine* e) {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.count(e) == 1;
  }

 private:
  LiveEngines() {
    pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                   [] { instance().mutex_.unlock(); });
  }
  std::mutex mutex_;
  std::unordered_set<const zf_engine*> live_;
};

constexpr const char* kNotLive =
    "engine: not a live engine (already destroyed by zf_engine_destroy, or never returned by zf_engine_create)";

void require_usable(const zf_engine* e) {
  zf::require(e != nullptr, ZF_ERROR_INVALID_VALUE, "engine: NULL");
  zf::require(LiveEngines::instance().contains(e), ZF_ERROR_INVALID_VALUE, kNotLive);
  zf::require(!inherited_through_fork(e), ZF_ERROR_INVALID_VALUE,
              "engine: created in the parent of this forked process; its threads do not exist here "
              "(create a new engine in the child)");
}

zf::EngineGroup& get(zf_engine* e) {
  require_usable(e);
  return e->engine;
}

const zf::EngineGroup& get(const zf_engine* e) {
  require_usable(e);
  return e->engine;
}

template <class T>
void require_out(T* out, const char* name) {
  zf::require(out != nullptr, ZF_ERROR_INVALID_VALUE, name, ": NULL");
}

}  // namespace

extern "C" {

ZF_API zf_engine_config zf_engine_config_default(void) { return zf::config_defaults(); }

ZF_API zf_status zf_engine_config_check(const zf_engine_config* config) {
  return zf::api_call([&] {
    zf::require(config != nullptr, ZF_ERROR_INVALID_VALUE, "config: NULL");
    zf::validate_config(*config);
  });
}

ZF_API zf_status zf_engine_thread_plan_for(const zf_engine_config* config, zf_engine_thread_plan* plan) {
  return zf::api_call([&] {
    zf::require(config != nullptr && plan != nullptr, ZF_ERROR_INVALID_VALUE, "config, plan: NULL");
    zf::validate_config(*config);
    *plan = zf::thread_plan(*config);
  });
}

ZF_API zf_status zf_engine_create(const zf_tensor* params, const int32_t* param_groups, size_t param_count,
                                  const zf_engine_group* groups, size_t group_count, const zf_engine_config* config,
                                  zf_engine** out) {
  return zf::api_call([&] {
    require_out(out, "out");
    require_out(config, "config");
    auto engine = std::make_unique<zf_engine>(params, param_groups, param_count, groups, group_count, *config);
    LiveEngines::instance().add(engine.get());
    *out = engine.release();
  });
}

ZF_API zf_status zf_engine_destroy(zf_engine* engine) {
  return zf::api_call([&] {
    // In a forked child the parent's engine is left as it is (see inherited_through_fork):
    // its memory is the parent's copy, released when the child exits.
    if (engine == nullptr) return;
    zf::require(LiveEngines::instance().remove(engine), ZF_ERROR_INVALID_VALUE, kNotLive);
    if (inherited_through_fork(engine)) return;
    delete engine;
  });
}

ZF_API zf_status zf_engine_device_memory_size(const zf_engine* engine, size_t* bytes) {
  return zf::api_call([&] {
    const zf::Engine& e = get(engine).single("zf_engine_device_memory_size");
    require_out(bytes, "bytes");
    *bytes = e.device_memory_bytes();
  });
}

ZF_API zf_status zf_engine_attach_device_memory(zf_engine* engine, void* memory, size_t bytes) {
  return zf::api_call(
      [&] { get(engine).single("zf_engine_attach_device_memory").attach_device_memory(memory, bytes); });
}

ZF_API zf_status zf_engine_set_stream(zf_engine* engine, zf_stream stream) {
  return zf::api_call([&] { get(engine).single("zf_engine_set_stream").set_stream(stream); });
}

ZF_API zf_status zf_engine_device_count(const zf_engine* engine, size_t* count) {
  return zf::api_call([&] {
    const zf::EngineGroup& e = get(engine);
    require_out(count, "count");
    *count = e.device_count();
  });
}

ZF_API zf_status zf_engine_device_at(const zf_engine* engine, size_t index, zf_device* device, size_t* memory_bytes) {
  return zf::api_call([&] {
    const zf::EngineGroup& e = get(engine);
    require_out(device, "device");
    require_out(memory_bytes, "memory_bytes");
    const zf_device where = e.device(index);
    *memory_bytes = e.device_memory_bytes(index);
    *device = where;
  });
}

ZF_API zf_status zf_engine_attach_device_memory_at(zf_engine* engine, size_t index, void* memory, size_t bytes) {
  return zf::api_call([&] { get(engine).attach_device_memory(index, memory, bytes); });
}

ZF_API zf_status zf_engine_set_stream_at(zf_engine* engine, size_t index, zf_stream stream) {
  return zf::api_call([&] { get(engine).set_stream(index, stream); });
}

ZF_API zf_status zf_engine_set_collectives(zf_engine* engine, const zf_engine_collectives* collectives) {
  return zf::api_call([&] { get(engine).set_collectives(collectives); });
}

ZF_API zf_status zf_engine_inject_host_lane_fault_for_testing(zf_engine* engine, const char* message) {
  return zf::api_call([&] {
    zf::require(message != nullptr, ZF_ERROR_INVALID_VALUE, "message: NULL");
    get(engine).inject_host_lane_fault_for_testing(message);
  });
}

ZF_API zf_status zf_engine_step(zf_engine* engine, const zf_tensor* grads, size_t count, const double* lrs,
                                size_t lr_count) {
  return zf::api_call([&] { get(engine).step(grads, count, lrs, lr_count); });
}

ZF_API zf_status zf_engine_begin_step(zf_engine* engine, const double* lrs, size_t lr_count) {
  return zf::api_call([&] { get(engine).begin_step(lrs, lr_count); });
}

ZF_API zf_status zf_engine_submit(zf_engine* engine, size_t first, const zf_tensor* grads, size_t count) {
  return zf::api_call([&] { get(engine).submit(first, grads, count); });
}

ZF_API zf_status zf_engine_end_step(zf_engine* engine) {
  return zf::api_call([&] { get(engine).end_step(); });
}

ZF_API zf_status zf_engine_abort_step(zf_engine* engine) {
  return zf::api_call([&] { get(engine).abort_step(); });
}

ZF_API zf_status zf_engine_mark_ready(zf_engine* engine, size_t index, const zf_tensor* grad) {
  return zf::api_call([&] { get(engine).mark_ready(index, grad); });
}

ZF_API zf_status zf_engine_end_step_with(zf_engine* engine, const zf_tensor* grads, size_t count) {
  return zf::api_call([&] { get(engine).end_step_with(grads, count); });
}

ZF_API zf_status zf_engine_take_released(zf_engine* engine, size_t* indices, size_t capacity, size_t* count) {
  return zf::api_call([&] {
    zf::require(count != nullptr, ZF_ERROR_INVALID_VALUE, "count: NULL");
    zf::require(capacity == 0 || indices != nullptr, ZF_ERROR_INVALID_VALUE, "indices: NULL");
    get(engine).take_released(indices, capacity, count);
  });
}

ZF_API zf_status zf_engine_check_params(const zf_engine* engine, const void* const* data, size_t count) {
  return zf::api_call([&] { get(engine).check_param_data(data, count); });
}

ZF_API zf_status zf_engine_set_hyperparameters(zf_engine* engine, double beta1, double beta2, double eps,
                                               const double* weight_decays, size_t group_count) {
  return zf::api_call([&] { get(engine).set_hyperparameters(beta1, beta2, eps, weight_decays, group_count); });
}

ZF_API zf_status zf_engine_refuse(zf_engine* engine, zf_engine_call call) {
  return zf::api_call([&] { get(engine).refuse(call); });
}

ZF_API zf_status zf_engine_flush(zf_engine* engine) {
  return zf::api_call([&] { get(engine).flush(); });
}

ZF_API zf_status zf_engine_get_stats(const zf_engine* engine, zf_engine_stats* stats) {
  return zf::api_call([&] {
    const zf::EngineGroup& e = get(engine);
    require_out(stats, "stats");
    *stats = e.stats();
  });
}

ZF_API zf_status zf_engine_loss_scale(const zf_engine* engine, double* loss_scale) {
  return zf::api_call([&] {
    const zf::EngineGroup& e = get(engine);
    require_out(loss_scale, "loss_scale");
    *loss_scale = e.loss_scale();
  });
}

ZF_API zf_status zf_engine_state_layout(const zf_engine* engine, zf_engine_state_entry* entries, size_t* count) {
  return zf::api_call([&] {
    const zf::EngineGroup& e = get(engine);
    require_out(count, "count");
    const std::vector<zf_engine_state_entry> layout = e.state_layout();
    if (entries != nullptr) {
      zf::require(*count >= layout.size(), ZF_ERROR_INVALID_VALUE, "count: ", *count, " < the ", layout.size(),
                  " entries of the state");
      std::copy(layout.begin(), layout.end(), entries);
    }
    *count = layout.size();
  });
}

ZF_API zf_status zf_engine_param_state_layout(const zf_tensor* param, int dense_group, zf_engine_state_entry* entries,
                                              size_t* count) {
  return zf::api_call([&] {
    zf::require(param != nullptr, ZF_ERROR_INVALID_VALUE, "param: NULL");
    require_out(count, "count");
    zf::check_descriptor(param, "param");
    zf::require(zf::numel(*param) > 0, ZF_ERROR_INVALID_VALUE, "param: has no elements");
    const std::vector<zf_engine_state_entry> layout =
        zf::param_state_entries(0, *param, zf::is_matrix(*param, dense_group != 0), 0);
    if (entries != nullptr) {
      zf::require(*count >= layout.size(), ZF_ERROR_INVALID_VALUE, "count: ", *count, " < the ", layout.size(),
                  " entries of the parameter's state");
      std::copy(layout.begin(), layout.end(), entries);
    }
    *count = layout.size();
  });
}

ZF_API zf_status zf_engine_save_state(zf_engine* engine, const zf_tensor* buffers, size_t count, int64_t* counters,
                                      double* loss_scale) {
  return zf::api_call([&] { get(engine).save_state(buffers, count, counters, loss_scale); });
}

ZF_API zf_status zf_engine_load_state(zf_engine* engine, const zf_tensor* buffers, size_t count,
                                      const int64_t* counters, double loss_scale) {
  return zf::api_call([&] { get(engine).load_state(buffers, count, counters, loss_scale); });
}

}  // extern "C"

#include "engine/testing.hpp"

namespace zf {
namespace testing {

void inject_host_lane_fault(zf_engine* engine, const char* message) {
  engine->engine.inject_host_lane_fault_for_testing(message);
}
int compute_lane_threads(const zf_engine* engine, size_t device) {
  return engine->engine.engine(device).compute_threads();
}
int host_lane_threads(const zf_engine* engine, size_t device) { return engine->engine.engine(device).host_threads(); }
void use_backend(zf_engine* engine, std::unique_ptr<Backend> backend, size_t device) {
  engine->engine.engine(device).replace_backend_for_testing(std::move(backend));
}
void set_fuse_window_close(zf_engine* engine, bool fuse) {
  for (size_t d = 0; d < engine->engine.device_count(); ++d)
    engine->engine.engine(d).set_fuse_window_close_for_testing(fuse);
}
size_t host_memory_capacity(const zf_engine* engine) {
  size_t bytes = 0;
  for (size_t d = 0; d < engine->engine.device_count(); ++d) bytes += engine->engine.engine(d).host_memory_capacity();
  return bytes;
}

namespace {
// One engine's list (a testing hook of Engine) over the group's devices, device by device.
template <class Item>
std::vector<Item> over_devices(const zf_engine* engine, std::vector<Item> (Engine::*list)() const) {
  std::vector<Item> all;
  for (size_t d = 0; d < engine->engine.device_count(); ++d) {
    const std::vector<Item> device = (engine->engine.engine(d).*list)();
    all.insert(all.end(), device.begin(), device.end());
  }
  return all;
}
}  // namespace

std::vector<const void*> host_stream_bases(const zf_engine* engine) {
  return over_devices(engine, &Engine::host_stream_bases_for_testing);
}

std::vector<std::pair<const void*, size_t>> host_stream_blocks(const zf_engine* engine) {
  return over_devices(engine, &Engine::host_stream_blocks_for_testing);
}

void synchronize_backend(zf_engine* engine) {
  for (size_t d = 0; d < engine->engine.device_count(); ++d) engine->engine.engine(d).synchronize_backend();
}
std::vector<BucketSpan> buckets(const zf_engine* engine) {
  std::vector<BucketSpan> out;
  for (const auto& b : engine->engine.engine(0).buckets_for_testing())
    out.push_back(BucketSpan{b.first, b.last, b.dtype, b.max_bytes});
  return out;
}
zf_engine* create_engine_in_parts(const std::vector<zf_tensor>& params, const std::vector<int32_t>& param_groups,
                                  const std::vector<zf_engine_group>& groups, const zf_engine_config& config,
                                  const std::vector<size_t>& parts) {
  auto engine = std::make_unique<zf_engine>(params.data(), param_groups.data(), params.size(), groups.data(),
                                            groups.size(), config, &parts);
  LiveEngines::instance().add(engine.get());
  return engine.release();
}

}  // namespace testing
}  // namespace zf
