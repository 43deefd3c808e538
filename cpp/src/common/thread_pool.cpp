#include "common/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <system_error>

#include "common/error.hpp"

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

namespace zf {

namespace {

// Set on a thread while it runs a pool task (workers: for their whole life). A region
// started there runs inline: the pool's own threads are busy with the outer region, so
// waiting for them would deadlock.
thread_local bool inside_pool_task = false;

// Marks the calling thread as inside a region for one scope (the caller's share of a region).
class PoolTaskScope {
 public:
  PoolTaskScope() : previous_(inside_pool_task) { inside_pool_task = true; }
  ~PoolTaskScope() { inside_pool_task = previous_; }
  PoolTaskScope(const PoolTaskScope&) = delete;
  PoolTaskScope& operator=(const PoolTaskScope&) = delete;

 private:
  bool previous_;
};

std::atomic<int> simulated_thread_start_failure{0};
std::atomic<int> default_thread_count_override{0};

}  // namespace

void set_thread_start_failure_for_testing(int fail_at_index) {
  simulated_thread_start_failure.store(fail_at_index, std::memory_order_relaxed);
}

void set_default_thread_count_for_testing(int num_threads) {
  default_thread_count_override.store(num_threads, std::memory_order_relaxed);
}

bool in_parallel_region() { return inside_pool_task; }

ThreadPool::ThreadPool(int num_threads, std::vector<int> cores) {
  num_threads = std::max(1, num_threads);
  errors_.resize(static_cast<size_t>(num_threads));
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) {
    try {
      if (i == simulated_thread_start_failure.load(std::memory_order_relaxed)) {
        throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                                "simulated by set_thread_start_failure_for_testing");
      }
      workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (const std::exception& e) {
      // The destructor does not run for a half-built object: without this, the started
      // workers would stay joinable (std::terminate) or wait forever for a region.
      stop_workers();
      fail(ZF_ERROR_OUT_OF_MEMORY, "num_threads: could not start thread ", i, " of ", num_threads, ": ", e.what());
    }
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

ThreadPool::ThreadPool(ParallelRuntime runtime, int num_threads)
    : runtime_(runtime), runtime_threads_(std::max(1, num_threads)) {
  require(runtime_.is_set(), ZF_ERROR_INVALID_VALUE, "runtime: a parallel runtime needs a run function, got NULL");
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

void ThreadPool::worker_loop(int index) {
  inside_pool_task = true;  // a worker only ever runs pool tasks
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

namespace {

// One region handed to a parallel runtime: what each of its threads needs, and what the
// calls tell about the runtime keeping its contract.
struct RuntimeRegion {
  const std::function<void(int, int)>* task = nullptr;
  int thread_count = 0;  // the pool's size: the thread count every task sees
  std::vector<std::exception_ptr> errors;
  std::unique_ptr<std::atomic<int>[]> calls;  // per runtime thread index
  std::atomic<int> team_size{0};
  std::atomic<bool> broken_call{false};
};

// zf_parallel_body for RuntimeRegion: runtime thread i of n runs the tasks of indices
// i, i + n, ... so that every index runs once whatever the team's size.
void run_runtime_share(void* context, int thread_index, int team_size) {
  auto& region = *static_cast<RuntimeRegion*>(context);
  int expected = 0;
  if (team_size < 1 || team_size > region.thread_count || thread_index < 0 || thread_index >= team_size ||
      (!region.team_size.compare_exchange_strong(expected, team_size) && expected != team_size)) {
    region.broken_call.store(true);
    return;
  }
  region.calls[thread_index].fetch_add(1);
  PoolTaskScope scope;
  for (int index = thread_index; index < region.thread_count; index += team_size) {
    try {
      (*region.task)(index, region.thread_count);
    } catch (...) {
      region.errors[static_cast<size_t>(index)] = std::current_exception();
    }
  }
}

}  // namespace

void ThreadPool::run_on_runtime(const std::function<void(int, int)>& task) {
  RuntimeRegion region;
  region.task = &task;
  region.thread_count = runtime_threads_;
  region.errors.resize(static_cast<size_t>(runtime_threads_));
  region.calls = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(runtime_threads_));
  for (int i = 0; i < runtime_threads_; ++i) region.calls[i].store(0);
  runtime_.run(runtime_.context, &run_runtime_share, &region, runtime_threads_);
  const int team = region.team_size.load();
  bool kept_contract = !region.broken_call.load() && team >= 1;
  for (int i = 0; kept_contract && i < team; ++i) kept_contract = region.calls[i].load() == 1;
  require(kept_contract, ZF_ERROR_INTERNAL, "parallel runtime: a region asked for ", runtime_threads_,
          " threads did not call the body exactly once for each thread index of one team size (team size ", team,
          ", see zf_set_parallel_runtime)");
  for (auto& error : region.errors) {
    if (error) std::rethrow_exception(error);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& task) {
  if (inside_pool_task) {
    task(0, 1);
    return;
  }
  if (runtime_.is_set()) {
    run_on_runtime(task);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mutex_);
  if (workers_.empty()) {
    PoolTaskScope scope;
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
    PoolTaskScope scope;
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

int online_cpu_count() {
#if defined(__linux__)
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0) return static_cast<int>(online);
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

int max_thread_count() { return std::max(64, 4 * host_cpu_count()); }

int default_thread_count() {
  const int override_count = default_thread_count_override.load(std::memory_order_relaxed);
  if (override_count > 0) return override_count;
  return host_cpu_count();
}

int reserved_split_thread_count(int cores, double reserved_share) {
  // DeepSpeed's rounding (zenflow_utils._split_affinity): the framework's reserve is rounded
  // up, so a share of 0.25 on 2 cores reserves 1 and the two sides never oversubscribe. The
  // product is computed as Python computes it, so the two agree on every share.
  const int reserved = std::min(cores, static_cast<int>(std::ceil(static_cast<double>(cores) * reserved_share)));
  return std::max(1, cores - reserved);
}

namespace {

// The global pool and the mutex that guards its slot. Allocated on first use and never
// freed: exit() runs static destructors while other threads may still be inside an op on
// the pool, and a freed pool (or mutex) under them would crash or hang the exit.
struct GlobalPoolState {
  std::mutex mutex;
  std::shared_ptr<ThreadPool> pool;
  ParallelRuntime runtime;
};

std::shared_ptr<ThreadPool> make_pool(int num_threads, std::vector<int> cores, ParallelRuntime runtime) {
  if (runtime.is_set()) return std::make_shared<ThreadPool>(runtime, num_threads);
  return std::make_shared<ThreadPool>(num_threads, std::move(cores));
}

std::atomic<GlobalPoolState*> global_pool_state_pointer{nullptr};

GlobalPoolState& global_pool_state() {
  GlobalPoolState* state = global_pool_state_pointer.load(std::memory_order_acquire);
  if (state != nullptr) return *state;
  // Lock-free creation, so that the fork handler below never meets a half-taken lock.
  auto fresh = std::make_unique<GlobalPoolState>();
  if (global_pool_state_pointer.compare_exchange_strong(state, fresh.get(), std::memory_order_acq_rel)) {
    return *fresh.release();
  }
  return *state;  // another thread won; ours is freed
}

#if defined(__linux__)
// In a forked child only the forking thread exists: the pool's workers are gone (a region
// would wait for them forever) and its mutexes may have been copied while held by threads
// that no longer exist. The child forgets the whole state without touching it (joining or
// destroying would hang or crash) and the next global_thread_pool() builds a fresh one.
// The old state is leaked on purpose: its shared_ptr keeps the old pool from ever being
// destroyed, even when a copy held by the forking thread is released later.
std::atomic<uint64_t> fork_generation_count{0};

void forget_global_pool_in_child() {
  global_pool_state_pointer.store(nullptr, std::memory_order_relaxed);
  fork_generation_count.fetch_add(1, std::memory_order_relaxed);
}

// Registered at load time, before any pool can exist, so no fork can slip in between the
// first pool and the registration.
[[maybe_unused]] const bool fork_handler_registered =
    pthread_atfork(nullptr, nullptr, &forget_global_pool_in_child) == 0;
#endif

}  // namespace

uint64_t fork_generation() {
#if defined(__linux__)
  return fork_generation_count.load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

std::shared_ptr<ThreadPool> global_thread_pool() {
  GlobalPoolState& state = global_pool_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.pool) state.pool = make_pool(default_thread_count(), {}, state.runtime);
  return state.pool;
}

namespace {

// Swaps in a pool of `num_threads` (or of the current size when 0), built before the swap:
// if the OS refuses a thread, the old pool stays in place. The old pool is destroyed here, or
// by the last kernel still running on it. Concurrent calls each install a complete pool.
void replace_global_pool(int num_threads, std::vector<int> cores, ParallelRuntime runtime, bool set_runtime) {
  GlobalPoolState& state = global_pool_state();
  ParallelRuntime chosen;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    chosen = set_runtime ? runtime : state.runtime;
    if (num_threads == 0) num_threads = state.pool ? state.pool->size() : default_thread_count();
  }
  require(cores.empty() || !chosen.is_set(), ZF_ERROR_INVALID_VALUE,
          "cores: pinning is the parallel runtime's business while one is set (zf_set_parallel_runtime)");
  std::shared_ptr<ThreadPool> fresh = make_pool(num_threads, std::move(cores), chosen);
  std::shared_ptr<ThreadPool> previous;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    previous = std::move(state.pool);
    state.pool = std::move(fresh);
    state.runtime = chosen;
  }
}

}  // namespace

void resize_global_thread_pool(int num_threads, std::vector<int> cores) {
  replace_global_pool(num_threads, std::move(cores), ParallelRuntime{}, false);
}

void set_global_parallel_runtime(ParallelRuntime runtime) { replace_global_pool(0, {}, runtime, true); }

bool global_parallel_runtime_is_set() {
  GlobalPoolState& state = global_pool_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.runtime.is_set();
}

// ---- WorkQueue ------------------------------------------------------------------------

namespace {
using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}
}  // namespace

void WorkJob::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool WorkJob::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

double WorkJob::queued_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_seconds_;
}

double WorkJob::total_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_seconds_;
}

// A job in a queue with the driver's progress through it. Only the driver thread touches
// next_chunk and started_at (and the destructor, once the driver has been joined).
struct WorkQueue::Pending {
  std::shared_ptr<WorkJob> job;
  std::vector<Chunk> chunks;
  size_t next_chunk = 0;
  Clock::time_point submitted_at;
  bool started = false;

