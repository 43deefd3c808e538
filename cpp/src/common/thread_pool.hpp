// zenflow's own host threads (no OpenMP), kept apart from the training framework's
// intra-op threads.
//
// ThreadPool: a set of threads that runs one parallel region at a time. Each pool
// serialises only its own regions: independent pools (the engine's compute lane and host
// lane, say) run at once on disjoint threads. A region started from inside a region (of
// any pool) runs inline on the calling thread, as at::parallel_for does, so an op called
// from a pool task never deadlocks.
//
// WorkQueue: one driver thread that runs jobs on a pool in priority order. A job is a list
// of chunks; between two chunks of a job, any pending job of higher priority runs first, so
// a short high-priority job (an accumulate) never waits for a whole low-priority one (a
// window update), only for the chunk in progress.
//
// A pool can also hand its regions to a parallel runtime outside zenflow (the framework's
// OpenMP team, zf_set_parallel_runtime): it then has no threads of its own.
//
// Fork: a child forked while pools exist gets fresh state (pthread_atfork): the global pool
// is dropped without being joined (its threads do not exist in the child) and recreated on
// first use. Exit: the global pool is never destroyed, so threads still inside an op at
// exit() never see it freed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "zenflow/types.h"

namespace zf {

// A parallel runtime that runs regions on its own threads (see zf_set_parallel_runtime).
struct ParallelRuntime {
  zf_parallel_run run = nullptr;
  void* context = nullptr;
  bool is_set() const { return run != nullptr; }
};

class ThreadPool {
 public:
  // num_threads >= 1 counts the calling thread: the pool starts num_threads - 1 workers.
  // Worker i (1-based) is pinned to cores[i % cores.size()] when cores is non-empty (a
  // refused mask leaves it unpinned); the calling thread is never pinned. Throws zf::Error
  // (ZF_ERROR_OUT_OF_MEMORY) when the OS refuses a thread; the workers already started are
  // then stopped and joined before the exception leaves.
  explicit ThreadPool(int num_threads, std::vector<int> cores = {});
  // A pool without threads of its own: every region goes to `runtime`, asking for
  // num_threads threads. Tasks still see thread counts of num_threads: when the runtime's
  // team is smaller, one of its threads runs several indices' tasks in turn.
  ThreadPool(ParallelRuntime runtime, int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return runtime_.is_set() ? runtime_threads_ : static_cast<int>(workers_.size()) + 1; }
  bool uses_runtime() const { return runtime_.is_set(); }

  // Runs task(thread_index, thread_count) once on every thread, the caller being index 0,
  // and returns when all are done. If any task throws, the first exception (lowest thread
  // index) is rethrown here after every thread has finished: no hang, no lost error.
  // Called from inside a region (any pool), it runs task(0, 1) inline. Calls from several
  // threads on one pool are serialised; different pools never wait for each other.
  void run(const std::function<void(int, int)>& task);

 private:
  void worker_loop(int index);
  void stop_workers();
  void run_on_runtime(const std::function<void(int, int)>& task);

