// zf_set_parallel_runtime: the process-wide pool handing its regions to a parallel runtime
// outside zenflow. The runtimes here are fakes on std::thread with a chosen team size, and
// broken ones that break the contract in each way the header names.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.hpp"
#include "test_fork.hpp"
#include "test_util.hpp"

namespace {

// A runtime whose team has `team_size` threads (0: as many as asked), the caller being
// thread 0. It records the largest team it ran and how many regions it ran.
struct ThreadTeam {
  int team_size = 0;
  std::atomic<int> regions{0};
  std::atomic<int> largest_request{0};

  static void run(void* context, zf_parallel_body body, void* body_context, int num_threads) {
    auto* team = static_cast<ThreadTeam*>(context);
    team->regions++;
    int expected = team->largest_request.load();
    while (num_threads > expected && !team->largest_request.compare_exchange_weak(expected, num_threads)) {
    }
    const int size = team->team_size > 0 ? std::min(team->team_size, num_threads) : num_threads;
    std::vector<std::thread> threads;
    for (int i = 1; i < size; ++i) threads.emplace_back([=] { body(body_context, i, size); });
    body(body_context, 0, size);
    for (auto& thread : threads) thread.join();
  }
};

// Sets a runtime for its lifetime and puts zenflow's own threads back after.
class ScopedRuntime {
 public:
  ScopedRuntime(zf_parallel_run run, void* context) { EXPECT_EQ(zf_set_parallel_runtime(run, context), ZF_SUCCESS); }
  ~ScopedRuntime() { zf_set_parallel_runtime(nullptr, nullptr); }
  ScopedRuntime(const ScopedRuntime&) = delete;
  ScopedRuntime& operator=(const ScopedRuntime&) = delete;
};

// One fp32 AdamW step over `n` elements from a fixed seed: the weights after it.
std::vector<float> adamw_weights_after_steps(int64_t n, int steps) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(static_cast<size_t>(n)), m(p.size(), 0.0f), v(p.size(), 0.0f), g(p.size());
  for (auto& x : p) x = normal(rng);
  for (int step = 1; step <= steps; ++step) {
    for (auto& x : g) x = normal(rng);
    zenflow::cpu_adamw_step({zenflow::contiguous_tensor(p.data(), ZF_DTYPE_F32, {n})},
                            {zenflow::contiguous_tensor(m.data(), ZF_DTYPE_F32, {n})},
                            {zenflow::contiguous_tensor(v.data(), ZF_DTYPE_F32, {n})},
                            {zenflow::contiguous_tensor(g.data(), ZF_DTYPE_F32, {n})}, {}, {step}, {1e-3}, {1e-2},
                            zenflow::adam_hparams(), 1.0f, 0);
  }
  return p;
}

// Column sums of squares of a [rows, cols] matrix (pieces are assigned to threads by index).
std::vector<float> column_sums(int64_t rows, int64_t cols) {
  std::mt19937_64 rng(11);
  zf_test::HostMatrix grad = zf_test::random_matrix(ZF_DTYPE_F32, rows, cols, rng);
  std::vector<float> col_sq(static_cast<size_t>(cols), -1.0f);
  float total = -1.0f;
  int32_t flag = -1;
  zenflow::column_stats({grad.tensor()}, {zenflow::contiguous_tensor(col_sq.data(), ZF_DTYPE_F32, {cols})},
                        zenflow::contiguous_tensor(&total, ZF_DTYPE_F32, {1}),
                        zenflow::contiguous_tensor(&flag, ZF_DTYPE_I32, {1}));
  col_sq.push_back(total);
  return col_sq;
}

TEST(ParallelRuntime, OpsGiveTheSameBitsOnARuntimeOfAnyTeamSize) {
  zenflow::ScopedNumThreads pool(4);
  const std::vector<float> own_adamw = adamw_weights_after_steps(300007, 3);
  const std::vector<float> own_sums = column_sums(509, 1031);
  for (int team_size : {0, 1, 3, 4}) {
    SCOPED_TRACE("team size " + std::to_string(team_size));
    ThreadTeam team;
    team.team_size = team_size;
    ScopedRuntime runtime(&ThreadTeam::run, &team);
    EXPECT_EQ(zf_parallel_runtime_is_set(), 1);
    EXPECT_EQ(zf_get_num_threads(), 4);  // the size asked for, whatever the team
    const std::vector<float> adamw = adamw_weights_after_steps(300007, 3);
    const std::vector<float> sums = column_sums(509, 1031);
    EXPECT_EQ(std::memcmp(adamw.data(), own_adamw.data(), adamw.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(sums.data(), own_sums.data(), sums.size() * sizeof(float)), 0);
    EXPECT_GT(team.regions.load(), 0);  // the regions did go to the runtime
    EXPECT_EQ(team.largest_request.load(), 4);
  }
  EXPECT_EQ(zf_parallel_runtime_is_set(), 0);
  EXPECT_EQ(zf_get_num_threads(), 4);
}

TEST(ParallelRuntime, EveryThreadIndexRunsOnceWhenTheTeamIsSmaller) {
  for (int team_size : {1, 2, 3, 5}) {
    ThreadTeam team;
    team.team_size = team_size;
    zf::ThreadPool pool(zf::ParallelRuntime{&ThreadTeam::run, &team}, 5);
    EXPECT_TRUE(pool.uses_runtime());
    EXPECT_EQ(pool.size(), 5);
    std::vector<std::atomic<int>> hits(5);
    for (int round = 0; round < 20; ++round) {
      pool.run([&](int index, int count) {
        ASSERT_EQ(count, 5);
        hits[static_cast<size_t>(index)]++;
      });
    }
    for (auto& h : hits) EXPECT_EQ(h.load(), 20);
  }
}

TEST(ParallelRuntime, TaskErrorsReachTheCallerAndNestedRegionsRunInline) {
  ThreadTeam team;
  zf::ThreadPool pool(zf::ParallelRuntime{&ThreadTeam::run, &team}, 3);
  try {
    pool.run([](int index, int) {
      if (index >= 1) throw std::invalid_argument("index " + std::to_string(index));
    });
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "index 1");  // the lowest failing index, as on zenflow's threads
  }
  std::atomic<int> inner{0};
  pool.run([&](int, int) {
    EXPECT_TRUE(zf::in_parallel_region());
    pool.run([&](int index, int count) {  // would wait for the busy team without the inline rule
      EXPECT_EQ(index, 0);
      EXPECT_EQ(count, 1);
      inner++;
    });
  });
  EXPECT_EQ(inner.load(), 3);
  EXPECT_FALSE(zf::in_parallel_region());
}