  void mark_started(Clock::time_point now) {
    if (started) return;
    started = true;
    std::lock_guard<std::mutex> lock(job->mutex_);
    job->queued_seconds_ = seconds_between(submitted_at, now);
  }

  void complete(std::exception_ptr error) {
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lock(job->mutex_);
      if (!started) job->queued_seconds_ = seconds_between(submitted_at, now);
      job->total_seconds_ = seconds_between(submitted_at, now);
      job->error_ = std::move(error);
      job->done_ = true;
    }
    job->done_cv_.notify_all();
  }
};

namespace {
std::exception_ptr dropped_error(size_t next_chunk, size_t chunk_count) {
  return std::make_exception_ptr(Error(ZF_ERROR_INTERNAL, "WorkQueue: job dropped by the queue's destruction with " +
                                                              std::to_string(chunk_count - next_chunk) + " of " +
                                                              std::to_string(chunk_count) + " chunks not run"));
}
}  // namespace

WorkQueue::WorkQueue(std::shared_ptr<ThreadPool> pool) : pool_(std::move(pool)) {
  require(pool_ != nullptr, ZF_ERROR_INVALID_VALUE, "pool: WorkQueue needs a pool, got nullptr");
  try {
    driver_ = std::thread([this] { driver_loop(); });
  } catch (const std::exception& e) {
    fail(ZF_ERROR_OUT_OF_MEMORY, "WorkQueue: could not start the driver thread: ", e.what());
  }
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_cv_.notify_all();
  driver_.join();  // returns once the chunk in progress (if any) is done
  for (auto& queue : queues_) {
    for (auto& pending : queue) pending->complete(dropped_error(pending->next_chunk, pending->chunks.size()));
    queue.clear();
  }
}