  ParallelRuntime runtime_;
  int runtime_threads_ = 0;

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one region at a time, for this pool only
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int, int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;
};

// True on a thread that is running a pool task (any pool): a region started there runs inline.
bool in_parallel_region();

// The process-wide pool of the plain ops (zf_set_num_threads), created on first use with
// the default size. Callers hold the pointer for the duration of their region: a concurrent
// resize swaps in a new pool, and the old one is joined after its last user is done.
std::shared_ptr<ThreadPool> global_thread_pool();

// How many forks this process descends from (0 in the process that loaded zenflow; a
// forked child sees its parent's count + 1). An object holding threads records it at
// creation: in a later generation its threads do not exist, and its mutexes and condition
// variables may be copies taken while held or waited on, so it must be left untouched.
uint64_t fork_generation();
// Fails with ZF_ERROR_INVALID_VALUE for a core list while a parallel runtime is set.
void resize_global_thread_pool(int num_threads, std::vector<int> cores);
// Hands the global pool's regions to `runtime` (or back to zenflow's own threads when it is
// not set), keeping the pool's size. A forked child starts without a runtime.
void set_global_parallel_runtime(ParallelRuntime runtime);
bool global_parallel_runtime_is_set();
// The process-wide pool's default size: every usable core. Its calls are synchronous (the
// training thread waits inside them, and with it the framework's own threads), so they
// may use the whole machine.
int default_thread_count();
// The split of `cores` for work that overlaps the training loop (the engine's host lane):
// the framework keeps ceil(cores * reserved_share) cores (pt_reserved_cores_perc), zenflow
// takes the rest, at least 1. The engine's thread plan (engine.h) applies it to a rank's cores.
int reserved_split_thread_count(int cores, double reserved_share);
int host_cpu_count();
// The most threads any pool, lane or measurement of zenflow's takes: max(64, 4 x
// host_cpu_count()). More only oversubscribe the cores; a typo (1000 for 100) would
// otherwise start a thousand threads.
int max_thread_count();
// The host's online CPUs, whatever this process's affinity (at least 1).
int online_cpu_count();

// ---- testing hooks ----------------------------------------------------------------------
// For tests only: they change process-wide behaviour and are not thread-safe against pools
// being created concurrently.
//
// From now on, every ThreadPool constructor fails to start its worker `fail_at_index`
// (1-based, as the OS refusing a thread would); 0 turns the simulation off.
void set_thread_start_failure_for_testing(int fail_at_index);
// Overrides default_thread_count() (the size of a global pool created on first use);
// 0 restores the real default.
void set_default_thread_count_for_testing(int num_threads);

// A job of a WorkQueue: complete once its last chunk has run (or it failed or was dropped).
class WorkJob {
 public:
  // Blocks until the job is complete; rethrows the exception of the chunk that failed (the
  // job's later chunks are skipped), or throws zf::Error(ZF_ERROR_INTERNAL) for a job
  // dropped by the queue's destruction.
  void wait();
  bool done() const;
  // Seconds from submit() to the start of the first chunk, and from submit() to completion.
  double queued_seconds() const;
  double total_seconds() const;

 private:
  friend class WorkQueue;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  double queued_seconds_ = 0.0, total_seconds_ = 0.0;
};

class WorkQueue {
 public:
  enum class Priority { kHigh = 0, kLow = 1 };
  // One chunk of a job, run on the queue's pool from the driver thread.
  using Chunk = std::function<void(ThreadPool& pool)>;

  explicit WorkQueue(std::shared_ptr<ThreadPool> pool);
  // Drops the jobs not yet started (their wait() throws), lets the running chunk finish,
  // and joins the driver thread. Never waits for a dropped job.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues a job; jobs of one priority run in submission order, kHigh before kLow, and a
  // kHigh job submitted while a kLow job runs starts after that job's current chunk.
  std::shared_ptr<WorkJob> submit(Priority priority, std::vector<Chunk> chunks);
  ThreadPool& pool() { return *pool_; }

 private:
  struct Pending;
  void driver_loop();

  std::shared_ptr<ThreadPool> pool_;
  std::mutex mutex_;
  std::condition_variable wake_cv_;
  std::deque<std::shared_ptr<Pending>> queues_[2];
  bool stopping_ = false;
  std::thread driver_;
};

// [begin, end) split into `parts` contiguous ranges; the range of part `index`. Ranges
// differ in length by at most one element.
inline void split_range(int64_t begin, int64_t end, int index, int parts, int64_t* part_begin, int64_t* part_end) {
  const int64_t total = end - begin;
  const int64_t base = total / parts;
  const int64_t extra = total % parts;
  *part_begin = begin + index * base + (index < extra ? index : extra);
  *part_end = *part_begin + base + (index < extra ? 1 : 0);
}

}  // namespace zf
