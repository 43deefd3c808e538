// zenflow's own persistent worker pool (no OpenMP): the host kernels' threads, kept apart
// from the training framework's intra-op threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace zf {

class ThreadPool {
 public:
  // num_threads >= 1 counts the calling thread: the pool starts num_threads - 1 workers.
  // Worker i (1-based) is pinned to cores[(i) % cores.size()] when cores is non-empty, and
  // the calling thread is never pinned.
  explicit ThreadPool(int num_threads, std::vector<int> cores = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(thread_index, thread_count) once on every thread, the caller being index 0,
  // and returns when all are done. If any task throws, the first exception (lowest thread
  // index) is rethrown here after every thread has finished: no hang, no lost error.
  // Calls from several threads are serialised.
  void run(const std::function<void(int, int)>& task);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel region at a time
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int, int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;
};

// The pool the host kernels use, created on first use with the default size. Callers hold
// the pointer for the duration of their parallel region: a concurrent resize then swaps in
// a new pool and the old one is destroyed (its threads joined) after its last user is done.
std::shared_ptr<ThreadPool> global_thread_pool();
void resize_global_thread_pool(int num_threads, std::vector<int> cores);
int default_thread_count();
int host_cpu_count();

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
