#include "common/thread_pool.hpp"

#include <algorithm>
#include <memory>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace zf {

ThreadPool::ThreadPool(int num_threads, std::vector<int> cores) {
  num_threads = std::max(1, num_threads);
  errors_.resize(static_cast<size_t>(num_threads));
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this, i] { worker_loop(i); });
#if defined(__linux__)
    if (!cores.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cores[static_cast<size_t>(i) % cores.size()], &set);
      // Pinning is a performance hint; a refused mask (e.g. a core outside the cgroup)
      // leaves the thread unpinned rather than failing the pool.
      pthread_setaffinity_np(workers_.back().native_handle(), sizeof(set), &set);
    }
#endif
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen_generation = 0;
  for (;;) {
    const std::function<void(int, int)>* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      task = task_;
    }
    std::exception_ptr error;
    try {
      (*task)(index, size());
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      errors_[static_cast<size_t>(index)] = error;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::run(const std::function<void(int, int)>& task) {
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  if (workers_.empty()) {
    task(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    pending_ = static_cast<int>(workers_.size());
    std::fill(errors_.begin(), errors_.end(), nullptr);
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr caller_error;
  try {
    task(0, size());
  } catch (...) {
    caller_error = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  if (caller_error) std::rethrow_exception(caller_error);
  for (auto& error : errors_) {
    if (error) std::rethrow_exception(error);
  }
}

int host_cpu_count() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

int default_thread_count() {
  // pt_reserved_cores_perc = 0.5: the framework keeps floor(cores / 2), zenflow the rest.
  const int cores = host_cpu_count();
  return std::max(1, cores - cores / 2);
}

namespace {
std::mutex& global_pool_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::shared_ptr<ThreadPool>& global_pool_slot() {
  static std::shared_ptr<ThreadPool> pool;
  return pool;
}
}  // namespace

std::shared_ptr<ThreadPool> global_thread_pool() {
  std::lock_guard<std::mutex> lock(global_pool_mutex());
  auto& pool = global_pool_slot();
  if (!pool) pool = std::make_shared<ThreadPool>(default_thread_count());
  return pool;
}

void resize_global_thread_pool(int num_threads, std::vector<int> cores) {
  auto fresh = std::make_shared<ThreadPool>(num_threads, std::move(cores));
  std::shared_ptr<ThreadPool> previous;
  {
    std::lock_guard<std::mutex> lock(global_pool_mutex());
    previous = std::move(global_pool_slot());
    global_pool_slot() = std::move(fresh);
  }
  // `previous` is destroyed here, or by the last kernel still running on it.
}

}  // namespace zf

namespace zf {
namespace {
thread_local int region_depth = 0;
}
bool in_parallel_region() { return region_depth > 0; }
}  // namespace zf
