// The host lane (docs/design.md section 7): one engine thread (a WorkQueue's driver) that runs
// the host side of the pipeline on a pool of the engine's own, never the process-wide pool
// and never the compute lane's. Accumulates of staging slots are high-priority jobs; a
// window update is a low-priority job cut into chunks (one matrix each), so an accumulate
// waits at most for the chunk in progress, never for a whole update.
//
// Completion of a job is its WorkJob flag (the host backend's "event"); an exception in a
// job is stored there and rethrown by WorkJob::wait() on the training thread.
//
// The lane's thread is the engine's own: before its first chunk it runs `prepare_thread`
// once (Backend::bind_engine_thread: the CUDA backend selects its device there). A failure
// there fails that chunk's job, and the next chunk tries again.
//
// The lane's timers (accumulate_seconds, update_seconds) count its passes over memory, the
// figures bench_host_lane.py divides bytes by. A chunk's wait for a copy it reads or writes
// (the staging slot's download, the upload copy's last upload, the closing header) goes
// through wait() and is counted in wait_seconds instead: on CUDA such a wait is a PCIe copy
// still in flight, which timed as the pass would read as a slow pass. (On the host backend
// every copy is complete when its call returns and the waits take no time.)
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/thread_pool.hpp"

namespace zf {

class HostLane {
 public:
  HostLane(int threads, std::function<void()> prepare_thread);
  // Drops queued jobs (their wait() throws), lets the running chunk finish, joins the thread.
  ~HostLane();
  HostLane(const HostLane&) = delete;
  HostLane& operator=(const HostLane&) = delete;

  std::shared_ptr<WorkJob> submit_accumulate(WorkQueue::Chunk chunk);
  std::shared_ptr<WorkJob> submit_update(std::vector<WorkQueue::Chunk> chunks);

  double accumulate_seconds() const { return accumulate_ns_.load(std::memory_order_relaxed) * 1e-9; }
  double update_seconds() const { return update_ns_.load(std::memory_order_relaxed) * 1e-9; }
  double wait_seconds() const { return wait_ns_.load(std::memory_order_relaxed) * 1e-9; }
  int threads() const { return threads_; }

  // Inside a chunk (the lane's thread): runs `wait_for_copy`, its time not the chunk's.
  void wait(const std::function<void()>& wait_for_copy);

  // Testing: the next chunk to start throws zf::Error(ZF_ERROR_INTERNAL, message).
  void inject_fault_for_testing(const std::string& message);

 private:
  WorkQueue::Chunk timed(WorkQueue::Chunk chunk, std::atomic<int64_t>* counter);
  void raise_injected_fault();

  int threads_;
  std::function<void()> prepare_thread_;
  bool thread_prepared_ = false;  // read and written by the lane's thread only
  std::atomic<int64_t> accumulate_ns_{0};
  std::atomic<int64_t> update_ns_{0};
  std::atomic<int64_t> wait_ns_{0};
  int64_t chunk_wait_ns_ = 0;  // the running chunk's waits; the lane's thread only
  std::atomic<bool> fault_armed_{false};
  std::mutex fault_mutex_;  // guards fault_message_ (testing only; never taken unless armed)
  std::string fault_message_;
  std::unique_ptr<WorkQueue> queue_;  // last: destroyed (joined) first
};

}  // namespace zf
