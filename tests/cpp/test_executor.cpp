// The executor: thread pools (concurrent pools, nested regions, refused threads), the
// WorkQueue (priorities between chunks, FIFO, errors, destruction) and the global pool
// across fork() and exit().
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/thread_pool.hpp"
#include "test_fork.hpp"
#include "zenflow/zenflow.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using Priority = zf::WorkQueue::Priority;

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Blocks the threads that wait() on it until open() is called.
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Spins (with short sleeps) until `condition` holds or `timeout_seconds` pass; true if it held.
bool wait_until(const std::function<bool()>& condition, double timeout_seconds = 10.0) {
  const auto start = Clock::now();
  while (!condition()) {
    if (milliseconds_since(start) > timeout_seconds * 1000.0) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// The names of the chunks in the order they ran.
class RunLog {
 public:
  zf::WorkQueue::Chunk chunk(const std::string& name) {
    return [this, name](zf::ThreadPool&) { add(name); };
  }
  void add(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    names_.push_back(name);
  }
  std::vector<std::string> names() {
    std::lock_guard<std::mutex> lock(mutex_);
    return names_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> names_;
};

class ScopedThreadStartFailure {
 public:
  explicit ScopedThreadStartFailure(int fail_at_index) { zf::set_thread_start_failure_for_testing(fail_at_index); }
  ~ScopedThreadStartFailure() { zf::set_thread_start_failure_for_testing(0); }
  ScopedThreadStartFailure(const ScopedThreadStartFailure&) = delete;
  ScopedThreadStartFailure& operator=(const ScopedThreadStartFailure&) = delete;
};

// What a forked child checks: the global pool runs a region on every one of its threads,
// and resizing works.
int child_uses_global_pool() {
  std::atomic<int> ran{0};
  zf::global_thread_pool()->run([&](int, int) { ran++; });
  if (ran.load() != zf::global_thread_pool()->size()) return 2;
  if (zf_set_num_threads(2, nullptr, 0) != ZF_SUCCESS) {
    std::fprintf(stderr, "child: zf_set_num_threads: %s\n", zf_last_error());
    return 3;
  }
  ran = 0;
  zf::global_thread_pool()->run([&](int, int) { ran++; });
  if (ran.load() != 2 || zf_get_num_threads() != 2) return 4;
  return 0;
}

// ---- ThreadPool ---------------------------------------------------------------------------

// Each pool serialises only its own regions: a region of one pool is entered while a region
// of the other is still running. (Each region waits for the other to be entered; a single
// process-wide region lock would make that wait time out.)
TEST(Executor, TwoPoolsRunRegionsAtTheSameTime) {
  zf::ThreadPool first(2), second(2);
  std::atomic<int> regions_inside{0};
  auto region_meeting_the_other = [&](zf::ThreadPool& pool, bool* met) {
    pool.run([&](int index, int) {
      if (index != 0) return;
      regions_inside++;
      *met = wait_until([&] { return regions_inside.load() == 2; }, 10.0);
    });
  };
  bool first_met = false, second_met = false;
  std::thread other([&] { region_meeting_the_other(second, &second_met); });
  region_meeting_the_other(first, &first_met);
  other.join();
  EXPECT_TRUE(first_met);
  EXPECT_TRUE(second_met);
}

// Regions started on one pool from several threads at once never mix: every region sees each
// thread index exactly once.
TEST(Executor, RegionsFromSeveralThreadsOnOnePoolAreSerialised) {
  zf::ThreadPool pool(3);
  std::atomic<int> bad_regions{0};
  std::vector<std::thread> callers;
  for (int caller = 0; caller < 4; ++caller) {
    callers.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        std::vector<std::atomic<int>> hits(3);
        pool.run([&](int index, int) { hits[static_cast<size_t>(index)]++; });
        for (auto& hit : hits) {
          if (hit.load() != 1) bad_regions++;
        }
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(bad_regions.load(), 0);
}

// A region started inside a region of the same pool runs inline, as task(0, 1) on the thread
// that started it, instead of waiting for threads that are busy with the outer region.
TEST(Executor, NestedRegionOnTheSamePoolRunsInline) {
  zf::ThreadPool pool(3);
  EXPECT_FALSE(zf::in_parallel_region());
  std::atomic<int> inline_runs{0}, wrong_runs{0}, outside_region{0};
  pool.run([&](int, int) {
    if (!zf::in_parallel_region()) outside_region++;
    const auto outer_thread = std::this_thread::get_id();
    pool.run([&](int index, int count) {
      if (index == 0 && count == 1 && std::this_thread::get_id() == outer_thread) {
        inline_runs++;
      } else {
        wrong_runs++;
      }
    });
  });
  EXPECT_EQ(inline_runs.load(), 3);
  EXPECT_EQ(wrong_runs.load(), 0);
  EXPECT_EQ(outside_region.load(), 0);
  EXPECT_FALSE(zf::in_parallel_region());  // the caller's flag is restored after the region
}

TEST(Executor, NestedRegionOnAnotherPoolRunsInline) {
  zf::ThreadPool outer(2), inner(3), single(1);
  std::atomic<int> inline_runs{0}, wrong_runs{0};
  outer.run([&](int, int) {
    for (zf::ThreadPool* pool : {&inner, &single}) {
      const auto outer_thread = std::this_thread::get_id();
      pool->run([&](int index, int count) {
        if (index == 0 && count == 1 && std::this_thread::get_id() == outer_thread) {
          inline_runs++;
        } else {
          wrong_runs++;
        }
      });
    }
  });
  EXPECT_EQ(inline_runs.load(), 4);
  EXPECT_EQ(wrong_runs.load(), 0);
  // A one-thread pool's region counts as a region too: a nested region inside it is inline.
  bool nested_inline = false;
  single.run([&](int, int) {
    single.run([&](int index, int count) { nested_inline = zf::in_parallel_region() && index == 0 && count == 1; });
  });
  EXPECT_TRUE(nested_inline);
  // Ops on the global pool called from inside a region of another pool do not deadlock.
  zenflow::ScopedNumThreads global_threads(2);
  std::atomic<int> global_runs{0};
  outer.run([&](int, int) { zf::global_thread_pool()->run([&](int, int) { global_runs++; }); });
  EXPECT_EQ(global_runs.load(), 2);
}

// The OS refusing a thread: the workers already started are stopped and joined, and the
// constructor throws an OUT_OF_MEMORY error naming the thread.
TEST(Executor, RefusedThreadStopsTheStartedWorkersAndThrows) {
  {
    ScopedThreadStartFailure failure(3);
    try {
      zf::ThreadPool pool(5);
      FAIL() << "no exception";
    } catch (const zf::Error& e) {
      EXPECT_EQ(e.status(), ZF_ERROR_OUT_OF_MEMORY);
      EXPECT_NE(std::string(e.what()).find("num_threads: could not start thread 3 of 5: "), std::string::npos)
          << e.what();
    }
    zf::ThreadPool small(3);  // needs no thread 3
    std::atomic<int> ran{0};
    small.run([&](int, int) { ran++; });
    EXPECT_EQ(ran.load(), 3);
  }
  zf::ThreadPool pool(5);
  EXPECT_EQ(pool.size(), 5);
}

TEST(Executor, RefusedThreadKeepsTheOldGlobalPool) {
  zenflow::ScopedNumThreads base(2);
  {
    ScopedThreadStartFailure failure(1);
    EXPECT_EQ(zf_set_num_threads(3, nullptr, 0), ZF_ERROR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(zf_last_error()).find("num_threads: could not start thread 1 of 3: "), std::string::npos)
        << zf_last_error();
    EXPECT_EQ(zf_get_num_threads(), 2);
  }
  std::atomic<int> ran{0};
  zf::global_thread_pool()->run([&](int, int) { ran++; });
  EXPECT_EQ(ran.load(), 2);
}

// zf_get_num_threads() creates the default pool on first use; if the OS refuses a thread it
// reports 1 and the reason instead of letting an exception out of extern "C". A forked child
// has no global pool yet, so the first use can be made to fail there.
TEST(Executor, GetNumThreadsReportsAFailedDefaultPool) {
  const int status = zf_test::run_in_child([] {
    zf::set_default_thread_count_for_testing(3);
    zf::set_thread_start_failure_for_testing(2);
    if (zf_get_num_threads() != 1) return 2;
    if (std::strstr(zf_last_error(), "could not start thread 2 of 3") == nullptr) {
      std::fprintf(stderr, "child: zf_last_error: %s\n", zf_last_error());
      return 3;
    }
    zf::set_thread_start_failure_for_testing(0);
    if (zf_get_num_threads() != 3) return 4;
    return 0;
  });
  EXPECT_EQ(status, 0);
}

// ---- WorkQueue ----------------------------------------------------------------------------

TEST(WorkQueue, RunsHighBeforeLowAndInSubmissionOrderWithinAPriority) {
  zf::WorkQueue queue(std::make_shared<zf::ThreadPool>(1));
  RunLog log;
  Gate gate;
  std::atomic<bool> blocker_running{false};
  auto blocker = queue.submit(Priority::kLow, {[&](zf::ThreadPool&) {
                                blocker_running = true;
                                gate.wait();
                              }});
  ASSERT_TRUE(wait_until([&] { return blocker_running.load(); }));
  auto low_1 = queue.submit(Priority::kLow, {log.chunk("L1a"), log.chunk("L1b")});
  auto high_1 = queue.submit(Priority::kHigh, {log.chunk("H1a"), log.chunk("H1b")});
  auto low_2 = queue.submit(Priority::kLow, {log.chunk("L2")});
  auto high_2 = queue.submit(Priority::kHigh, {log.chunk("H2")});
  gate.open();
  for (auto& job : {blocker, low_1, high_1, low_2, high_2}) job->wait();
  EXPECT_EQ(log.names(), (std::vector<std::string>{"H1a", "H1b", "H2", "L1a", "L1b", "L2"}));
  EXPECT_TRUE(low_2->done());
  EXPECT_GE(low_2->total_seconds(), low_2->queued_seconds());
}

// A kHigh job submitted while a kLow job runs starts after the chunk in progress, not after
// the whole kLow job; the kLow job then resumes where it was.
TEST(WorkQueue, HighJobRunsBetweenTwoChunksOfALowJob) {
  zf::WorkQueue queue(std::make_shared<zf::ThreadPool>(2));
  RunLog log;
  Gate gate;
  std::atomic<bool> first_chunk_running{false};
  auto low = queue.submit(Priority::kLow, {[&](zf::ThreadPool&) {
                                             first_chunk_running = true;
                                             gate.wait();
                                             log.add("L0");
                                           },
                                           log.chunk("L1"), log.chunk("L2")});
  ASSERT_TRUE(wait_until([&] { return first_chunk_running.load(); }));
  auto high = queue.submit(Priority::kHigh, {log.chunk("H")});
  gate.open();
  low->wait();
  high->wait();
  EXPECT_EQ(log.names(), (std::vector<std::string>{"L0", "H", "L1", "L2"}));
}

// A throwing chunk fails its job (wait() rethrows, the later chunks are skipped); the queue
// goes on with the next jobs.
TEST(WorkQueue, FailingChunkFailsItsJobOnly) {
  zf::WorkQueue queue(std::make_shared<zf::ThreadPool>(2));
  RunLog log;
  auto failing = queue.submit(Priority::kLow, {log.chunk("A0"),
                                               [](zf::ThreadPool& pool) {
                                                 pool.run([](int index, int) {
                                                   if (index == 0) throw std::invalid_argument("chunk A1 failed");
                                                 });
                                               },
                                               log.chunk("A2")});
  auto next = queue.submit(Priority::kLow, {log.chunk("B")});
  auto empty = queue.submit(Priority::kHigh, {});
  for (int attempt = 0; attempt < 2; ++attempt) {  // every wait() rethrows
    try {
      failing->wait();
      FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
      EXPECT_STREQ(e.what(), "chunk A1 failed");
    }
  }
  EXPECT_NO_THROW(next->wait());
  EXPECT_NO_THROW(empty->wait());
  EXPECT_TRUE(failing->done());
  std::vector<std::string> names = log.names();
  EXPECT_EQ(names, (std::vector<std::string>{"A0", "B"}));
}

// Destruction lets the running chunk finish, drops every job that has not completed (their
// wait() throws instead of hanging) and returns.
TEST(WorkQueue, DestructionDropsPendingJobsWithoutHanging) {
  auto queue = std::make_unique<zf::WorkQueue>(std::make_shared<zf::ThreadPool>(2));
  RunLog log;
  Gate gate;
  std::atomic<bool> blocker_running{false};
  auto running = queue->submit(Priority::kLow, {[&](zf::ThreadPool&) {
                                                  blocker_running = true;
                                                  gate.wait();
                                                },
                                                log.chunk("running job, second chunk")});
  ASSERT_TRUE(wait_until([&] { return blocker_running.load(); }));
  auto pending_low = queue->submit(Priority::kLow, {log.chunk("pending low")});
  auto pending_high = queue->submit(Priority::kHigh, {log.chunk("pending high")});
  auto destroyed = std::async(std::launch::async, [&] { queue.reset(); });
  // The destructor waits for the chunk in progress...
  EXPECT_EQ(destroyed.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  gate.open();
  // ...and no longer.
  ASSERT_EQ(destroyed.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(log.names(), std::vector<std::string>{});
  for (auto& job : {running, pending_low, pending_high}) {
    EXPECT_TRUE(job->done());
    try {
      job->wait();
      ADD_FAILURE() << "a dropped job completed";
    } catch (const zf::Error& e) {
      EXPECT_EQ(e.status(), ZF_ERROR_INTERNAL);
      EXPECT_NE(std::string(e.what()).find("dropped"), std::string::npos) << e.what();
    }
  }
}

TEST(WorkQueue, IdleQueueIsDestroyedAtOnce) {
  auto pool = std::make_shared<zf::ThreadPool>(2);
  for (int i = 0; i < 20; ++i) {
    zf::WorkQueue queue(pool);
    if (i % 2 == 0) queue.submit(Priority::kLow, {[](zf::ThreadPool&) {}})->wait();
  }
  EXPECT_THROW(zf::WorkQueue(nullptr), zf::Error);
}

// The latency a kHigh job sees behind a long kLow job is about one kLow chunk. The kLow job
// streams over 64M floats (256 MiB) in 32 chunks of 2M (a few ms each, memory bound); the
// kHigh job, a 1M-element accumulate, is submitted once the kLow job is under way.
TEST(WorkQueue, HighJobWaitsForAboutOneChunkOfALongLowJob) {
  constexpr int64_t kLowElements = int64_t{64} << 20;
  constexpr int64_t kChunkElements = int64_t{2} << 20;
  constexpr int kChunks = static_cast<int>(kLowElements / kChunkElements);
  constexpr int64_t kHighElements = int64_t{1} << 20;
  auto pool = std::make_shared<zf::ThreadPool>(2);
  zf::WorkQueue queue(pool);

  std::vector<float> window(static_cast<size_t>(kLowElements), 1.0f);
  std::vector<double> chunk_ms(kChunks, 0.0);
  std::atomic<int> low_chunks_started{0};
  std::vector<zf::WorkQueue::Chunk> low_chunks;
  for (int c = 0; c < kChunks; ++c) {
    low_chunks.push_back([&, c](zf::ThreadPool& chunk_pool) {
      low_chunks_started++;
      const auto start = Clock::now();
      chunk_pool.run([&](int thread, int threads) {
        int64_t begin, end;
        zf::split_range(c * kChunkElements, (c + 1) * kChunkElements, thread, threads, &begin, &end);
        float* data = window.data();
        for (int64_t i = begin; i < end; ++i) data[i] = data[i] * 0.5f + 0.25f;
      });
      chunk_ms[static_cast<size_t>(c)] = milliseconds_since(start);
    });
  }
  std::vector<float> acc(static_cast<size_t>(kHighElements), 0.0f), grad(static_cast<size_t>(kHighElements), 2.0f);
  int low_chunks_started_at_high_start = -1;
  zf::WorkQueue::Chunk accumulate = [&](zf::ThreadPool& chunk_pool) {
    low_chunks_started_at_high_start = low_chunks_started.load();
    chunk_pool.run([&](int thread, int threads) {
      int64_t begin, end;
      zf::split_range(0, kHighElements, thread, threads, &begin, &end);
      for (int64_t i = begin; i < end; ++i) acc[static_cast<size_t>(i)] += 0.5f * grad[static_cast<size_t>(i)];
    });
  };

  auto low = queue.submit(Priority::kLow, std::move(low_chunks));
  ASSERT_TRUE(wait_until([&] { return low_chunks_started.load() >= 3 || low->done(); }));
  const int low_chunks_started_before_submit = low_chunks_started.load();
  auto high = queue.submit(Priority::kHigh, {accumulate});
  high->wait();
  low->wait();

  std::vector<double> sorted = chunk_ms;
  std::sort(sorted.begin(), sorted.end());
  const double median_chunk_ms = sorted[sorted.size() / 2];
  const double high_queued_ms = high->queued_seconds() * 1000.0;
  // At most the chunk in progress when the job was submitted (which may have begun during
  // submit()) runs before it.
  EXPECT_LE(low_chunks_started_at_high_start, low_chunks_started_before_submit + 1);
  EXPECT_LT(low_chunks_started_at_high_start, kChunks);
  EXPECT_LE(high_queued_ms, 5.0 * median_chunk_ms + 20.0)
      << "median chunk " << median_chunk_ms << " ms, " << kChunks << " chunks";
  EXPECT_EQ(acc[0], 1.0f);
  EXPECT_EQ(acc.back(), 1.0f);
  EXPECT_EQ(window.back(), 0.75f);
  std::printf("[ latency  ] kHigh queued %.2f ms behind kLow chunks of median %.2f ms\n", high_queued_ms,
              median_chunk_ms);
}

// ---- fork() and exit() ----------------------------------------------------------------------

// A child forked after the global pool started has none of its worker threads: its first
// region must use a fresh pool instead of waiting for them forever.
TEST(Fork, ChildUsesTheGlobalPoolAfterFork) {
  zenflow::ScopedNumThreads threads(2);
  std::atomic<int> ran{0};
  zf::global_thread_pool()->run([&](int, int) { ran++; });
  ASSERT_EQ(ran.load(), 2);
  EXPECT_EQ(zf_test::run_in_child(child_uses_global_pool), 0);
}

// Forked while another thread is inside a region of the global pool: the child inherits the
// pool's region lock held (by a thread it does not have), with one thread or two.
TEST(Fork, ChildUsesTheGlobalPoolWhenForkedDuringARegion) {
  for (int pool_threads : {1, 2}) {
    SCOPED_TRACE("global pool of " + std::to_string(pool_threads) + " threads");
    zenflow::ScopedNumThreads threads(pool_threads);
    std::atomic<bool> stop{false}, inside{false};
    std::thread busy([&] {
      while (!stop.load()) {
        zf::global_thread_pool()->run([&](int index, int) {
          if (index == 0) inside = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        });
      }
    });
    ASSERT_TRUE(wait_until([&] { return inside.load(); }));
    for (int fork_round = 0; fork_round < 3; ++fork_round) EXPECT_EQ(zf_test::run_in_child(child_uses_global_pool), 0);
    stop = true;
    busy.join();
  }
}

// Set in the child of Fork.ExitWhileAnotherThreadRunsRegions: how many regions its looping
// thread has completed.
std::atomic<std::atomic<int>*> regions_completed_in_exiting_child{nullptr};

// Constructed before main(), so destroyed by exit() after every static the library creates
// later (a global pool held in a static would be gone by then): regions must still complete
// at that point, or the child ends with status 5.
struct RegionsStillCompleteLateInExit {
  ~RegionsStillCompleteLateInExit() {
    std::atomic<int>* regions = regions_completed_in_exiting_child.load();
    if (regions == nullptr) return;
    const int seen = regions->load();
    if (!wait_until([&] { return regions->load() >= seen + 10; }, 5.0)) _exit(5);
  }
} regions_still_complete_late_in_exit;

// exit() runs static destructors while other threads may still be inside ops; the global pool
// must not be destroyed under them. The child exits from main while a thread loops on regions.
TEST(Fork, ExitWhileAnotherThreadRunsRegions) {
  const int status = zf_test::run_in_child([] {
    if (zf_set_num_threads(2, nullptr, 0) != ZF_SUCCESS) return 2;
    auto* regions = new std::atomic<int>(0);  // outlives exit(): the loop never stops
    regions_completed_in_exiting_child = regions;
    std::thread([regions] {
      std::vector<float> data(1 << 16, 1.0f);
      for (;;) {
        zf::global_thread_pool()->run([&](int thread, int threads) {
          int64_t begin, end;
          zf::split_range(0, static_cast<int64_t>(data.size()), thread, threads, &begin, &end);
          for (int64_t i = begin; i < end; ++i) data[static_cast<size_t>(i)] *= 1.0001f;
        });
        (*regions)++;
      }
    }).detach();
    if (!wait_until([regions] { return regions->load() >= 10; })) return 3;
    std::exit(0);
  });
  EXPECT_EQ(status, 0);
}

}  // namespace
