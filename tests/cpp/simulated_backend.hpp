// A simulated asynchronous backend for the engine's tests: device memory is host memory,
// every op is queued on its lane (compute, down, up, reduce) and run lazily, in a random
// interleaving of the lanes, honouring only the orderings the engine states with record /
// wait / host_wait, as CUDA streams and events do (test_engine_async.cpp, and the
// data-parallel tests in test_engine_parallel.cpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "engine/backend.hpp"
#include "engine/host_backend.hpp"

namespace zf_sim {

class SimulatedEvent final : public zf::BackendEvent {
 public:
  bool complete = false;  // guarded by the world's mutex
};

class SimulatedAsyncBackend;

// The simulated devices of one engine: one lock, and progress anywhere. An engine over
// several devices orders one device's lane after another device's event (the exchange of
// the step's scalars); waiting for such a lane lets the other device run too.
struct SimulatedWorld {
  std::recursive_mutex mutex;
  std::vector<SimulatedAsyncBackend*> devices;
  bool run_one_anywhere();
};

// Device memory is host memory, but the engine is told it is not (host_visible() is false),
// so it takes the CUDA paths: readbacks, uploads, events. Work items capture their
// arguments by value at enqueue (as a kernel launch does); the memory they point at is read
// when they run.
class SimulatedAsyncBackend final : public zf::Backend {
 public:
  // eagerness_percent: the chance that an enqueue lets the device run a few items.
  // slow_copies: the copy lanes run only when the compute lane cannot (copies lag behind).
  SimulatedAsyncBackend(uint64_t seed, int eagerness_percent, bool slow_copies = false,
                        std::shared_ptr<SimulatedWorld> world = std::make_shared<SimulatedWorld>())
      : host_(1), world_(std::move(world)), rng_(seed), eagerness_(eagerness_percent), slow_copies_(slow_copies) {
    std::lock_guard<std::recursive_mutex> lock(world_->mutex);
    world_->devices.push_back(this);
  }
  ~SimulatedAsyncBackend() override {
    std::lock_guard<std::recursive_mutex> lock(world_->mutex);
    for (auto& lane : lanes_) lane.clear();  // the engine is gone: nothing will wait any more
    world_->devices.erase(std::find(world_->devices.begin(), world_->devices.end(), this));
  }

