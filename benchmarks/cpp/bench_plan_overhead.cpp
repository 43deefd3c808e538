// The C-side cost of one engine step's ops on many small matrices: each op's C entry point
// (validate, plan, run) against a plan prepared once and run with fresh pointers, which is
// what the engine does every step. Matrices are tiny, so the time is bookkeeping, not
// arithmetic. Prints one JSON line.
//
//   zenflow_bench_plan_overhead [--matrices 300] [--rows 4] [--cols 8] [--reps 2000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/packed_layout.hpp"
#include "common/thread_pool.hpp"
#include "ops/adamw_selected_plan.hpp"
#include "ops/column_stats_plan.hpp"
#include "ops/pack_plan.hpp"
#include "ops/select_topk_plan.hpp"
#include "zenflow/zenflow.hpp"

namespace {

double median_us(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Median microseconds of body() over `reps` runs (after a warm-up).
double time_us(int reps, const std::function<void()>& body) {
  for (int i = 0; i < 20; ++i) body();
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return median_us(samples);
}

int64_t flag_value(int argc, char** argv, const char* flag, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t count = static_cast<size_t>(flag_value(argc, argv, "--matrices", 300));
  const int64_t rows = flag_value(argc, argv, "--rows", 4), cols = flag_value(argc, argv, "--cols", 8);
  const int reps = static_cast<int>(flag_value(argc, argv, "--reps", 2000));
  const int64_t k = std::max<int64_t>(1, cols / 10);
  const int64_t elements = rows * cols;

  // One set of buffers per matrix: weight, gradient, column scores, selection, compact state.
  std::vector<std::vector<float>> weights(count, std::vector<float>(elements, 0.5f)),
      grads(count, std::vector<float>(elements, 0.01f)), col_sq(count, std::vector<float>(cols)),
      master(count, std::vector<float>(rows * k, 0.5f)), exp_avg(count, std::vector<float>(rows * k)),
      exp_avg_sq(count, std::vector<float>(rows * k));
  std::vector<std::vector<int32_t>> selected(count, std::vector<int32_t>(k)), steps(count, std::vector<int32_t>(k));
  for (auto& s : selected) {
    for (int64_t c = 0; c < k; ++c) s[c] = static_cast<int32_t>(c * 3 % cols);
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
  }
  std::vector<zf_tensor> weight_t, grad_t, col_sq_t, selected_t;
  std::vector<zf_column_state> state_t;
  zf::PackedLayout layout;
  for (size_t i = 0; i < count; ++i) {
    weight_t.push_back(zenflow::contiguous_tensor(weights[i].data(), ZF_DTYPE_F32, {rows, cols}));
    grad_t.push_back(zenflow::contiguous_tensor(grads[i].data(), ZF_DTYPE_F32, {rows, cols}));
    col_sq_t.push_back(zenflow::contiguous_tensor(col_sq[i].data(), ZF_DTYPE_F32, {cols}));
    const int64_t ki = static_cast<int64_t>(selected[i].size());
    selected_t.push_back(zenflow::contiguous_tensor(selected[i].data(), ZF_DTYPE_I32, {ki}));
    zf_column_state s{};
    s.master = zenflow::contiguous_tensor(master[i].data(), ZF_DTYPE_F32, {rows, ki});
    s.exp_avg = zenflow::contiguous_tensor(exp_avg[i].data(), ZF_DTYPE_F32, {rows, ki});
    s.exp_avg_sq = zenflow::contiguous_tensor(exp_avg_sq[i].data(), ZF_DTYPE_F32, {rows, ki});
    s.steps = zenflow::contiguous_tensor(steps[i].data(), ZF_DTYPE_I32, {ki});
    state_t.push_back(s);
    layout.add(rows, cols, ki);
  }
  std::vector<float> packed(static_cast<size_t>(layout.total()));
  const zf_tensor packed_t = zenflow::contiguous_tensor(packed.data(), ZF_DTYPE_F32, {layout.total()});
  float total = 0.0f;
  int32_t nonfinite = 0;
  const zf_tensor total_t = zenflow::contiguous_tensor(&total, ZF_DTYPE_F32, {});
  const zf_tensor flag_t = zenflow::contiguous_tensor(&nonfinite, ZF_DTYPE_I32, {});
  const std::vector<double> lr(count, 1e-9), wd(count, 0.0);
  const zf_adam_hparams hparams = zenflow::adam_hparams();

  // The C entry points: validation and planning on every call.
  const double stats_call = time_us(reps, [&] { zenflow::column_stats(grad_t, col_sq_t, total_t, flag_t); });
  const double adamw_call =
      time_us(reps, [&] { zenflow::adamw_selected_columns(weight_t, grad_t, selected_t, state_t, lr, wd, hparams); });
  const double pack_call = time_us(reps, [&] { zenflow::pack_columns(grad_t, selected_t, packed_t); });

  // Plans prepared once; every run gets its pointers afresh.
  std::vector<zf::ColumnStatsMatrix> stats_matrices(count, {rows, cols, ZF_DTYPE_F32});
  zf::ColumnStatsPlan stats_plan(stats_matrices);
  std::vector<zf::AdamwSelectedMatrix> adamw_matrices;
  std::vector<zf_dtype> dtypes(count, ZF_DTYPE_F32);
  for (size_t i = 0; i < count; ++i) {
    adamw_matrices.push_back({rows, cols, static_cast<int64_t>(selected[i].size()), ZF_DTYPE_F32, ZF_DTYPE_F32, true});
  }
  zf::AdamwSelectedPlan adamw_plan(adamw_matrices, hparams);
  const zf::PackPlan pack_plan(layout, dtypes, ZF_DTYPE_F32);
  std::shared_ptr<zf::ThreadPool> pool = zf::global_thread_pool();

  std::vector<const void*> grad_ptrs(count);
  std::vector<float*> col_sq_ptrs(count);
  std::vector<void*> grad_mut_ptrs(count);
  std::vector<const int32_t*> selected_ptrs(count);
  std::vector<zf::AdamwSelectedPointers> adamw_ptrs(count);
  const auto gather_pointers = [&] {
    for (size_t i = 0; i < count; ++i) {
      grad_ptrs[i] = grads[i].data();
      grad_mut_ptrs[i] = grads[i].data();
      col_sq_ptrs[i] = col_sq[i].data();
      selected_ptrs[i] = selected[i].data();
      adamw_ptrs[i] = {weights[i].data(),
                       grads[i].data(),
                       selected[i].data(),
                       master[i].data(),
                       exp_avg[i].data(),
                       exp_avg_sq[i].data(),
                       steps[i].data(),
                       lr[i],
                       wd[i]};
    }
  };
  const double stats_plan_run = time_us(reps, [&] {
    gather_pointers();
    stats_plan.run(*pool, grad_ptrs.data(), col_sq_ptrs.data(), &total, &nonfinite, false);
  });
  const double adamw_plan_run = time_us(reps, [&] {
    gather_pointers();
    adamw_plan.run(*pool, adamw_ptrs.data(), 1.0f);
  });
  const double pack_plan_run = time_us(reps, [&] {
    gather_pointers();
    pack_plan.run(*pool, grad_mut_ptrs.data(), selected_ptrs.data(), packed.data(), 1.0f, true);
  });
  std::printf(
      "{\"matrices\": %zu, \"shape\": [%lld, %lld], \"k\": %lld, \"threads\": %d, "
      "\"column_stats_call_us\": %.1f, \"column_stats_plan_us\": %.1f, "
      "\"adamw_selected_call_us\": %.1f, \"adamw_selected_plan_us\": %.1f, "
      "\"pack_call_us\": %.1f, \"pack_plan_us\": %.1f, "
      "\"three_plans_per_step_us\": %.1f}\n",
      count, static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(k), pool->size(),
      stats_call, stats_plan_run, adamw_call, adamw_plan_run, pack_call, pack_plan_run,
      stats_plan_run + adamw_plan_run + pack_plan_run);
  return 0;
}