// Runtimes that break the contract, one way each.
void calls_one_index_twice(void*, zf_parallel_body body, void* context, int num_threads) {
  for (int i = 0; i < num_threads; ++i) body(context, i, num_threads);
  body(context, 0, num_threads);
}
void skips_the_last_index(void*, zf_parallel_body body, void* context, int num_threads) {
  for (int i = 0; i + 1 < num_threads; ++i) body(context, i, num_threads);
}
void index_out_of_range(void*, zf_parallel_body body, void* context, int num_threads) {
  for (int i = 0; i < num_threads; ++i) body(context, i + 1, num_threads);
}
void team_larger_than_asked(void*, zf_parallel_body body, void* context, int num_threads) {
  for (int i = 0; i <= num_threads; ++i) body(context, i, num_threads + 1);
}
void two_team_sizes(void*, zf_parallel_body body, void* context, int num_threads) {
  body(context, 0, num_threads);
  body(context, 0, 1);
}
void never_calls(void*, zf_parallel_body, void*, int) {}

TEST(ParallelRuntime, ABrokenRuntimeFailsTheOpWithAClearError) {
  zenflow::ScopedNumThreads pool(3);
  const std::vector<float> expected = adamw_weights_after_steps(100003, 1);
  for (zf_parallel_run broken : {&calls_one_index_twice, &skips_the_last_index, &index_out_of_range,
                                 &team_larger_than_asked, &two_team_sizes, &never_calls}) {
    ScopedRuntime runtime(broken, nullptr);
    EXPECT_THROW(
        {
          try {
            adamw_weights_after_steps(100003, 1);
          } catch (const zenflow::Error& e) {
            EXPECT_EQ(e.status(), ZF_ERROR_INTERNAL);
            EXPECT_NE(std::string(e.what()).find("parallel runtime"), std::string::npos) << e.what();
            throw;
          }
        },
        zenflow::Error);
  }
  // Back on zenflow's own threads, the same op gives the same bits as before.
  const std::vector<float> after = adamw_weights_after_steps(100003, 1);
  EXPECT_EQ(std::memcmp(after.data(), expected.data(), after.size() * sizeof(float)), 0);
}

TEST(ParallelRuntime, ResizingKeepsTheRuntimeAndPinningIsRefused) {
  ThreadTeam team;
  ScopedRuntime runtime(&ThreadTeam::run, &team);
  ASSERT_EQ(zf_set_num_threads(3, nullptr, 0), ZF_SUCCESS);
  EXPECT_EQ(zf_parallel_runtime_is_set(), 1);
  EXPECT_EQ(zf_get_num_threads(), 3);
  const int core = 0;
  EXPECT_EQ(zf_set_num_threads(2, &core, 1), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("cores"), std::string::npos) << zf_last_error();
  EXPECT_EQ(zf_get_num_threads(), 3);  // a refused call changes nothing
  EXPECT_EQ(zf_parallel_runtime_is_set(), 1);
  adamw_weights_after_steps(100003, 1);
  EXPECT_GT(team.regions.load(), 0);
  EXPECT_EQ(team.largest_request.load(), 3);
}

TEST(ParallelRuntime, SwitchingWhileKernelsRunIsSafe) {
  ThreadTeam team;
  const int runs = zf_test::regions_run_during([&] {
    for (int i = 0; i < 200; ++i) {
      ASSERT_EQ(zf_set_parallel_runtime(i % 2 ? nullptr : &ThreadTeam::run, &team), ZF_SUCCESS);
    }
  });
  EXPECT_GT(runs, 0);
  zf_set_parallel_runtime(nullptr, nullptr);
}

TEST(ParallelRuntime, AForkedChildGoesBackToZenflowsOwnThreads) {
  ThreadTeam team;
  ScopedRuntime runtime(&ThreadTeam::run, &team);
  zenflow::ScopedNumThreads pool(2);
  const std::vector<float> expected = adamw_weights_after_steps(100003, 2);
  const int status = zf_test::run_in_child([&] {
    if (zf_parallel_runtime_is_set() != 0) return 1;
    const std::vector<float> in_child = adamw_weights_after_steps(100003, 2);
    if (std::memcmp(in_child.data(), expected.data(), in_child.size() * sizeof(float)) != 0) return 2;
    return zf_get_num_threads() >= 1 ? 0 : 3;
  });
  EXPECT_EQ(status, 0);
  EXPECT_EQ(zf_parallel_runtime_is_set(), 1);  // the parent keeps it
}

}  // namespace