  size_t column_stats_workspace_bytes(const zf_tensor*, size_t) override { return 0; }
  void column_stats(zf::ColumnStatsPlan& plan, const zf_tensor* grads, const zf_tensor* col_sq, float* total_sq,
                    int32_t* nonfinite, void*, size_t) override {
    auto copy = std::make_shared<zf::ColumnStatsPlan>(plan);
    std::vector<zf_tensor> g(grads, grads + plan.size()), c(col_sq, col_sq + plan.size());
    enqueue(zf::Lane::kCompute, [this, copy, g, c, total_sq, nonfinite] {
      host_.column_stats(*copy, g.data(), c.data(), total_sq, nonfinite, nullptr, 0);
    });
  }
  void step_scalars(zf::StepScalars* scalars, const float* col_sq, int64_t columns, const int32_t* flags,
                    int64_t flag_count, double* chunk_sums, double loss_scale, double max_grad_norm) override {
    enqueue(zf::Lane::kCompute, [=] {
      host_.step_scalars(scalars, col_sq, columns, flags, flag_count, chunk_sums, loss_scale, max_grad_norm);
    });
  }
  void scalar_partial(zf::ScalarPartial* partial, const float* col_sq, int64_t columns, const int32_t* flags,
                      int64_t flag_count, double* chunk_sums) override {
    enqueue(zf::Lane::kCompute, [=] { host_.scalar_partial(partial, col_sq, columns, flags, flag_count, chunk_sums); });
  }
  void combine_scalars(zf::StepScalars* scalars, const zf::ScalarPartial* partials, int64_t count, double loss_scale,
                       double max_grad_norm) override {
    enqueue(zf::Lane::kCompute, [=] { host_.combine_scalars(scalars, partials, count, loss_scale, max_grad_norm); });
  }
  void adamw_selected(zf::AdamwSelectedPlan& plan, const zf::AdamwSelectedPointers* pointers,
                      const zf::StepScalars* scalars) override {
    auto copy = std::make_shared<zf::AdamwSelectedPlan>(plan);
    std::vector<zf::AdamwSelectedPointers> p(pointers, pointers + plan.size());
    enqueue(zf::Lane::kCompute, [this, copy, p, scalars] { host_.adamw_selected(*copy, p.data(), scalars); });
  }
  void pack(const zf::PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected,
            void* packed) override {
    auto copy = std::make_shared<zf::PackPlan>(plan);
    const size_t n = plan.layout().size();
    std::vector<zf_tensor> m(matrices, matrices + n);
    std::vector<const int32_t*> s(selected, selected + n);
    enqueue(zf::Lane::kCompute, [this, copy, m, s, packed] { host_.pack(*copy, m.data(), s.data(), packed); });
  }
  void scatter(const zf::PackPlan& plan, const zf_tensor* matrices, const int32_t* const* selected,
               const void* packed) override {
    auto copy = std::make_shared<zf::PackPlan>(plan);
    const size_t n = plan.layout().size();
    std::vector<zf_tensor> m(matrices, matrices + n);
    std::vector<const int32_t*> s(selected, selected + n);
    enqueue(zf::Lane::kCompute, [this, copy, m, s, packed] { host_.scatter(*copy, m.data(), s.data(), packed); });
  }
  void copy_device(void* dst, const void* src, size_t bytes) override {
    enqueue(zf::Lane::kCompute, [=] { std::memmove(dst, src, bytes); });
  }
  void fill_device_zero(void* device, size_t bytes) override {
    enqueue(zf::Lane::kCompute, [=] { std::memset(device, 0, bytes); });
  }
  void copy_from_peer(void* dst, const zf::Backend&, const void* src, size_t bytes) override {
    enqueue(zf::Lane::kCompute, [=] { std::memcpy(dst, src, bytes); });
  }
  void copy_down(void* host, const void* device, size_t bytes) override {
    enqueue(zf::Lane::kDown, [=] { std::memcpy(host, device, bytes); });
  }
  void copy_up(void* device, const void* host, size_t bytes) override {
    enqueue(zf::Lane::kUp, [=] { std::memcpy(device, host, bytes); });
  }

  zf::Event record(zf::Lane lane) override {
    auto event = std::make_shared<SimulatedEvent>();
    enqueue(lane, Item{nullptr, event, nullptr});
    return event;
  }
  void wait(zf::Lane lane, const zf::Event& event) override {
    if (event) enqueue(lane, Item{nullptr, nullptr, std::static_pointer_cast<SimulatedEvent>(event)});
  }
  void host_wait(const zf::Event& event) override {
    if (!event) return;
    if (std::this_thread::get_id() != creator_ && lane_wait_latency_.count() > 0) {
      // A copy that takes this long to land (outside the lock: the device runs meanwhile).
      lane_waits_.fetch_add(1);
      std::this_thread::sleep_for(lane_wait_latency_);
    }
    std::lock_guard<std::recursive_mutex> lock(world_->mutex);
    // A thread of the engine's that waits without having bound itself to the backend would,
    // on CUDA, create a context on whatever device is current there (GPU 0).
    if (std::this_thread::get_id() != creator_ && bound_.count(std::this_thread::get_id()) == 0)
      zf::fail(ZF_ERROR_INTERNAL, "simulated backend: host_wait on an engine thread that did not bind itself");
    auto& e = static_cast<SimulatedEvent&>(*event);
    while (!e.complete) {
      if (!run_one() && !world_->run_one_anywhere())
        zf::fail(ZF_ERROR_INTERNAL, "simulated backend: deadlock (a wait that nothing completes)");
    }
  }
  bool done(const zf::Event& event) override {
    if (!event) return true;
    std::lock_guard<std::recursive_mutex> lock(world_->mutex);
    advance_randomly();
    return static_cast<SimulatedEvent&>(*event).complete;
  }
  void synchronize() override {
    std::lock_guard<std::recursive_mutex> lock(world_->mutex);
    while (run_one() || world_->run_one_anywhere()) {
    }
    for (const auto& lane : lanes_) {
      if (!lane.empty()) zf::fail(ZF_ERROR_INTERNAL, "simulated backend: deadlock in synchronize");
    }
  }

