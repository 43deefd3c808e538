#include "engine/host_lane.hpp"

#include <chrono>
#include <utility>

#include "common/error.hpp"

namespace zf {

HostLane::HostLane(int threads, std::function<void()> prepare_thread)
    : threads_(threads),
      prepare_thread_(std::move(prepare_thread)),
      queue_(std::make_unique<WorkQueue>(std::make_shared<ThreadPool>(threads))) {}

HostLane::~HostLane() { queue_.reset(); }

void HostLane::inject_fault_for_testing(const std::string& message) {
  std::lock_guard<std::mutex> lock(fault_mutex_);
  fault_message_ = message;
  fault_armed_.store(true, std::memory_order_release);
}

void HostLane::raise_injected_fault() {
  if (!fault_armed_.load(std::memory_order_acquire)) return;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(fault_mutex_);
    if (!fault_armed_.exchange(false)) return;
    message = fault_message_;
  }
  throw Error(ZF_ERROR_INTERNAL, message);
}

namespace {

int64_t nanoseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void HostLane::wait(const std::function<void()>& wait_for_copy) {
  const auto start = std::chrono::steady_clock::now();
  wait_for_copy();  // a throw fails the chunk, whose time is not counted
  chunk_wait_ns_ += nanoseconds_since(start);
}

WorkQueue::Chunk HostLane::timed(WorkQueue::Chunk chunk, std::atomic<int64_t>* counter) {
  return [this, chunk = std::move(chunk), counter](ThreadPool& pool) {
    if (!thread_prepared_) {
      if (prepare_thread_) prepare_thread_();
      thread_prepared_ = true;
    }
    raise_injected_fault();
    chunk_wait_ns_ = 0;
    const auto start = std::chrono::steady_clock::now();
    chunk(pool);
    const int64_t waited = chunk_wait_ns_;
    counter->fetch_add(nanoseconds_since(start) - waited, std::memory_order_relaxed);
    wait_ns_.fetch_add(waited, std::memory_order_relaxed);
  };
}

std::shared_ptr<WorkJob> HostLane::submit_accumulate(WorkQueue::Chunk chunk) {
  std::vector<WorkQueue::Chunk> chunks;
  chunks.push_back(timed(std::move(chunk), &accumulate_ns_));
  return queue_->submit(WorkQueue::Priority::kHigh, std::move(chunks));
}

std::shared_ptr<WorkJob> HostLane::submit_update(std::vector<WorkQueue::Chunk> chunks) {
  for (auto& chunk : chunks) chunk = timed(std::move(chunk), &update_ns_);
  return queue_->submit(WorkQueue::Priority::kLow, std::move(chunks));
}

}  // namespace zf