std::shared_ptr<WorkJob> WorkQueue::submit(Priority priority, std::vector<Chunk> chunks) {
  auto pending = std::make_shared<Pending>();
  pending->job = std::make_shared<WorkJob>();
  pending->chunks = std::move(chunks);
  pending->submitted_at = Clock::now();
  std::shared_ptr<WorkJob> job = pending->job;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queues_[static_cast<int>(priority)].push_back(std::move(pending));
  }
  wake_cv_.notify_one();
  return job;
}

void WorkQueue::driver_loop() {
  for (;;) {
    std::shared_ptr<Pending> current;
    int current_queue = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_cv_.wait(lock, [&] { return stopping_ || !queues_[0].empty() || !queues_[1].empty(); });
      if (stopping_) return;
      // Chosen afresh before every chunk: a kHigh job submitted while a kLow job runs goes
      // next. The chosen job stays at the front of its queue until it completes, so jobs of
      // one priority run in submission order and a preempted kLow job resumes where it was.
      current_queue = queues_[static_cast<int>(Priority::kHigh)].empty() ? static_cast<int>(Priority::kLow)
                                                                         : static_cast<int>(Priority::kHigh);
      current = queues_[current_queue].front();
    }
    std::exception_ptr error;
    if (current->next_chunk < current->chunks.size()) {
      current->mark_started(Clock::now());
      Chunk& chunk = current->chunks[current->next_chunk];
      try {
        chunk(*pool_);
      } catch (...) {
        error = std::current_exception();  // the job's later chunks are skipped
      }
      chunk = nullptr;  // release what the chunk captured as soon as it has run
      ++current->next_chunk;
    }
    if (error || current->next_chunk == current->chunks.size()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queues_[current_queue].pop_front();
      }
      current->complete(std::move(error));
    }
  }
}

}  // namespace zf