  void bind_engine_thread() override {
    std::lock_guard<std::recursive_mutex> lock(world_->mutex);
    bound_.insert(std::this_thread::get_id());
  }
  // The threads bound so far (the training thread, which created the backend, never is).
  size_t bound_threads() {
    std::lock_guard<std::recursive_mutex> lock(world_->mutex);
    return bound_.size();
  }
  // Every host_wait of an engine thread (the host lane's jobs) first sleeps this long; set
  // before the engine steps.
  void set_lane_wait_latency(std::chrono::milliseconds latency) { lane_wait_latency_ = latency; }
  size_t lane_waits() const { return lane_waits_.load(); }
  bool capturing(zf_stream) override { return capturing_; }
  void set_capturing(bool capturing) { capturing_ = capturing; }

  bool host_visible() const override { return false; }
  void set_stream(zf_stream) override {}
  void compute_on(zf::Lane lane) override { on_reduce_lane_ = lane == zf::Lane::kReduce; }
  // Runs the lane the compute lane's work goes to now, up to here: what a device does before
  // a collective enqueued there (stream-ordered collectives for the data-parallel tests).
  void run_ops_lane() { host_wait(record(zf::Lane::kCompute)); }
  void* allocate_device(size_t bytes) override { return host_.allocate_device(bytes); }
  void free_device(void* memory, size_t bytes) override { host_.free_device(memory, bytes); }
  void* allocate_pinned(size_t bytes) override { return host_.allocate_device(bytes); }
  void free_pinned(void* memory, size_t bytes) override { host_.free_device(memory, bytes); }
  zf::ThreadPool& host_pool() override { return host_.host_pool(); }
  zf_device device() const override { return zf_device{ZF_DEVICE_CPU, 0}; }

 private:
  struct Item {
    std::function<void()> work;
    std::shared_ptr<SimulatedEvent> records;
    std::shared_ptr<SimulatedEvent> waits_for;
  };

  void enqueue(zf::Lane lane, std::function<void()> work) { enqueue(lane, Item{std::move(work), nullptr, nullptr}); }
  void enqueue(zf::Lane lane, Item item) {
    std::lock_guard<std::recursive_mutex> lock(world_->mutex);
    if (lane == zf::Lane::kCompute && on_reduce_lane_) lane = zf::Lane::kReduce;
    lanes_[static_cast<int>(lane)].push_back(std::move(item));
    advance_randomly();
  }

  // Sometimes runs a few items: the device makes progress at random moments.
  void advance_randomly() {
    if (static_cast<int>(rng_() % 100) >= eagerness_) return;
    const int steps = static_cast<int>(rng_() % 4) + 1;
    for (int i = 0; i < steps && run_one(); ++i) {
    }
  }

  friend struct SimulatedWorld;

  // Runs the head of one random lane that can make progress; false when none can.
  bool run_one() {
    int runnable[4];
    int count = 0;
    for (int l = 0; l < 4; ++l) {
      if (lanes_[l].empty()) continue;
      const Item& head = lanes_[l].front();
      if (head.waits_for && !head.waits_for->complete) continue;
      runnable[count++] = l;
    }
    if (count == 0) return false;
    int lane = runnable[rng_() % static_cast<uint64_t>(count)];
    if (slow_copies_ && runnable[0] == static_cast<int>(zf::Lane::kCompute)) lane = runnable[0];
    Item item = std::move(lanes_[lane].front());
    lanes_[lane].pop_front();
    if (item.work) item.work();
    if (item.records) item.records->complete = true;
    return true;
  }

  zf::HostBackend host_;
  std::shared_ptr<SimulatedWorld> world_;
  const std::thread::id creator_ = std::this_thread::get_id();
  std::set<std::thread::id> bound_;  // guarded by the world's mutex
  bool capturing_ = false;           // set by the training thread only
  std::chrono::milliseconds lane_wait_latency_{0};
  std::atomic<size_t> lane_waits_{0};
  std::deque<Item> lanes_[4];
  bool on_reduce_lane_ = false;  // compute_on(Lane::kReduce): compute-lane work goes to the reduction lane
  std::mt19937_64 rng_;
  int eagerness_;
  bool slow_copies_;
};

inline bool SimulatedWorld::run_one_anywhere() {
  for (SimulatedAsyncBackend* device : devices) {
    if (device->run_one()) return true;
  }
  return false;
}

}  // namespace zf_sim
