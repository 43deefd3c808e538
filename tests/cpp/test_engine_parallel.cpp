// The engine's data-parallel mode (zf_engine_set_collectives) on the host backend: N ranks
// are N threads of this process, each with its own engine over its own copy of the model,
// joined by an in-process communicator. Every rank gets a different gradient; one engine
// given their mean is the reference that every rank must follow.
//
// The gradients are multiples of 1/16 with at most 8 significant bits, and so are their rank
// sums: every partial sum is exact in f32, bf16 and f16, so the mean the reference gets is
// exactly the sum the ranks reduce divided by N, and the column statistics that drive the
// top-k and the auto window are exact on both sides. A near-tie can then not pick other
// columns on the two sides; the trajectories differ only by the rounding of the 1/N scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/testing.hpp"
#include "inprocess_collectives.hpp"
#include "simulated_backend.hpp"
#include "test_engine_util.hpp"

namespace {

using namespace zf_engine_test;
using zf_test::InProcessGroup;

// ---- the model and the gradients ----

enum class Dtypes { kF32, kBF16, kMixed };

const char* dtypes_name(Dtypes d) { return d == Dtypes::kF32 ? "f32" : d == Dtypes::kBF16 ? "bf16" : "mixed"; }

// Matrices with prime and tiny column counts (7, 13, 31, and 2, fewer columns than ranks),
// rows 1 and 5; a dense 1-D parameter and a matrix in a dense group. Mixed: some f32, some bf16.
Model parallel_model(Dtypes dtypes, uint64_t seed = 5) {
  struct Spec {
    std::vector<int64_t> shape;
    int32_t group;
    bool bf16_when_mixed;
  };
  const std::vector<Spec> specs = {{{5, 7}, 0, false}, {{1, 13}, 1, true}, {{5, 31}, 0, true}, {{1, 31}, 1, false},
                                   {{5, 2}, 0, true},  {{7}, 0, false},    {{3, 5}, 2, true}};
  Model m;
  m.groups = {zf_engine_group{1e-2, 0.1, 0}, zf_engine_group{3e-3, 0.0, 0}, zf_engine_group{5e-3, 0.05, 1}};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const Spec& s : specs) {
    const bool bf16 = dtypes == Dtypes::kBF16 || (dtypes == Dtypes::kMixed && s.bf16_when_mixed);
    HostTensor t(bf16 ? ZF_DTYPE_BF16 : ZF_DTYPE_F32, s.shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, uniform(rng));
    m.params.push_back(std::move(t));
    m.param_groups.push_back(s.group);
  }
  return m;
}

// Eight [4, 24] matrices (the last four bf16 when mixed) and a vector: buckets of several
// equal matrices, which data parallel reduces in several passes.
Model many_matrices_model(Dtypes dtypes, uint64_t seed = 7) {
  Model m;
  m.groups = {zf_engine_group{1e-2, 0.1, 0}, zf_engine_group{3e-3, 0.0, 0}};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int i = 0; i < 9; ++i) {
    const bool bf16 = dtypes == Dtypes::kBF16 || (dtypes == Dtypes::kMixed && i >= 4);
    HostTensor t(bf16 ? ZF_DTYPE_BF16 : ZF_DTYPE_F32, i == 8 ? std::vector<int64_t>{5} : std::vector<int64_t>{4, 24});
    for (int64_t e = 0; e < t.numel(); ++e) t.set(e, uniform(rng));
    m.params.push_back(std::move(t));
    m.param_groups.push_back(i % 2);
  }
  return m;
}

// One step's gradients: rank[r][i] for rank r and parameter i, their sum and their mean
// (computed in double, rounded to the dtype).
struct StepGrads {
  std::vector<std::vector<HostTensor>> rank;
  std::vector<HostTensor> sum, mean;
};

// mean = m / 16 with 1 <= |m| <= 85 (columns boosted in turn, moving every 3 steps, so that
// selections change); rank r's = mean + a_r / 16 with the a_r summing to 0, |a_r| <= 80:
// every value and every partial sum is an integer / 16 below 256 / 16, exact in every dtype.
// Each element's mean keeps one sign over the steps: a window's accumulated gradient is never
// zero, where AdamW would turn the 1/N scale's rounding (1e-8 against an exact 0) into a
// whole step of lr * sign. No rank's gradient equals the sum, so an unreduced gradient
// cannot pass for a reduced one.
StepGrads make_step_grads(const Model& model, int world, int64_t t, uint64_t seed = 3) {
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(t) * 7919ull + static_cast<uint64_t>(world));
  StepGrads out;
  out.rank.resize(static_cast<size_t>(world));
  for (const HostTensor& p : model.params) {
    HostTensor sum(p.dtype, p.shape), mean(p.dtype, p.shape);
    std::vector<HostTensor> per_rank(static_cast<size_t>(world), HostTensor(p.dtype, p.shape));
    const int64_t cols = p.cols();
    for (int64_t e = 0; e < p.numel(); ++e) {
      const bool boosted = ((e % cols) + t / 3) % 4 == 0;
      const int limit = boosted ? 85 : 24;
      const uint64_t element_hash = (static_cast<uint64_t>(e) * 0x9e3779b97f4a7c15ull) ^ (p.numel() * 0x85ebca6bull);
      const int sign = (element_hash >> 17) & 1 ? 1 : -1;
      const int m = sign * std::uniform_int_distribution<int>(1, limit)(rng);
      std::vector<int> g(static_cast<size_t>(world), m);
      for (;;) {
        int rest = 0;
        for (int r = 0; r + 1 < world; ++r) {
          const int a = std::uniform_int_distribution<int>(-40, 40)(rng);
          g[static_cast<size_t>(r)] = m + a;
          rest -= a;
        }
        g[static_cast<size_t>(world - 1)] = m + rest;
        bool distinct = true;
        for (int v : g) distinct = distinct && (world == 1 || v != world * m);
        if (distinct) break;
      }
      double total = 0.0;
      for (int r = 0; r < world; ++r) {
        const float v = static_cast<float>(g[static_cast<size_t>(r)]) / 16.0f;
        per_rank[static_cast<size_t>(r)].set(e, v);
        total += per_rank[static_cast<size_t>(r)].get(e);
      }
      sum.set(e, static_cast<float>(world * m) / 16.0f);
      mean.set(e, static_cast<float>(total / world));
    }
    for (int r = 0; r < world; ++r)
      out.rank[static_cast<size_t>(r)].push_back(std::move(per_rank[static_cast<size_t>(r)]));
    out.sum.push_back(std::move(sum));
    out.mean.push_back(std::move(mean));
  }
  return out;
}

std::vector<StepGrads> make_grad_stream(const Model& model, int world, int64_t first, int64_t count) {
  std::vector<StepGrads> out;
  for (int64_t t = first; t < first + count; ++t) out.push_back(make_step_grads(model, world, t));
  return out;
}

// ---- running ranks ----

// Runs body(rank) on one thread per rank and joins them. A rank that never returns must fail
// the run, not stall it: after `timeout_seconds` the process aborts with a message. (The
// communicator's own timeout is shorter, so only a hang outside a collective gets here.)
void run_ranks(int world, const std::function<void(int)>& body, double timeout_seconds = 90.0) {
  std::mutex mutex;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      body(r);
      std::lock_guard<std::mutex> lock(mutex);
      ++finished;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    if (!cv.wait_for(lock, std::chrono::duration<double>(timeout_seconds), [&] { return finished == world; })) {
      std::fprintf(stderr, "test_engine_parallel: %d of %d ranks still running after %.0f s: hung\n", world - finished,
                   world, timeout_seconds);
      std::abort();
    }
  }
  for (std::thread& t : threads) t.join();
}

// save_state into buffers filled with 0xff bytes (NaN for f32, -1 for i32), so that an
// element the engine does not write cannot pass for a zero.
zenflow::EngineState poisoned_save(zenflow::Engine& engine) {
  zenflow::EngineState state;
  state.layout = engine.state_layout();
  for (const zf_engine_state_entry& e : state.layout) state.storage.emplace_back((e.bytes + 7) / 8 + 1, ~uint64_t{0});
  state.counters.fill(-7);
  state.loss_scale = -7.0;
  const std::vector<zf_tensor> buffers = state.tensors();
  zenflow::check(
      zf_engine_save_state(engine.get(), buffers.data(), buffers.size(), state.counters.data(), &state.loss_scale));
  return state;
}

// What one rank (or the reference engine) did.
struct RankRun {
  std::vector<std::vector<HostTensor>> params;  // after each step
  std::vector<std::vector<HostTensor>> grads;   // its gradients after each step (reduced in place)
  std::vector<zf_engine_stats> stats;           // after each step
  std::vector<zenflow::EngineState> saves;      // after each step (probe) or once at the end (save_at_end)
  std::vector<HostTensor> params_after_save;    // save_at_end: the parameters after the save's flush
  zf_engine_stats final_stats{};
  std::string error;
  // Split forms: per step, the parameters whose gradient was already reduced (changed in
  // place) when the last one was handed over, before end_step.
  std::vector<size_t> reduced_before_end;
  size_t released = 0;  // gradients the engine released (config.release_gradients), over the run
};

// How a rank hands its gradients over: a plain step, a split step (begin_step, one submit
// per parameter, end_step) or readiness (mark_ready per parameter, end_step_with). The split
// forms go in backward order (the last parameter first) on rank 0 and in a shuffled order on
// the others, so that buckets fill in different orders on different ranks.
enum class Form { kPlain, kSplit, kReady };

struct RunOptions {
  Form form = Form::kPlain;
  int plain_rank = -1;                   // this rank steps plainly whatever the form
  uint64_t simulated_seed = 0;           // > 0: each rank on a simulated asynchronous backend
  bool sync_every_step = true;           // simulated: false lets the lanes run on across steps
                                         // (only the last step's parameters are kept)
  int64_t first_step = 1;                // the global index of the first step (learning rates)
  bool probe = false;                    // save after every step
  bool save_at_end = false;              // save once after the last step
  zenflow::EngineState* load = nullptr;  // a state every engine loads before stepping
  // Split forms with config.release_gradients: after each hand-over the released gradients
  // are taken and poisoned (NaN: the caller reuses their memory), and end_step_with gets them
  // as NULL.
  bool release = false;
};

// Collectives in stream order on a simulated asynchronous backend: each call first runs the
// lane it is enqueued on (the compute lane, or the reduction lane during backward) up to the
// call, as a device runs a stream up to a collective's kernel, then runs the in-process
// collective. Work on other lanes is ordered only by the engine's events: an order it forgot
// (a reduction that overwrites the scratch before the compute lane's last read of it, say)
// changes the results.
struct OrderedCollectives {
  zf_engine_collectives inner{};
  zf_sim::SimulatedAsyncBackend* backend = nullptr;

  zf_engine_collectives wrap(const zf_engine_collectives& c) {
    inner = c;
    zf_engine_collectives out = c;
    out.user = this;
    out.all_reduce_sum = [](void* user, void* data, size_t count, zf_dtype dtype, zf_stream stream) {
      auto* self = static_cast<OrderedCollectives*>(user);
      self->backend->run_ops_lane();
      return self->inner.all_reduce_sum(self->inner.user, data, count, dtype, stream);
    };
    out.reduce_scatter_sum = [](void* user, const void* in, void* o, size_t count, zf_dtype dtype, zf_stream stream) {
      auto* self = static_cast<OrderedCollectives*>(user);
      self->backend->run_ops_lane();
      return self->inner.reduce_scatter_sum(self->inner.user, in, o, count, dtype, stream);
    };
    out.all_gather = [](void* user, const void* in, void* o, size_t count, zf_dtype dtype, zf_stream stream) {
      auto* self = static_cast<OrderedCollectives*>(user);
      self->backend->run_ops_lane();
      return self->inner.all_gather(self->inner.user, in, o, count, dtype, stream);
    };
    out.last_error = [](void* user) {
      auto* self = static_cast<OrderedCollectives*>(user);
      return self->inner.last_error(self->inner.user);
    };
    return out;
  }
};

// One engine's life: create (and join `group` as `rank`, unless group is NULL), load, step
// through `stream` (rank `rank`'s gradients, or the mean when group is NULL), save.
void run_engine(const Model& start, const zf_engine_config& config, InProcessGroup* group, int rank,
                const std::vector<StepGrads>& stream, const RunOptions& options, RankRun& out) {
  std::string at = "before the first step";
  try {
    Model model = start;
    // Simulated devices: each step's gradients as the backward's kernels write them, on the
    // compute lane, from these sources (alive until the engine is gone).
    std::deque<std::vector<HostTensor>> sources;
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, config);
    OrderedCollectives ordered;
    if (options.simulated_seed > 0) {
      auto backend = std::make_unique<zf_sim::SimulatedAsyncBackend>(options.simulated_seed + 7919 * rank, 30);
      ordered.backend = backend.get();
      zf::testing::use_backend(engine.get(), std::move(backend));
    }
    if (group != nullptr) {
      zf_engine_collectives c = group->collectives(rank);
      if (ordered.backend != nullptr) c = ordered.wrap(c);
      zenflow::check(zf_engine_set_collectives(engine.get(), &c));
    }
    if (options.load != nullptr) {
      zenflow::EngineState copy = *options.load;
      engine.load_state(copy);
    }
    for (size_t s = 0; s < stream.size(); ++s) {
      at = "at step " + std::to_string(options.first_step + static_cast<int64_t>(s));
      std::vector<HostTensor> g = group != nullptr ? stream[s].rank[static_cast<size_t>(rank)] : stream[s].mean;
      const std::vector<double> lrs = step_lrs(model, options.first_step + static_cast<int64_t>(s));
      std::vector<zf_tensor> tensors = tensors_of(g);
      if (options.form == Form::kPlain || rank == options.plain_rank) {
        engine.step(tensors, lrs);
      } else {
        std::vector<size_t> order(tensors.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
        std::mt19937_64 rng(static_cast<uint64_t>(rank * 1000 + static_cast<int>(s)));
        if (rank != 0) std::shuffle(order.begin(), order.end(), rng);
        engine.begin_step(lrs);
        if (ordered.backend != nullptr) {
          sources.push_back(g);
          for (HostTensor& t : g)
            for (int64_t e = 0; e < t.numel(); ++e) t.set(e, 1e3f);  // until the "backward" writes it
        }
        for (size_t i : order) {
          if (ordered.backend != nullptr) {
            HostTensor& source = sources.back()[i];
            ordered.backend->copy_device(tensors[i].data, source.data(),
                                         static_cast<size_t>(source.numel()) * zf_dtype_size(source.dtype));
          }
          if (options.form == Form::kSplit)
            zenflow::check(zf_engine_submit(engine.get(), i, &tensors[i], 1));
          else
            zenflow::check(zf_engine_mark_ready(engine.get(), i, &tensors[i]));
          size_t taken[4], count = 0;
          do {
            zenflow::check(zf_engine_take_released(engine.get(), taken, 4, &count));
            for (size_t k = 0; k < count; ++k) {
              if (!options.release || taken[k] >= g.size() || tensors[taken[k]].data == nullptr)
                throw std::runtime_error("parameter " + std::to_string(taken[k]) + " released out of turn");
              for (int64_t e = 0; e < g[taken[k]].numel(); ++e) g[taken[k]].set(e, NAN);
              tensors[taken[k]].data = nullptr;
              ++out.released;
            }
          } while (count == 4);
        }
        size_t changed = 0;
        for (size_t i = 0; i < g.size(); ++i)
          changed += g[i].bitwise_equal(stream[s].rank[static_cast<size_t>(rank)][i]) ? 0 : 1;
        out.reduced_before_end.push_back(changed);
        if (options.form == Form::kSplit)
          engine.end_step();
        else
          zenflow::check(zf_engine_end_step_with(engine.get(), tensors.data(), tensors.size()));
      }
      if (options.simulated_seed > 0) {
        if (!options.sync_every_step && s + 1 < stream.size()) {
          out.grads.push_back(std::move(g));  // queued work may still read them
          continue;
        }
        zf::testing::synchronize_backend(engine.get());
      }
      out.params.push_back(model.params);
      out.grads.push_back(std::move(g));
      out.stats.push_back(engine.stats());
      if (options.probe) out.saves.push_back(poisoned_save(engine));
    }
    if (options.save_at_end) {
      at = "in the final save";
      out.saves.push_back(poisoned_save(engine));
      out.params_after_save = model.params;
    }
    out.final_stats = engine.stats();
  } catch (const std::exception& e) {
    out.error = "exception " + at + ": " + e.what();
    // The other ranks would wait for this one in their next collective: let them fail now.
    if (group != nullptr) group->abort("rank " + std::to_string(rank) + " failed: " + e.what());
  }
}

std::vector<RankRun> run_parallel(const Model& start, const zf_engine_config& config, InProcessGroup& group,
                                  const std::vector<StepGrads>& stream, const RunOptions& options) {
  std::vector<RankRun> runs(static_cast<size_t>(group.world_size()));
  run_ranks(group.world_size(),
            [&](int r) { run_engine(start, config, &group, r, stream, options, runs[static_cast<size_t>(r)]); });
  return runs;
}

RankRun run_single(const Model& start, const zf_engine_config& config, const std::vector<StepGrads>& stream,
                   const RunOptions& options) {
  RankRun run;
  run_engine(start, config, nullptr, 0, stream, options, run);
  return run;
}

// ---- comparisons ----

double bf16_ulp(double x) {
  const double a = std::fabs(x);
  if (a < 1e-30) return 1e-30;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 7);
}

// Parameters of a rank against the reference's: within one bf16 ulp, or float32 rounding.
bool param_close(double got, double want, zf_dtype dtype) {
  if (dtype == ZF_DTYPE_BF16) return std::fabs(got - want) <= bf16_ulp(std::max(std::fabs(got), std::fabs(want)));
  return std::fabs(got - want) <= 1e-5 * std::fabs(want) + 1e-6;
}

bool state_value_close(float got, float want) {
  return std::fabs(static_cast<double>(got) - want) <=
         1e-5 * std::max(std::fabs(static_cast<double>(got)), std::fabs(static_cast<double>(want))) + 1e-7;
}

// Every rank's parameters bitwise equal rank 0's and close to the reference's, after every step.
void expect_trajectories_match(const std::vector<RankRun>& ranks, const RankRun& reference, const std::string& label) {
  ASSERT_TRUE(reference.error.empty()) << label << ": reference engine failed: " << reference.error;
  for (size_t r = 0; r < ranks.size(); ++r)
    ASSERT_TRUE(ranks[r].error.empty()) << label << ": rank " << r << " failed: " << ranks[r].error;
  for (size_t r = 0; r < ranks.size(); ++r) ASSERT_EQ(ranks[r].params.size(), reference.params.size()) << label;
  for (size_t s = 0; s < reference.params.size(); ++s) {
    for (size_t i = 0; i < reference.params[s].size(); ++i) {
      const HostTensor& want = reference.params[s][i];
      const HostTensor& got = ranks[0].params[s][i];
      for (size_t r = 1; r < ranks.size(); ++r)
        ASSERT_TRUE(ranks[r].params[s][i].bitwise_equal(got))
            << label << ": rank " << r << " differs from rank 0 after step " << s + 1 << ", param " << i;
      for (int64_t e = 0; e < want.numel(); ++e)
        ASSERT_TRUE(param_close(got.get(e), want.get(e), want.dtype))
            << label << ": after step " << s + 1 << ", param " << i << " [" << e << "]: ranks " << got.get(e)
            << ", mean-gradient engine " << want.get(e);
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      EXPECT_EQ(ranks[r].stats[s].selected_fraction, reference.stats[s].selected_fraction)
          << label << ": rank " << r << ", step " << s + 1;
      EXPECT_EQ(ranks[r].stats[s].steps, reference.stats[s].steps) << label;
      EXPECT_EQ(ranks[r].stats[s].windows, reference.stats[s].windows) << label << ": rank " << r << ", step " << s + 1;
      EXPECT_EQ(ranks[r].stats[s].reselections, reference.stats[s].reselections) << label;
      // The norm of the mean gradient (what clipping uses), not of the ranks' sum.
      const double norm = reference.stats[s].last_global_norm;
      EXPECT_NEAR(ranks[r].stats[s].last_global_norm, norm, 1e-5 * norm)
          << label << ": rank " << r << ", step " << s + 1;
    }
  }
}

// The columns rank r of `world` owns: [r * n / N, (r + 1) * n / N).
bool owned(int64_t column, int64_t n, int rank, int world) {
  return column >= rank * n / world && column < (rank + 1) * n / world;
}

size_t entry_elements(const zf_engine_state_entry& e) {
  size_t n = 1;
  for (int d = 0; d < e.ndim; ++d) n *= static_cast<size_t>(e.shape[d]);
  return n;
}

// Each rank's save holds what it owns and zeros elsewhere; the ranks' counters and loss
// scales agree. `sum` receives the element-wise sum of the ranks' buffers.
void check_and_sum_rank_saves(const Model& model, const std::vector<const zenflow::EngineState*>& saves,
                              zenflow::EngineState& sum, const std::string& label) {
  const int world = static_cast<int>(saves.size());
  sum = *saves[0];
  for (int r = 0; r < world; ++r) {
    zenflow::EngineState s = *saves[static_cast<size_t>(r)];
    EXPECT_EQ(s.counters, saves[0]->counters) << label << ": rank " << r;
    EXPECT_EQ(s.loss_scale, saves[0]->loss_scale) << label << ": rank " << r;
    EXPECT_EQ(s.layout.size(), sum.layout.size()) << label;
    for (size_t k = 0; k < s.layout.size(); ++k) {
      const zf_engine_state_entry& e = s.layout[k];
      const size_t param = static_cast<size_t>(e.param);
      const bool matrix = model.matrix(param);
      const int64_t n = model.params[param].cols();
      const bool per_column =
          matrix && (e.kind == ZF_STATE_MASTER || e.kind == ZF_STATE_EXP_AVG || e.kind == ZF_STATE_EXP_AVG_SQ ||
                     e.kind == ZF_STATE_STEPS || e.kind == ZF_STATE_ACCUMULATOR);
      const size_t count = entry_elements(e);
      const uint32_t* bits = static_cast<const uint32_t*>(s.data(k));
      ASSERT_TRUE(e.dtype == ZF_DTYPE_F32 || e.dtype == ZF_DTYPE_I32) << label;
      for (size_t x = 0; x < count; ++x) {
        const bool mine = per_column ? owned(static_cast<int64_t>(x) % n, n, r, world) : r == 0;
        if (!mine)
          ASSERT_EQ(bits[x], 0u) << label << ": rank " << r << " wrote " << zf_engine_state_kind_name(e.kind)
                                 << " of param " << e.param << " [" << x << "], which it does not own";
        if (r == 0) continue;
        if (e.dtype == ZF_DTYPE_F32) {
          static_cast<float*>(sum.data(k))[x] += static_cast<const float*>(s.data(k))[x];
        } else {
          static_cast<int32_t*>(sum.data(k))[x] += static_cast<const int32_t*>(s.data(k))[x];
        }
      }
    }
  }
}

// A state against the reference engine's: SELECTED, STEPS and the counters exactly, the rest
// within float32 rounding.
void expect_states_close(zenflow::EngineState& got, zenflow::EngineState& want, const std::string& label) {
  EXPECT_EQ(got.counters, want.counters) << label;
  EXPECT_EQ(got.loss_scale, want.loss_scale) << label;
  ASSERT_EQ(got.layout.size(), want.layout.size()) << label;
  for (size_t k = 0; k < want.layout.size(); ++k) {
    const zf_engine_state_entry& e = want.layout[k];
    ASSERT_EQ(got.layout[k].bytes, e.bytes) << label;
    ASSERT_EQ(got.layout[k].kind, e.kind) << label;
    const size_t count = entry_elements(e);
    for (size_t x = 0; x < count; ++x) {
      if (e.dtype == ZF_DTYPE_I32) {
        ASSERT_EQ(static_cast<const int32_t*>(got.data(k))[x], static_cast<const int32_t*>(want.data(k))[x])
            << label << ": " << zf_engine_state_kind_name(e.kind) << " of param " << e.param << " [" << x << "]";
      } else {
        const float g = static_cast<const float*>(got.data(k))[x], w = static_cast<const float*>(want.data(k))[x];
        ASSERT_TRUE(state_value_close(g, w)) << label << ": " << zf_engine_state_kind_name(e.kind) << " of param "
                                             << e.param << " [" << x << "]: ranks " << g << ", reference " << w;
      }
    }
  }
}

// The selected columns of parameter `param` in a saved state.
std::vector<int32_t> saved_selection(zenflow::EngineState& state, size_t param) {
  for (size_t k = 0; k < state.layout.size(); ++k) {
    const zf_engine_state_entry& e = state.layout[k];
    if (e.kind == ZF_STATE_SELECTED && static_cast<size_t>(e.param) == param) {
      const int32_t* p = static_cast<const int32_t*>(state.data(k));
      return std::vector<int32_t>(p, p + e.shape[0]);
    }
  }
  return {};
}

// ---- the communicator itself ----

TEST(InProcessCollectives, SumsInRankOrderAndGathersForEveryDtype) {
  const int world = 3;
  InProcessGroup group(world);
  const size_t count = 37;
  const zf_dtype dtypes[] = {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16, ZF_DTYPE_I32};
  // Inputs: rank r's element i of dtype d (a value with rounding in every half dtype).
  auto value = [](int r, size_t i) { return 0.3f * static_cast<float>(r + 1) + 0.0137f * static_cast<float>(i); };
  auto make = [&](zf_dtype d, size_t n, int r, size_t offset) {
    HostTensor t(d == ZF_DTYPE_I32 ? ZF_DTYPE_F32 : d, {static_cast<int64_t>(n)});
    std::vector<int32_t> ints(n);
    for (size_t i = 0; i < n; ++i) {
      t.set(static_cast<int64_t>(i), value(r, offset + i));
      ints[i] = static_cast<int32_t>(1000 * r + static_cast<int>(offset + i));
    }
    return std::make_pair(t, ints);
  };
  std::vector<std::string> errors(world);
  std::vector<std::vector<std::vector<uint8_t>>> results(world);  // [rank][call] raw bytes
  run_ranks(world, [&](int r) {
    const zf_engine_collectives c = group.collectives(r);
    for (zf_dtype d : dtypes) {
      const size_t size = InProcessGroup::element_size(d);
      auto raw = [&](std::pair<HostTensor, std::vector<int32_t>>& p) -> void* {
        return d == ZF_DTYPE_I32 ? static_cast<void*>(p.second.data()) : p.first.data();
      };
      auto keep = [&](const void* p, size_t n) {
        const uint8_t* b = static_cast<const uint8_t*>(p);
        results[static_cast<size_t>(r)].emplace_back(b, b + n * size);
      };
      auto in_place = make(d, count, r, 0);
      if (c.all_reduce_sum(c.user, raw(in_place), count, d, nullptr) != ZF_SUCCESS) errors[r] += c.last_error(c.user);
      keep(raw(in_place), count);
      auto scatter_in = make(d, count * world, r, 0);
      auto scatter_out = make(d, count, r, 0);  // poisoned below
      std::memset(raw(scatter_out), 0xff, count * size);
      if (c.reduce_scatter_sum(c.user, raw(scatter_in), raw(scatter_out), count, d, nullptr) != ZF_SUCCESS)
        errors[r] += c.last_error(c.user);
      keep(raw(scatter_out), count);
      // An all-gather whose output holds the input at this rank's place (in place, as NCCL allows).
      auto gathered = make(d, count * world, r, 0);
      std::memset(raw(gathered), 0xff, count * world * size);
      auto mine = make(d, count, r, 0);
      std::memcpy(static_cast<uint8_t*>(raw(gathered)) + static_cast<size_t>(r) * count * size, raw(mine),
                  count * size);
      const void* in = static_cast<uint8_t*>(raw(gathered)) + static_cast<size_t>(r) * count * size;
      if (c.all_gather(c.user, in, raw(gathered), count, d, nullptr) != ZF_SUCCESS) errors[r] += c.last_error(c.user);
      keep(raw(gathered), count * world);
    }
    if (c.all_reduce_sum(c.user, nullptr, 0, ZF_DTYPE_F32, nullptr) != ZF_SUCCESS) errors[r] += "empty call failed";
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  // Every rank got the same bits from the all-reduces and the all-gathers.
  for (int r = 1; r < world; ++r)
    for (size_t call = 0; call < results[0].size(); ++call)
      if (call % 3 != 1) EXPECT_TRUE(results[r][call] == results[0][call]) << "rank " << r << ", call " << call;
  // Against sums written out here: rank order, float accumulation, one rounding.
  for (int r = 0; r < world; ++r) {
    size_t call = 0;
    for (zf_dtype d : dtypes) {
      for (int function = 0; function < 3; ++function, ++call) {
        const std::vector<uint8_t>& got = results[static_cast<size_t>(r)][call];
        const size_t n = function == 2 ? count * world : count;
        for (size_t i = 0; i < n; ++i) {
          // The element's input index and contributing ranks.
          const size_t offset = function == 1 ? static_cast<size_t>(r) * count + i : function == 2 ? i % count : i;
          const int only = function == 2 ? static_cast<int>(i / count) : -1;
          if (d == ZF_DTYPE_I32) {
            int32_t want = 0;
            for (int q = 0; q < world; ++q)
              if (only < 0 || q == only) want += 1000 * q + static_cast<int32_t>(offset);
            int32_t have;
            std::memcpy(&have, got.data() + 4 * i, 4);
            ASSERT_EQ(have, want) << "i32 function " << function << " rank " << r << " [" << i << "]";
            continue;
          }
          HostTensor one(d, {1});
          float acc = 0.0f;
          bool first = true;
          for (int q = 0; q < world; ++q) {
            if (only >= 0 && q != only) continue;
            one.set(0, value(q, offset));
            acc = first ? static_cast<float>(one.get(0)) : acc + static_cast<float>(one.get(0));
            first = false;
          }
          one.set(0, acc);
          const size_t size = InProcessGroup::element_size(d);
          ASSERT_EQ(std::memcmp(got.data() + size * i, one.data(), size), 0)
              << "dtype " << d << " function " << function << " rank " << r << " [" << i << "]";
        }
      }
    }
    const InProcessGroup::Counts& counts = group.counts(r);
    EXPECT_EQ(counts.calls[InProcessGroup::kAllReduce], 5);
    EXPECT_EQ(counts.calls[InProcessGroup::kReduceScatter], 4);
    EXPECT_EQ(counts.calls[InProcessGroup::kAllGather], 4);
    EXPECT_EQ(counts.bytes[InProcessGroup::kAllGather], static_cast<int64_t>(count * (4 + 2 + 2 + 4)));
  }
  EXPECT_EQ(group.timeouts(), 0);
  EXPECT_EQ(group.mismatches(), 0);
}

TEST(InProcessCollectives, AMissingRankTimesOutAndAMismatchFailsEveryRank) {
  {
    InProcessGroup group(2, 0.2);
    const zf_engine_collectives c = group.collectives(0);
    float x = 1.0f;
    EXPECT_EQ(c.all_reduce_sum(c.user, &x, 1, ZF_DTYPE_F32, nullptr), ZF_ERROR_INTERNAL);  // rank 1 never comes
    EXPECT_NE(std::string(c.last_error(c.user)).find("timeout"), std::string::npos) << c.last_error(c.user);
    EXPECT_EQ(group.timeouts(), 1);
    EXPECT_EQ(c.all_reduce_sum(c.user, &x, 1, ZF_DTYPE_F32, nullptr), ZF_ERROR_INTERNAL);  // broken: fails at once
    EXPECT_EQ(x, 1.0f);
  }
  {
    InProcessGroup group(2, 5.0);
    std::vector<zf_status> status(2);
    std::vector<std::string> messages(2);
    run_ranks(2, [&](int r) {
      const zf_engine_collectives c = group.collectives(r);
      float x[4] = {1, 2, 3, 4};
      status[r] = c.all_reduce_sum(c.user, x, r == 0 ? 4 : 3, ZF_DTYPE_F32, nullptr);
      messages[r] = c.last_error(c.user);
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(status[r], ZF_ERROR_INTERNAL);
      EXPECT_NE(messages[r].find("mismatch"), std::string::npos) << messages[r];
    }
    EXPECT_EQ(group.mismatches(), 1);
    EXPECT_EQ(group.timeouts(), 0);
  }
}

// ---- the engine's trajectory against the mean-gradient engine ----

struct TrajectoryCase {
  int world;
  Dtypes dtypes;
  double topk_ratio;
  int64_t update_interval;
  bool overlap;
  bool clip;
  bool probe;  // save after every step: selections, in-place reduction, checkpoint sums
  // > 0: many_matrices_model in buckets of this many bytes, several matrices each, reduced in
  // several passes (reduction groups of at most bucket_bytes / world, or one matrix); 0:
  // parallel_model in the default buckets.
  size_t bucket_bytes = 0;
};

std::string case_name(const TrajectoryCase& c) {
  std::ostringstream s;
  s << "world" << c.world << "_" << dtypes_name(c.dtypes) << "_topk" << static_cast<int>(c.topk_ratio * 10 + 0.5)
    << "_interval" << c.update_interval << (c.overlap ? "_overlap" : "_serial") << (c.clip ? "_clip" : "")
    << (c.probe ? "_probe" : "");
  if (c.bucket_bytes > 0) s << "_buckets" << c.bucket_bytes;
  return s.str();
}

void PrintTo(const TrajectoryCase& c, std::ostream* os) { *os << case_name(c); }

zf_engine_config parallel_config(const TrajectoryCase& c) {
  zf_engine_config config = test_config();
  config.topk_ratio = c.topk_ratio;
  config.update_interval = c.update_interval;
  config.max_update_interval = 3;
  config.auto_ratio = 0.5;
  config.overlap_step = c.overlap ? 1 : 0;
  config.select_strategy = ZF_SELECT_STEP;
  config.select_interval = c.world == 2 ? 2 : 3;
  config.max_grad_norm = c.clip ? 3.0 : 0.0;  // gradient norms here are about 15: always clips
  if (c.bucket_bytes > 0) config.bucket_bytes = c.bucket_bytes;
  return config;
}

class EngineParallelTrajectory : public ::testing::TestWithParam<TrajectoryCase> {};

TEST_P(EngineParallelTrajectory, EveryRankFollowsTheMeanGradientEngine) {
  const TrajectoryCase c = GetParam();
  const std::string label = case_name(c);
  const Model model = c.bucket_bytes > 0 ? many_matrices_model(c.dtypes) : parallel_model(c.dtypes);
  const zf_engine_config config = parallel_config(c);
  const int64_t steps = 10;
  const std::vector<StepGrads> stream = make_grad_stream(model, c.world, 1, steps);
  InProcessGroup group(c.world);
  RunOptions options;
  options.probe = c.probe;
  std::vector<RankRun> ranks = run_parallel(model, config, group, stream, options);
  const RankRun reference = run_single(model, config, stream, options);
  expect_trajectories_match(ranks, reference, label);
  if (HasFatalFailure()) return;
  EXPECT_EQ(group.timeouts(), 0);
  EXPECT_EQ(group.mismatches(), 0);
  EXPECT_GT(reference.final_stats.reselections, 0) << label << ": the run must re-select";

  for (int r = 0; r < c.world; ++r) {
    const zf_engine_stats& s = ranks[static_cast<size_t>(r)].final_stats;
    EXPECT_GT(s.collective_bytes_statistics, 0) << label;
    EXPECT_GT(s.collective_bytes_gradients, 0) << label;
    EXPECT_EQ(s.collective_bytes_statistics, ranks[0].final_stats.collective_bytes_statistics) << label;
  }
  if (c.bucket_bytes > 0) {
    // The reduction scratch (the reduce-scatter's input, the all-gather's output: world
    // chunks) holds a reduction group: at most a rank's share of a bucket or one matrix,
    // plus the padding of the chunks (at most a column of each matrix per rank).
    size_t largest_matrix = 0, padding = 0;
    for (size_t i = 0; i < model.params.size(); ++i) {
      if (!model.matrix(i)) continue;
      const HostTensor& p = model.params[i];
      const size_t element = p.dtype == ZF_DTYPE_F32 ? 4 : 2;
      largest_matrix = std::max(largest_matrix, static_cast<size_t>(p.numel()) * element);
      padding += static_cast<size_t>(p.rows() * c.world) * element;
    }
    const size_t bound = std::max(c.bucket_bytes / static_cast<size_t>(c.world), largest_matrix) + padding;
    for (int r = 0; r < c.world; ++r) {
      const InProcessGroup::Counts& seen = group.counts(r);
      for (int f : {1, 2}) {
        EXPECT_GT(seen.largest[f], 0) << label;
        EXPECT_LE(static_cast<size_t>(seen.largest[f]) * static_cast<size_t>(c.world), bound)
            << label << ", rank " << r << ": a " << (f == 1 ? "reduce-scatter" : "all-gather") << " of "
            << seen.largest[f] << " B per rank";
      }
    }
  }
  if (!c.probe) return;

  for (size_t s = 0; s < static_cast<size_t>(steps); ++s) {
    const std::string at = label + ", after step " + std::to_string(s + 1);
    std::vector<const zenflow::EngineState*> saves;
    for (const RankRun& r : ranks) saves.push_back(&r.saves[s]);
    zenflow::EngineState sum;
    check_and_sum_rank_saves(model, saves, sum, at);
    if (HasFatalFailure()) return;
    zenflow::EngineState want = reference.saves[s];
    expect_states_close(sum, want, at);
    if (HasFatalFailure()) return;
    // The gradients were reduced in place: the selected columns and the dense parameters hold
    // the rank sum on every rank, bit for bit (the sums are exact).
    for (size_t i = 0; i < model.params.size(); ++i) {
      const HostTensor& total = stream[s].sum[i];
      const int64_t n = total.cols();
      std::vector<int32_t> selected;
      if (model.matrix(i)) selected = saved_selection(sum, i);
      for (int r = 0; r < c.world; ++r) {
        const HostTensor& g = ranks[static_cast<size_t>(r)].grads[s][i];
        for (int64_t e = 0; e < g.numel(); ++e) {
          const bool reduced =
              !model.matrix(i) || std::binary_search(selected.begin(), selected.end(), static_cast<int32_t>(e % n));
          if (!reduced) continue;
          ASSERT_EQ(g.get(e), total.get(e))
              << at << ": rank " << r << ", gradient of param " << i << " [" << e << "] is not the rank sum";
        }
      }
    }
  }
}

std::vector<TrajectoryCase> trajectory_cases() {
  std::vector<TrajectoryCase> out;
  for (int world : {2, 3})
    for (Dtypes d : {Dtypes::kF32, Dtypes::kBF16, Dtypes::kMixed})
      for (double topk : {0.1, 0.3})
        for (int64_t interval : {1, 3, 0})
          for (bool overlap : {true, false})
            for (bool clip : {false, true})
              out.push_back(TrajectoryCase{world, d, topk, interval, overlap, clip, false});
  // Buckets of several matrices, each reduced in several passes.
  for (int world : {2, 3})
    for (Dtypes d : {Dtypes::kF32, Dtypes::kMixed})
      for (int64_t interval : {3, 0})
        out.push_back(TrajectoryCase{world, d, 0.3, interval, interval == 3, interval == 0, false, 1536});
  // More selected columns than the scratch holds: they are all-reduced group by group too.
  for (int world : {2, 3}) out.push_back(TrajectoryCase{world, Dtypes::kBF16, 0.7, 3, true, true, false, 1536});
  return out;
}

std::vector<TrajectoryCase> probe_cases() {
  std::vector<TrajectoryCase> out;
  for (int world : {2, 3})
    for (Dtypes d : {Dtypes::kBF16, Dtypes::kMixed})
      for (int64_t interval : {1, 3, 0})
        for (bool overlap : {true, false})
          out.push_back(TrajectoryCase{world, d, overlap ? 0.3 : 0.1, interval, overlap, interval != 3, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, EngineParallelTrajectory, ::testing::ValuesIn(trajectory_cases()),
                         [](const ::testing::TestParamInfo<TrajectoryCase>& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(SaveEveryStep, EngineParallelTrajectory, ::testing::ValuesIn(probe_cases()),
                         [](const ::testing::TestParamInfo<TrajectoryCase>& info) { return case_name(info.param); });

// ---- the split step: each bucket reduced as it fills, during backward ----

struct SplitCase {
  int world;
  Dtypes dtypes;
  int64_t update_interval;
  bool overlap;
  Form form;
  int plain_rank;           // a rank whose backward handed nothing over: it steps plainly
  bool release = false;     // config.release_gradients (the split run only)
  size_t bucket_bytes = 0;  // > 0: many_matrices_model in buckets of this size (several passes)
};

std::string split_case_name(const SplitCase& c) {
  std::ostringstream s;
  s << "world" << c.world << "_" << dtypes_name(c.dtypes) << "_interval" << c.update_interval
    << (c.overlap ? "_overlap" : "_serial") << (c.form == Form::kSplit ? "_submit" : "_ready");
  if (c.plain_rank >= 0) s << "_plain" << c.plain_rank;
  if (c.release) s << "_release";
  if (c.bucket_bytes > 0) s << "_buckets" << c.bucket_bytes;
  return s.str();
}

void PrintTo(const SplitCase& c, std::ostream* os) { *os << split_case_name(c); }

size_t model_matrices(const Model& model) {
  size_t n = 0;
  for (size_t i = 0; i < model.params.size(); ++i) n += model.matrix(i) ? 1 : 0;
  return n;
}

class EngineParallelSplit : public ::testing::TestWithParam<SplitCase> {};

// The buckets are reduced in one order on every rank (the last first) whatever order their
// gradients come in, and a rank in a plain step follows the split form: the same collectives
// on every rank, and the result of plain steps bit for bit (selection steps, windows, the
// dense parameters, several buckets through a ring of two slots).
TEST_P(EngineParallelSplit, ReducesBucketsInBackwardBitForBitAsPlainSteps) {
  const SplitCase c = GetParam();
  const std::string label = split_case_name(c);
  const Model model = c.bucket_bytes > 0 ? many_matrices_model(c.dtypes) : parallel_model(c.dtypes);
  zf_engine_config config =
      parallel_config(TrajectoryCase{c.world, c.dtypes, 0.3, c.update_interval, c.overlap, true, false});
  config.bucket_bytes = c.bucket_bytes > 0 ? c.bucket_bytes : 64;
  config.staging_slots = 2;
  const int64_t steps = 10;
  const std::vector<StepGrads> stream = make_grad_stream(model, c.world, 1, steps);
  RunOptions plain_options, split_options;
  plain_options.probe = split_options.probe = true;
  split_options.form = c.form;
  split_options.plain_rank = c.plain_rank;
  split_options.release = c.release;
  zf_engine_config split_config = config;
  split_config.release_gradients = c.release ? 1 : 0;
  InProcessGroup plain_group(c.world), split_group(c.world);
  const std::vector<RankRun> plain = run_parallel(model, config, plain_group, stream, plain_options);
  const std::vector<RankRun> split = run_parallel(model, split_config, split_group, stream, split_options);
  EXPECT_EQ(split_group.timeouts(), 0) << label;
  EXPECT_EQ(split_group.mismatches(), 0) << label << ": the ranks' collectives differ";
  for (int r = 0; r < c.world; ++r) {
    const RankRun& want = plain[static_cast<size_t>(r)];
    const RankRun& got = split[static_cast<size_t>(r)];
    ASSERT_TRUE(want.error.empty()) << label << ": " << want.error;
    ASSERT_TRUE(got.error.empty()) << label << ": rank " << r << ": " << got.error;
    ASSERT_EQ(got.params.size(), want.params.size()) << label;
    for (size_t s = 0; s < want.params.size(); ++s) {
      for (size_t i = 0; i < want.params[s].size(); ++i) {
        ASSERT_TRUE(got.params[s][i].bitwise_equal(want.params[s][i]))
            << label << ": rank " << r << ", param " << i << " after step " << s + 1;
        if (c.release) continue;  // released gradients were poisoned
        ASSERT_TRUE(got.grads[s][i].bitwise_equal(want.grads[s][i]))
            << label << ": rank " << r << ", the reduced gradient of param " << i << " at step " << s + 1;
      }
      const zenflow::EngineState& a = got.saves[s];
      const zenflow::EngineState& b = want.saves[s];
      ASSERT_EQ(a.storage.size(), b.storage.size());
      for (size_t e = 0; e < a.storage.size(); ++e)
        ASSERT_EQ(a.storage[e], b.storage[e])
            << label << ": rank " << r << ", state entry " << e << " after step " << s + 1;
      ASSERT_EQ(a.counters, b.counters) << label << ": rank " << r << " after step " << s + 1;
    }
    EXPECT_EQ(got.final_stats.collective_bytes_gradients, want.final_stats.collective_bytes_gradients) << label;
    if (r != c.plain_rank) {
      // The buckets were reduced during "backward": every matrix but the first (the last to
      // arrive on rank 0, whose bucket waits for it) was reduced before end_step on some step.
      ASSERT_EQ(got.reduced_before_end.size(), static_cast<size_t>(steps)) << label;
      EXPECT_GT(*std::max_element(got.reduced_before_end.begin(), got.reduced_before_end.end()), 2u)
          << label << ": rank " << r << " reduced nothing before end_step";
    }
    EXPECT_EQ(got.final_stats.reselections, want.final_stats.reselections) << label;
    // Released on the steps that are not selection steps, every matrix each time.
    if (c.release && r != c.plain_rank) EXPECT_GE(got.released, 3u * model_matrices(model)) << label << ", rank " << r;
  }
  EXPECT_GT(plain[0].final_stats.reselections, 0) << label << ": the run must re-select";
}

// Readiness in data parallel: a gradient is read when its bucket is reduced. Parameter 0's
// bucket is reduced last (the order is backward's), so a second mark of parameter 0 right
// after its first (another tensor: autograd replaced .grad) is simply the one read: the step
// equals plain steps with the final gradients. A second mark after its bucket was reduced
// fails end_step_with on every rank, and the next steps run on.
TEST(EngineParallelSplit, AGradientMarkedAgainIsReadIfItsBucketWasNotReducedYet) {
  const int world = 2;
  const Model model = parallel_model(Dtypes::kF32);
  zf_engine_config config = parallel_config(TrajectoryCase{world, Dtypes::kF32, 0.3, 3, true, true, false});
  config.bucket_bytes = 64;
  const int64_t steps = 6, late_step = 4;
  const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, steps);
  InProcessGroup plain_group(world), group(world);
  const std::vector<RankRun> want = run_parallel(model, config, plain_group, stream, RunOptions{});
  std::vector<std::vector<std::vector<HostTensor>>> params(world);  // per rank, after each step
  std::vector<std::vector<zf_status>> ended(world);
  std::vector<std::string> late_message(world);
  run_ranks(world, [&](int r) {
    Model mine = model;
    zenflow::Engine engine(mine.tensors(), mine.param_groups, mine.groups, config);
    const zf_engine_collectives c = group.collectives(r);
    zenflow::check(zf_engine_set_collectives(engine.get(), &c));
    std::deque<std::vector<HostTensor>> alive;
    for (int64_t t = 1; t <= steps; ++t) {
      alive.push_back(stream[static_cast<size_t>(t - 1)].rank[static_cast<size_t>(r)]);
      std::vector<zf_tensor> final_grads = tensors_of(alive.back());
      std::vector<HostTensor> first = alive.back();  // other values, in other memory
      for (HostTensor& h : first)
        for (int64_t e = 0; e < h.numel(); ++e) h.set(e, 100.0f);
      std::vector<zf_tensor> first_grads = tensors_of(first);
      engine.begin_step(step_lrs(mine, t));
      const size_t n = final_grads.size();
      if (t == late_step && r == 1) {
        // every parameter once (each bucket reduced as it fills), then matrix 2 again (a
        // dense parameter marked again is simply read at end_step)
        for (size_t i = n; i > 0; --i) zenflow::check(zf_engine_mark_ready(engine.get(), i - 1, &final_grads[i - 1]));
        zenflow::check(zf_engine_mark_ready(engine.get(), 2, &final_grads[2]));
      } else {
        zenflow::check(zf_engine_mark_ready(engine.get(), 0, &first_grads[0]));
        zenflow::check(zf_engine_mark_ready(engine.get(), 0, &final_grads[0]));  // before its bucket's turn
        for (size_t i = n; i > 1; --i) zenflow::check(zf_engine_mark_ready(engine.get(), i - 1, &final_grads[i - 1]));
      }
      const zf_status status = zf_engine_end_step_with(engine.get(), final_grads.data(), n);
      ended[static_cast<size_t>(r)].push_back(status);
      if (t == late_step) late_message[static_cast<size_t>(r)] = status == ZF_SUCCESS ? "" : zf_last_error();
      params[static_cast<size_t>(r)].push_back(mine.params);
    }
  });
  EXPECT_EQ(group.mismatches(), 0);
  EXPECT_EQ(group.timeouts(), 0);
  for (int r = 0; r < world; ++r) {
    for (int64_t t = 1; t <= steps; ++t)
      EXPECT_EQ(ended[static_cast<size_t>(r)][static_cast<size_t>(t - 1)] == ZF_SUCCESS, t != late_step)
          << "rank " << r << ", step " << t;
  }
  EXPECT_NE(late_message[1].find("grew after its bucket was reduced"), std::string::npos) << late_message[1];
  EXPECT_NE(late_message[0].find("rank(s) 1 of 2 failed"), std::string::npos) << late_message[0];
  for (int r = 0; r < world; ++r) {
    const auto& mine = params[static_cast<size_t>(r)];
    // Before the late step: plain steps with the final gradients, bit for bit.
    for (int64_t t = 1; t < late_step; ++t)
      for (size_t i = 0; i < mine[0].size(); ++i)
        EXPECT_TRUE(mine[static_cast<size_t>(t - 1)][i].bitwise_equal(
            want[static_cast<size_t>(r)].params[static_cast<size_t>(t - 1)][i]))
            << "rank " << r << ", param " << i << " after step " << t;
    // The refused step wrote no weight; the ranks stay equal after it.
    for (size_t i = 0; i < mine[0].size(); ++i) {
      EXPECT_TRUE(mine[late_step - 1][i].bitwise_equal(mine[late_step - 2][i])) << "rank " << r << ", param " << i;
      EXPECT_TRUE(mine[steps - 1][i].bitwise_equal(params[0][steps - 1][i])) << "rank " << r << ", param " << i;
    }
  }
}

// The split step on simulated asynchronous devices (each rank's lanes run lazily in random
// orders; collectives in stream order): the reduction lane is ordered against the compute
// lane (the gradients, the scratch, the staging slots) and the result is the host backend's
// plain steps, bit for bit. Removing the reduction lane's wait for the compute lane, or the
// compute lane's for the reductions at end_step, fails it. Seeds 5 and 6 release the
// gradients (poisoned once reported).
TEST(EngineParallelSplit, OnAsynchronousDevicesMatchesPlainStepsBitForBit) {
  for (int world : {2, 3}) {
    for (uint64_t seed : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u}) {
      const std::string label = "world " + std::to_string(world) + ", seed " + std::to_string(seed);
      // Seeds 7 and 8: buckets of several matrices, each reduced in several passes through
      // the one scratch (its reuse ordered on the lanes).
      const bool passes = seed >= 7;
      const Model model = passes ? many_matrices_model(Dtypes::kMixed) : parallel_model(Dtypes::kMixed);
      zf_engine_config config =
          parallel_config(TrajectoryCase{world, Dtypes::kMixed, 0.3, seed == 3 ? 0 : 3, seed != 2, true, false});
      config.bucket_bytes = passes ? 1536 : 64;
      config.staging_slots = 2;
      const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, 10);
      const bool release = seed == 5 || seed == 6 || seed == 8;
      config.release_gradients = release ? 1 : 0;  // the plain run is the same with it
      RunOptions plain_options, simulated;
      simulated.release = release;
      simulated.form = seed % 3 == 2 ? Form::kReady : Form::kSplit;
      simulated.simulated_seed = seed;
      simulated.sync_every_step = seed <= 3 || seed == 7;
      InProcessGroup plain_group(world), simulated_group(world);
      const std::vector<RankRun> want = run_parallel(model, config, plain_group, stream, plain_options);
      const std::vector<RankRun> got = run_parallel(model, config, simulated_group, stream, simulated);
      EXPECT_EQ(simulated_group.mismatches(), 0) << label;
      for (int r = 0; r < world; ++r) {
        const RankRun& a = got[static_cast<size_t>(r)];
        const RankRun& b = want[static_cast<size_t>(r)];
        ASSERT_TRUE(a.error.empty()) << label << ", rank " << r << ": " << a.error;
        ASSERT_TRUE(b.error.empty()) << label << ": " << b.error;
        if (simulated.release) EXPECT_GT(a.released, 0u) << label << ", rank " << r;
        const size_t skipped = b.params.size() - a.params.size();  // not kept without a sync
        for (size_t s = 0; s < a.params.size(); ++s)
          for (size_t i = 0; i < b.params[s].size(); ++i)
            ASSERT_TRUE(a.params[s][i].bitwise_equal(b.params[skipped + s][i]))
                << label << ", rank " << r << ": param " << i << " after step " << skipped + s + 1;
      }
    }
  }
}

std::vector<SplitCase> split_cases() {
  std::vector<SplitCase> out;
  for (int world : {2, 3})
    for (Dtypes d : {Dtypes::kF32, Dtypes::kMixed})
      for (int64_t interval : {1, 3, 0})
        for (bool overlap : {true, false}) out.push_back(SplitCase{world, d, interval, overlap, Form::kSplit, -1});
  for (int world : {2, 3}) {
    out.push_back(SplitCase{world, Dtypes::kBF16, 3, true, Form::kReady, -1});
    out.push_back(SplitCase{world, Dtypes::kMixed, 0, true, Form::kSplit, world - 1});
    out.push_back(SplitCase{world, Dtypes::kMixed, 3, false, Form::kReady, 0});
    // release_gradients: fp32, bf16 and mixed, fixed and auto windows, overlap on and off
    out.push_back(SplitCase{world, Dtypes::kF32, 3, true, Form::kReady, -1, true});
    out.push_back(SplitCase{world, Dtypes::kBF16, 0, true, Form::kReady, -1, true});
    out.push_back(SplitCase{world, Dtypes::kMixed, 1, false, Form::kSplit, -1, true});
    out.push_back(SplitCase{world, Dtypes::kMixed, 3, true, Form::kReady, world - 1, true});
    // Buckets of several matrices, each reduced in several passes.
    out.push_back(SplitCase{world, Dtypes::kF32, 3, true, Form::kSplit, -1, false, 1536});
    out.push_back(SplitCase{world, Dtypes::kMixed, 0, false, Form::kReady, 0, true, 1536});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, EngineParallelSplit, ::testing::ValuesIn(split_cases()),
                         [](const ::testing::TestParamInfo<SplitCase>& info) { return split_case_name(info.param); });

TEST(EngineParallel, WorldSizeOneIsBitwiseASingleEngine) {
  const Model model = parallel_model(Dtypes::kMixed);
  const zf_engine_config config = parallel_config(TrajectoryCase{1, Dtypes::kMixed, 0.3, 3, true, true, false});
  const std::vector<StepGrads> stream = make_grad_stream(model, 1, 1, 8);
  InProcessGroup group(1);
  const std::vector<RankRun> ranks = run_parallel(model, config, group, stream, RunOptions{});
  const RankRun reference = run_single(model, config, stream, RunOptions{});
  ASSERT_TRUE(ranks[0].error.empty()) << ranks[0].error;
  ASSERT_EQ(ranks[0].params.size(), reference.params.size());
  for (size_t s = 0; s < reference.params.size(); ++s)
    for (size_t i = 0; i < model.params.size(); ++i)
      ASSERT_TRUE(ranks[0].params[s][i].bitwise_equal(reference.params[s][i])) << "step " << s + 1 << " param " << i;
}

// ---- sharded host work ----

TEST(EngineParallel, HostStateAndCopiesPerRankAreAboutOneNth) {
  const Model model = parallel_model(Dtypes::kMixed);
  for (int world : {2, 3}) {
    const TrajectoryCase c{world, Dtypes::kMixed, 0.1, 3, true, false, false};
    const zf_engine_config config = parallel_config(c);
    const int64_t steps = 9;
    const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, steps);
    InProcessGroup group(world);
    const std::vector<RankRun> ranks = run_parallel(model, config, group, stream, RunOptions{});
    const RankRun single = run_single(model, config, stream, RunOptions{});
    expect_trajectories_match(ranks, single, case_name(c));
    if (HasFatalFailure()) return;
    const zf_engine_stats& one = single.final_stats;
    // Slack per rank: the ranges round to whole columns (one more column per matrix than
    // 1/N, of every host buffer: master, m, v, two accumulators, steps, U, the staging ring).
    int64_t column_slack = 0, down_slack = 0, up_slack = 0;
    int64_t matrix_elements = 0, columns = 0, selected_per_step = 0, dense_elements = 0;
    for (size_t i = 0; i < model.params.size(); ++i) {
      const HostTensor& p = model.params[i];
      const int64_t psize = p.dtype == ZF_DTYPE_F32 ? 4 : 2;
      if (!model.matrix(i)) {  // a dense parameter's column sums are not shared
        dense_elements += p.numel() * psize;
        continue;
      }
      columns += p.cols();  // a matrix's column sums are shared
      const int64_t m = p.rows(), n = p.cols();
      const int64_t k = std::min(n, std::max<int64_t>(1, static_cast<int64_t>(std::floor(config.topk_ratio * n))));
      column_slack += m * (5 * 4 + psize + config.staging_slots * psize) + 4;
      down_slack += m * psize * steps;
      up_slack += m * psize * steps;
      matrix_elements += p.numel() * psize;
      selected_per_step += k * m * psize;
    }
    for (int r = 0; r < world; ++r) {
      const zf_engine_stats& s = ranks[static_cast<size_t>(r)].final_stats;
      const std::string at = "world " + std::to_string(world) + ", rank " + std::to_string(r);
      // The communicator saw what the engine counts (the contract of collective_bytes_*: the
      // all-reduced buffer, the reduce-scatter's input and the all-gather's output, i.e.
      // world * count elements for the last two), and nothing else.
      const InProcessGroup::Counts& seen = group.counts(r);
      EXPECT_EQ(seen.bytes[0] + world * (seen.bytes[1] + seen.bytes[2]),
                s.collective_bytes_statistics + s.collective_bytes_gradients + s.collective_bytes_upload)
          << at << ": the communicator saw all_reduce " << seen.bytes[0] << " B, reduce_scatter " << seen.bytes[1]
          << " B, all_gather " << seen.bytes[2] << " B (count * element size)";
      EXPECT_GT(s.host_state_bytes, 0) << at;
      EXPECT_LE(s.host_state_bytes, one.host_state_bytes / world + column_slack + 1024)
          << at << ": single engine " << one.host_state_bytes;
      EXPECT_GT(s.bytes_down, 0) << at;
      EXPECT_LE(s.bytes_down, one.bytes_down / world + down_slack) << at << ": single engine " << one.bytes_down;
      EXPECT_GT(s.bytes_up, 0) << at;
      EXPECT_LE(s.bytes_up, one.bytes_up / world + up_slack) << at << ": single engine " << one.bytes_up;
      // Statistics: one float per column of every matrix and a few flags per step,
      // whatever the rows; the gradients are at least the selected columns and the dense
      // parameters every step, and at most the whole gradient.
      EXPECT_GE(s.collective_bytes_statistics, steps * 4 * columns) << at;
      EXPECT_LE(s.collective_bytes_statistics,
                steps * 4 * (columns + 2 * static_cast<int64_t>(model.params.size()) + 16))
          << at;
      EXPECT_GE(s.collective_bytes_gradients, steps * (selected_per_step + dense_elements)) << at;
      EXPECT_LE(s.collective_bytes_gradients, steps * (matrix_elements + dense_elements + 64 * world)) << at;
      EXPECT_GT(s.collective_bytes_upload, 0) << at;
      if (r + 1 == world) {
        // Ownership partitions the deferred columns: the ranks together copy what one engine does.
        int64_t down = 0, up = 0;
        for (const RankRun& run : ranks) {
          down += run.final_stats.bytes_down;
          up += run.final_stats.bytes_up;
        }
        EXPECT_EQ(down, one.bytes_down) << "world " << world;
        EXPECT_EQ(up, one.bytes_up) << "world " << world;
      }
      std::printf(
          "[ info     ] %s: host_state_bytes %lld (single %lld), bytes_down %lld (%lld), bytes_up %lld (%lld), "
          "collective statistics %lld, gradients %lld, upload %lld\n",
          at.c_str(), static_cast<long long>(s.host_state_bytes), static_cast<long long>(one.host_state_bytes),
          static_cast<long long>(s.bytes_down), static_cast<long long>(one.bytes_down),
          static_cast<long long>(s.bytes_up), static_cast<long long>(one.bytes_up),
          static_cast<long long>(s.collective_bytes_statistics), static_cast<long long>(s.collective_bytes_gradients),
          static_cast<long long>(s.collective_bytes_upload));
    }
  }
}

TEST(EngineParallel, StatisticsCostOneFloatPerColumnWhateverTheRows) {
  // Tall matrices: the gradient bytes grow with the rows, the statistics do not.
  Model model;
  model.groups = {zf_engine_group{1e-2, 0.0, 0}};
  for (const auto& shape : {std::vector<int64_t>{64, 31}, std::vector<int64_t>{64, 13}, std::vector<int64_t>{7}}) {
    model.params.emplace_back(shape.size() == 2 && shape[1] == 13 ? ZF_DTYPE_BF16 : ZF_DTYPE_F32, shape);
    model.param_groups.push_back(0);
  }
  for (HostTensor& p : model.params)
    for (int64_t e = 0; e < p.numel(); ++e) p.set(e, 0.01f * static_cast<float>(e % 17) - 0.08f);
  for (int world : {2, 3}) {
    const zf_engine_config config = parallel_config(TrajectoryCase{world, Dtypes::kF32, 0.1, 2, true, false, false});
    const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, 6);
    InProcessGroup group(world);
    const std::vector<RankRun> ranks = run_parallel(model, config, group, stream, RunOptions{});
    const RankRun single = run_single(model, config, stream, RunOptions{});
    expect_trajectories_match(ranks, single, "tall, world " + std::to_string(world));
    if (HasFatalFailure()) return;
    for (const RankRun& r : ranks) {
      const zf_engine_stats& s = r.final_stats;
      EXPECT_GT(s.collective_bytes_gradients, 8 * s.collective_bytes_statistics)
          << "world " << world << ": gradients " << s.collective_bytes_gradients << " B, statistics "
          << s.collective_bytes_statistics << " B";
    }
  }
}

// ---- checkpoints across world sizes ----

TEST(EngineParallel, CheckpointOfTwoRanksSumsToTheSingleStateAndResumesOnThreeRanksAndOnOne) {
  const Model model = parallel_model(Dtypes::kMixed);
  const TrajectoryCase c{2, Dtypes::kMixed, 0.3, 3, true, true, false};
  zf_engine_config config = parallel_config(c);
  config.selection_score = ZF_SCORE_WINDOW;  // the window scores are part of the state
  const int64_t first_steps = 5;             // the save falls mid-window
  const std::vector<StepGrads> stream2 = make_grad_stream(model, 2, 1, first_steps);
  InProcessGroup two(2);
  RunOptions save_options;
  save_options.save_at_end = true;
  std::vector<RankRun> ranks = run_parallel(model, config, two, stream2, save_options);
  RankRun reference = run_single(model, config, stream2, save_options);
  expect_trajectories_match(ranks, reference, "two ranks");
  if (HasFatalFailure()) return;
  zenflow::EngineState full;
  check_and_sum_rank_saves(model, {&ranks[0].saves[0], &ranks[1].saves[0]}, full, "save");
  if (HasFatalFailure()) return;
  expect_states_close(full, reference.saves[0], "two ranks' summed save against the single engine's");
  if (HasFatalFailure()) return;
  EXPECT_EQ(full.counters[ZF_COUNTER_STEP], first_steps);
  for (size_t i = 0; i < model.params.size(); ++i) {
    ASSERT_TRUE(ranks[1].params_after_save[i].bitwise_equal(ranks[0].params_after_save[i])) << "param " << i;
    for (int64_t e = 0; e < model.params[i].numel(); ++e)
      ASSERT_TRUE(param_close(ranks[0].params_after_save[i].get(e), reference.params_after_save[i].get(e),
                              model.params[i].dtype))
          << "after the save's flush: param " << i << " [" << e << "]";
  }

  // The whole state, into three ranks and into one engine, from the same weights.
  Model resumed = model;
  resumed.params = ranks[0].params_after_save;
  const int64_t more_steps = 7;
  const std::vector<StepGrads> stream3 = make_grad_stream(model, 3, first_steps + 1, more_steps);
  RunOptions load_options;
  load_options.first_step = first_steps + 1;
  load_options.load = &full;
  load_options.save_at_end = true;
  InProcessGroup three(3);
  const std::vector<RankRun> ranks3 = run_parallel(resumed, config, three, stream3, load_options);
  RankRun single = run_single(resumed, config, stream3, load_options);
  expect_trajectories_match(ranks3, single, "three ranks resumed from two");
  if (HasFatalFailure()) return;
  EXPECT_EQ(ranks3[0].final_stats.steps, first_steps + more_steps);
  EXPECT_GT(single.final_stats.reselections, 0);
  zenflow::EngineState full3;
  check_and_sum_rank_saves(model, {&ranks3[0].saves[0], &ranks3[1].saves[0], &ranks3[2].saves[0]}, full3,
                           "save of three ranks");
  if (HasFatalFailure()) return;
  expect_states_close(full3, single.saves[0], "three ranks' summed save against the single engine's");
  EXPECT_EQ(three.timeouts() + two.timeouts(), 0);
}

// A checkpoint does not change a data-parallel run, and two ranks resumed from it (the
// ranks' partial saves summed) continue it bit for bit, wherever in a window it falls.
TEST(EngineParallel, ASaveAnywhereInAWindowChangesNothingAndTwoRanksResumeBitForBit) {
  const Model model = parallel_model(Dtypes::kMixed);
  const TrajectoryCase c{2, Dtypes::kMixed, 0.3, 3, true, true, false};
  const zf_engine_config config = parallel_config(c);
  const int64_t steps = 9;
  const std::vector<StepGrads> stream = make_grad_stream(model, 2, 1, steps);
  InProcessGroup whole_group(2);
  const std::vector<RankRun> uninterrupted = run_parallel(model, config, whole_group, stream, RunOptions{});
  ASSERT_EQ(uninterrupted[0].error, "");
  for (int64_t at = 1; at < steps; ++at) {
    const std::string label = "save after step " + std::to_string(at);
    const std::vector<StepGrads> first(stream.begin(), stream.begin() + at);
    const std::vector<StepGrads> rest(stream.begin() + at, stream.end());
    InProcessGroup first_group(2);
    RunOptions save_options;
    save_options.save_at_end = true;
    const std::vector<RankRun> before = run_parallel(model, config, first_group, first, save_options);
    ASSERT_EQ(before[0].error + before[1].error, "") << label;
    zenflow::EngineState full;
    check_and_sum_rank_saves(model, {&before[0].saves[0], &before[1].saves[0]}, full, label);
    if (HasFatalFailure()) return;
    Model resumed = model;
    resumed.params = before[0].params_after_save;  // the save changed nothing: the run's weights
    for (size_t i = 0; i < model.params.size(); ++i)
      ASSERT_TRUE(resumed.params[i].bitwise_equal(uninterrupted[0].params[static_cast<size_t>(at - 1)][i]))
          << label << ": the save changed param " << i;
    RunOptions load_options;
    load_options.first_step = at + 1;
    load_options.load = &full;
    InProcessGroup rest_group(2);
    const std::vector<RankRun> after = run_parallel(resumed, config, rest_group, rest, load_options);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(after[static_cast<size_t>(r)].error, "") << label;
      for (size_t s2 = 0; s2 < rest.size(); ++s2)
        for (size_t i = 0; i < model.params.size(); ++i)
          ASSERT_TRUE(after[static_cast<size_t>(r)].params[s2][i].bitwise_equal(
              uninterrupted[static_cast<size_t>(r)].params[static_cast<size_t>(at) + s2][i]))
              << label << ", rank " << r << ", step " << at + 1 + static_cast<int64_t>(s2) << ", param " << i;
    }
  }
}

// ---- failures ----

// "rank 1" or "rank(s) 1" (of a list), as a word.
bool names_rank_one(const std::string& message) {
  return std::regex_search(message, std::regex(R"(\brank(\(s\))? (\d+, )*1\b)"));
}

// Each rank steps until its first failure, then once more; records (step, status, message).
struct FailureLog {
  int64_t first_failed_step = 0;
  zf_status first_status = ZF_SUCCESS;
  std::string first_message;
  zf_status again_status = ZF_SUCCESS;
  std::string again_message;
  std::vector<HostTensor> params_before_failure, params_after_failure;
};

TEST(EngineParallel, HostLaneFaultOnRankOneFailsEveryRankWithinAFewSteps) {
  const int world = 3;
  const Model model = parallel_model(Dtypes::kMixed);
  zf_engine_config config = parallel_config(TrajectoryCase{world, Dtypes::kMixed, 0.3, 1, false, false, false});
  config.host_threads = 2;
  const int64_t max_steps = 8, inject_before = 3;
  const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, max_steps);
  InProcessGroup group(world, 5.0);
  std::vector<FailureLog> logs(world);
  run_ranks(world, [&](int r) {
    FailureLog& log = logs[static_cast<size_t>(r)];
    Model mine = model;
    zenflow::Engine engine(mine.tensors(), mine.param_groups, mine.groups, config);
    const zf_engine_collectives c = group.collectives(r);
    if (zf_engine_set_collectives(engine.get(), &c) != ZF_SUCCESS) {
      log.first_message = std::string("set_collectives: ") + zf_last_error();
      group.abort(log.first_message);
      return;
    }
    for (int64_t t = 1; t <= max_steps; ++t) {
      if (r == 1 && t == inject_before) zf::testing::inject_host_lane_fault(engine.get(), "rank one's disk on fire");
      std::vector<HostTensor> g = stream[static_cast<size_t>(t - 1)].rank[static_cast<size_t>(r)];
      std::vector<zf_tensor> tensors = tensors_of(g);
      const zf_status status = zf_engine_step(engine.get(), tensors.data(), tensors.size(), nullptr, 0);
      if (status == ZF_SUCCESS) continue;
      log.first_failed_step = t;
      log.first_status = status;
      log.first_message = zf_last_error();
      const zf_status again = zf_engine_step(engine.get(), tensors.data(), tensors.size(), nullptr, 0);
      log.again_status = again;
      log.again_message = again == ZF_SUCCESS ? "" : zf_last_error();
      return;
    }
  });
  EXPECT_EQ(group.timeouts(), 0) << "a rank was left waiting in a collective";
  EXPECT_EQ(group.mismatches(), 0);
  for (int r = 0; r < world; ++r) {
    const FailureLog& log = logs[static_cast<size_t>(r)];
    ASSERT_NE(log.first_failed_step, 0) << "rank " << r << " never failed: " << log.first_message;
    EXPECT_GE(log.first_failed_step, inject_before) << "rank " << r;
    EXPECT_LE(log.first_failed_step, inject_before + 3) << "rank " << r;
    EXPECT_EQ(log.first_failed_step, logs[1].first_failed_step) << "rank " << r << " failed at another step";
    if (r == 1) {
      EXPECT_NE(log.first_message.find("rank one's disk on fire"), std::string::npos) << log.first_message;
      EXPECT_NE(log.again_message.find("rank one's disk on fire"), std::string::npos) << log.again_message;
    } else {
      EXPECT_EQ(log.first_status, ZF_ERROR_INVALID_VALUE) << log.first_message;
      EXPECT_TRUE(names_rank_one(log.first_message)) << log.first_message;
    }
    EXPECT_NE(log.again_status, ZF_SUCCESS) << "rank " << r << ": the failure is sticky on rank 1, so every rank fails";
  }
}

TEST(EngineParallel, BadGradientOnOneRankFailsEveryRankAndChangesNothing) {
  const int world = 3;
  const Model model = parallel_model(Dtypes::kMixed);
  const zf_engine_config config = parallel_config(TrajectoryCase{world, Dtypes::kMixed, 0.3, 3, true, true, false});
  const int64_t steps = 6, bad_step = 4;
  const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, steps);
  InProcessGroup group(world, 5.0);
  std::vector<FailureLog> logs(world);
  std::vector<RankRun> runs(world);
  run_ranks(world, [&](int r) {
    FailureLog& log = logs[static_cast<size_t>(r)];
    RankRun& run = runs[static_cast<size_t>(r)];
    Model mine = model;
    zenflow::Engine engine(mine.tensors(), mine.param_groups, mine.groups, config);
    const zf_engine_collectives c = group.collectives(r);
    if (zf_engine_set_collectives(engine.get(), &c) != ZF_SUCCESS) {
      log.first_message = std::string("set_collectives: ") + zf_last_error();
      group.abort(log.first_message);
      return;
    }
    for (int64_t t = 1; t <= steps; ++t) {
      std::vector<HostTensor> g = stream[static_cast<size_t>(t - 1)].rank[static_cast<size_t>(r)];
      const std::vector<double> lrs = step_lrs(mine, t);
      if (t == bad_step) {
        std::vector<HostTensor> bad = g;
        const HostTensor& p0 = mine.params[0];
        bad[0] = HostTensor(p0.dtype == ZF_DTYPE_F32 ? ZF_DTYPE_BF16 : ZF_DTYPE_F32, p0.shape);
        std::vector<zf_tensor> tensors = r == 1 ? tensors_of(bad) : tensors_of(g);
        log.params_before_failure = mine.params;
        const zf_status status = zf_engine_step(engine.get(), tensors.data(), tensors.size(), lrs.data(), lrs.size());
        log.first_status = status;
        log.first_failed_step = status == ZF_SUCCESS ? 0 : t;
        log.first_message = status == ZF_SUCCESS ? "" : zf_last_error();
        log.params_after_failure = mine.params;
        g = stream[static_cast<size_t>(t - 1)].rank[static_cast<size_t>(r)];  // fresh: the call may have reduced it
      }
      // Retry with good gradients: every rank must get the same outcome.
      std::vector<zf_tensor> tensors = tensors_of(g);
      const zf_status status = zf_engine_step(engine.get(), tensors.data(), tensors.size(), lrs.data(), lrs.size());
      if (status != ZF_SUCCESS) {
        log.again_status = status;
        log.again_message = zf_last_error();
        return;
      }
      run.params.push_back(mine.params);
      run.stats.push_back(engine.stats());
    }
  });
  EXPECT_EQ(group.timeouts(), 0) << "a rank was left waiting in a collective";
  EXPECT_EQ(group.mismatches(), 0);
  for (int r = 0; r < world; ++r) {
    const FailureLog& log = logs[static_cast<size_t>(r)];
    ASSERT_EQ(log.first_failed_step, bad_step) << "rank " << r << " accepted the step: " << log.first_message;
    if (r == 1) {
      EXPECT_EQ(log.first_status, ZF_ERROR_INVALID_TYPE) << log.first_message;
      EXPECT_NE(log.first_message.find("grads[0]"), std::string::npos) << log.first_message;
    } else {
      EXPECT_EQ(log.first_status, ZF_ERROR_INVALID_VALUE) << log.first_message;
      EXPECT_TRUE(names_rank_one(log.first_message)) << log.first_message;
    }
    for (size_t i = 0; i < model.params.size(); ++i)
      EXPECT_TRUE(log.params_after_failure[i].bitwise_equal(log.params_before_failure[i]))
          << "rank " << r << ": the refused step changed param " << i;
    EXPECT_EQ(log.again_status, logs[0].again_status) << "rank " << r << ": the ranks disagree on the retry";
  }
  // Bad input changes nothing, so the retried run is the run without the bad call.
  if (logs[0].again_status == ZF_SUCCESS) {
    const RankRun reference = run_single(model, config, stream, RunOptions{});
    expect_trajectories_match(runs, reference, "after a refused step");
  }
}

// ---- agreement on the call: every rank in the same one ----

// Runs body(rank) on every rank; an exception ends that rank (recorded in errors[rank]) and
// breaks the group, so the others fail their next collective instead of waiting.
void run_ranks_guarded(int world, InProcessGroup& group, std::vector<std::string>& errors,
                       const std::function<void(int)>& body) {
  errors.assign(static_cast<size_t>(world), "");
  run_ranks(world, [&](int r) {
    try {
      body(r);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
      group.abort(std::string("rank ") + std::to_string(r) + ": " + e.what());
    }
  });
}

// Each rank's gradients of step t, as the engine's descriptors (kept alive by `g`).
struct Stepper {
  const std::vector<StepGrads>& stream;
  int rank;
  std::vector<HostTensor> g;
  std::vector<zf_tensor> tensors(int64_t t) {
    g = stream[static_cast<size_t>(t - 1)].rank[static_cast<size_t>(rank)];
    return tensors_of(g);
  }
};

// A rank's host memory is its share: nothing is allocated before the first step, and then
// only this rank's columns (a whole-model allocation, resized down by set_collectives, kept
// its capacity and touched pages: N ranks on a node held N whole states).
TEST(EngineParallel, HostMemoryIsAllocatedAtFirstUseForThisRanksColumnsOnly) {
  const int world = 3;
  Model model;  // large enough that the state, not the per-rank records, is the memory
  model.groups = {zf_engine_group{1e-2, 0.0, 0}};
  for (int i = 0; i < 2; ++i) {
    HostTensor t(ZF_DTYPE_F32, {64, 301});
    for (int64_t e = 0; e < t.numel(); ++e) t.set(e, static_cast<float>((e * 37 + i) % 17) / 16.0f - 0.5f);
    model.params.push_back(std::move(t));
    model.param_groups.push_back(0);
  }
  const zf_engine_config config = parallel_config(TrajectoryCase{world, Dtypes::kF32, 0.1, 2, true, false, false});
  const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, 2);
  Model alone = model;
  zenflow::Engine single(alone.tensors(), alone.param_groups, alone.groups, config);
  EXPECT_EQ(zf::testing::host_memory_capacity(single.get()), 0u) << "allocated before the first step";
  std::vector<HostTensor> mean = stream[0].mean;
  single.step(tensors_of(mean), step_lrs(alone, 1));
  const size_t whole = zf::testing::host_memory_capacity(single.get());
  InProcessGroup group(world, 5.0);
  std::vector<size_t> before(world), after(world);
  std::vector<zf_engine_stats> stats(world);
  std::vector<std::string> errors;
  run_ranks_guarded(world, group, errors, [&](int r) {
    Model mine = model;
    zenflow::Engine engine(mine.tensors(), mine.param_groups, mine.groups, config);
    const zf_engine_collectives c = group.collectives(r);
    zenflow::check(zf_engine_set_collectives(engine.get(), &c));
    before[static_cast<size_t>(r)] = zf::testing::host_memory_capacity(engine.get());
    std::vector<HostTensor> g = stream[0].rank[static_cast<size_t>(r)];
    engine.step(tensors_of(g), step_lrs(mine, 1));
    after[static_cast<size_t>(r)] = zf::testing::host_memory_capacity(engine.get());
    stats[static_cast<size_t>(r)] = engine.stats();
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  size_t total = 0;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(before[static_cast<size_t>(r)], 0u) << "rank " << r << " allocated before its first step";
    EXPECT_GT(after[static_cast<size_t>(r)], 0u);
    // Within the share: at most a third of the whole plus the per-rank records and padding.
    EXPECT_LT(after[static_cast<size_t>(r)], whole / world + whole / 10) << "rank " << r;
    total += after[static_cast<size_t>(r)];
  }
  EXPECT_LT(total, whole + whole / 5) << "the ranks together hold about one model's host memory";
}

// Rank 0 flushes while rank 1 steps (as a setting changed on one rank only would make it
// rebuild its engine): both raise at once, nothing runs on either, and the run goes on as if
// the calls had not been made.
TEST(EngineParallel, RanksInDifferentCallsAllRaiseAndNothingRuns) {
  const int world = 2;
  const Model model = parallel_model(Dtypes::kMixed);
  const zf_engine_config config = parallel_config(TrajectoryCase{world, Dtypes::kMixed, 0.3, 2, true, true, false});
  const int64_t steps = 6, odd_step = 3;
  const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, steps);
  InProcessGroup group(world, 5.0);
  std::vector<FailureLog> logs(world);
  std::vector<RankRun> runs(world);
  std::vector<std::string> errors;
  run_ranks_guarded(world, group, errors, [&](int r) {
    FailureLog& log = logs[static_cast<size_t>(r)];
    Model mine = model;
    zenflow::Engine engine(mine.tensors(), mine.param_groups, mine.groups, config);
    const zf_engine_collectives c = group.collectives(r);
    zenflow::check(zf_engine_set_collectives(engine.get(), &c));
    Stepper stepper{stream, r, {}};
    for (int64_t t = 1; t <= steps; ++t) {
      const std::vector<double> lrs = step_lrs(mine, t);
      if (t == odd_step) {
        log.params_before_failure = mine.params;
        std::vector<zf_tensor> tensors = stepper.tensors(t);
        const zf_status status =
            r == 0 ? zf_engine_flush(engine.get())
                   : zf_engine_step(engine.get(), tensors.data(), tensors.size(), lrs.data(), lrs.size());
        log.first_status = status;
        log.first_message = status == ZF_SUCCESS ? "" : zf_last_error();
        log.params_after_failure = mine.params;
      }
      std::vector<zf_tensor> tensors = stepper.tensors(t);
      zenflow::check(zf_engine_step(engine.get(), tensors.data(), tensors.size(), lrs.data(), lrs.size()));
      runs[static_cast<size_t>(r)].params.push_back(mine.params);
    }
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  EXPECT_EQ(group.timeouts(), 0) << "a rank was left waiting in a collective";
  EXPECT_EQ(group.mismatches(), 0) << "the ranks ran different collectives";
  for (int r = 0; r < world; ++r) {
    const FailureLog& log = logs[static_cast<size_t>(r)];
    EXPECT_EQ(log.first_status, ZF_ERROR_INVALID_VALUE) << "rank " << r;
    EXPECT_NE(log.first_message.find("every rank must make the same engine calls"), std::string::npos)
        << log.first_message;
    EXPECT_NE(log.first_message.find(r == 0 ? "rank 1 in a step" : "rank 0 in a flush"), std::string::npos)
        << log.first_message;
    for (size_t i = 0; i < model.params.size(); ++i)
      EXPECT_TRUE(log.params_after_failure[i].bitwise_equal(log.params_before_failure[i])) << "rank " << r;
  }
  InProcessGroup clean(world, 5.0);
  const std::vector<RankRun> reference = run_parallel(model, config, clean, stream, RunOptions{});
  for (int r = 0; r < world; ++r)
    for (size_t s = 0; s < runs[0].params.size(); ++s)
      for (size_t i = 0; i < model.params.size(); ++i)
        EXPECT_TRUE(
            runs[static_cast<size_t>(r)].params[s][i].bitwise_equal(reference[static_cast<size_t>(r)].params[s][i]))
            << "rank " << r << ", step " << s + 1 << ", param " << i;
}

// A refusal in begin_step or submit on one rank waits for end_step's agreement, where every
// rank raises together: raised at once, it would leave the other ranks waiting there.
TEST(EngineParallel, ASplitStepRefusedOnOneRankFailsOnEveryRankInTheSameCall) {
  const int world = 3;
  const Model model = parallel_model(Dtypes::kMixed);
  zf_engine_config config = parallel_config(TrajectoryCase{world, Dtypes::kMixed, 0.3, 2, true, false, false});
  config.host_threads = 2;
  const int64_t steps = 10, bad_submit_step = 3, fault_step = 5;
  const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, steps);
  InProcessGroup group(world, 5.0);
  struct Log {
    std::vector<zf_status> begin, submit, end;  // per step
    std::vector<std::string> begin_message, end_message;
  };
  std::vector<Log> logs(world);
  std::vector<std::string> errors;
  run_ranks_guarded(world, group, errors, [&](int r) {
    Log& log = logs[static_cast<size_t>(r)];
    Model mine = model;
    zenflow::Engine engine(mine.tensors(), mine.param_groups, mine.groups, config);
    const zf_engine_collectives c = group.collectives(r);
    zenflow::check(zf_engine_set_collectives(engine.get(), &c));
    Stepper stepper{stream, r, {}};
    for (int64_t t = 1; t <= steps; ++t) {
      const std::vector<double> lrs = step_lrs(mine, t);
      if (r == 1 && t == fault_step) zf::testing::inject_host_lane_fault(engine.get(), "rank one's lane");
      std::vector<zf_tensor> tensors = stepper.tensors(t);
      HostTensor wrong(mine.params[0].dtype == ZF_DTYPE_F32 ? ZF_DTYPE_BF16 : ZF_DTYPE_F32, mine.params[0].shape);
      if (r == 1 && t == bad_submit_step) tensors[0] = wrong.tensor();
      log.begin.push_back(zf_engine_begin_step(engine.get(), lrs.data(), lrs.size()));
      log.begin_message.push_back(log.begin.back() == ZF_SUCCESS ? "" : zf_last_error());
      zf_status submitted = ZF_SUCCESS;
      for (size_t i = tensors.size(); i > 0 && submitted == ZF_SUCCESS; --i)  // backward order
        submitted = zf_engine_submit(engine.get(), i - 1, &tensors[i - 1], 1);
      log.submit.push_back(submitted);
      const zf_status ended = zf_engine_end_step(engine.get());
      log.end.push_back(ended);
      log.end_message.push_back(ended == ZF_SUCCESS ? "" : zf_last_error());
      if (ended != ZF_SUCCESS) zf_engine_abort_step(engine.get());
    }
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  EXPECT_EQ(group.timeouts(), 0) << "a rank was left waiting in a collective";
  EXPECT_EQ(group.mismatches(), 0);
  for (int r = 0; r < world; ++r) {
    const Log& log = logs[static_cast<size_t>(r)];
    ASSERT_EQ(log.end.size(), static_cast<size_t>(steps)) << "rank " << r;
    for (int64_t t = 1; t <= steps; ++t) {
      const size_t s = static_cast<size_t>(t - 1);
      // Every rank fails each step in the same call: begin_step (where the ranks agree before
      // their buckets' collectives start) or end_step (the folded agreement); submit never.
      EXPECT_EQ(log.begin[s] == ZF_SUCCESS, logs[0].begin[s] == ZF_SUCCESS) << "rank " << r << ", step " << t;
      EXPECT_EQ(log.end[s] == ZF_SUCCESS, logs[0].end[s] == ZF_SUCCESS) << "rank " << r << ", step " << t;
      EXPECT_EQ(log.submit[s], ZF_SUCCESS) << "rank " << r << " raised in submit at step " << t;
      if (log.begin[s] != ZF_SUCCESS) EXPECT_NE(log.end[s], ZF_SUCCESS) << "rank " << r << ", step " << t;
    }
    EXPECT_EQ(log.begin[bad_submit_step - 1], ZF_SUCCESS) << "rank " << r;
    EXPECT_NE(log.end[bad_submit_step - 1], ZF_SUCCESS) << "rank " << r;
    EXPECT_EQ(log.end[bad_submit_step], ZF_SUCCESS) << "rank " << r << ": the retry after the refusal";
    if (r == 1) {
      EXPECT_NE(log.end_message[bad_submit_step - 1].find("grads[0]"), std::string::npos)
          << log.end_message[bad_submit_step - 1];
    } else {
      EXPECT_TRUE(names_rank_one(log.end_message[bad_submit_step - 1])) << log.end_message[bad_submit_step - 1];
    }
    // The lane's fault (found within a few steps) fails begin_step everywhere from then on.
    EXPECT_NE(log.begin[steps - 1], ZF_SUCCESS) << "rank " << r << ": the lane's fault was never raised";
    size_t first_fault = static_cast<size_t>(fault_step - 1);
    while (first_fault < log.begin.size() && log.begin[first_fault] == ZF_SUCCESS) ++first_fault;
    ASSERT_LT(first_fault, log.begin.size());
    if (r == 1) {
      EXPECT_NE(log.begin_message[first_fault].find("rank one's lane"), std::string::npos)
          << log.begin_message[first_fault];
    } else {
      EXPECT_TRUE(names_rank_one(log.begin_message[first_fault])) << log.begin_message[first_fault];
    }
  }
}

// A state that one rank refuses is refused by every rank: no rank loads alone.
TEST(EngineParallel, AStateRefusedOnOneRankIsRefusedOnEveryRank) {
  const int world = 2;
  const Model model = parallel_model(Dtypes::kF32);
  const zf_engine_config config = parallel_config(TrajectoryCase{world, Dtypes::kF32, 0.3, 2, true, false, false});
  const int64_t steps = 4;
  const std::vector<StepGrads> stream = make_grad_stream(model, world, 1, steps);
  // A whole state (a single engine's over the mean gradients): any world size loads it.
  RunOptions save_options;
  save_options.save_at_end = true;
  const std::vector<StepGrads> first_two(stream.begin(), stream.begin() + 2);
  RankRun single = run_single(model, config, first_two, save_options);
  ASSERT_EQ(single.error, "");
  const zenflow::EngineState whole = single.saves[0];
  InProcessGroup group(world, 5.0);
  std::vector<FailureLog> logs(world);
  std::vector<zf_engine_stats> stats_before(world), stats_after(world);
  std::vector<std::string> errors;
  run_ranks_guarded(world, group, errors, [&](int r) {
    FailureLog& log = logs[static_cast<size_t>(r)];
    Model mine = model;
    zenflow::Engine engine(mine.tensors(), mine.param_groups, mine.groups, config);
    const zf_engine_collectives c = group.collectives(r);
    zenflow::check(zf_engine_set_collectives(engine.get(), &c));
    Stepper stepper{stream, r, {}};
    for (int64_t t = 1; t <= 3; ++t) engine.step(stepper.tensors(t), step_lrs(mine, t));
    zenflow::EngineState saved = whole;
    zenflow::EngineState bad = whole;
    if (r == 1) bad.counters[0] = -5;  // the schedule's step: refused by the checks
    log.params_before_failure = mine.params;
    stats_before[static_cast<size_t>(r)] = engine.stats();
    const std::vector<zf_tensor> buffers = bad.tensors();
    log.first_status =
        zf_engine_load_state(engine.get(), buffers.data(), buffers.size(), bad.counters.data(), bad.loss_scale);
    log.first_message = log.first_status == ZF_SUCCESS ? "" : zf_last_error();
    log.params_after_failure = mine.params;
    stats_after[static_cast<size_t>(r)] = engine.stats();
    engine.load_state(saved);  // every rank loads the whole state: accepted
    engine.step(stepper.tensors(3), step_lrs(mine, 3));
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  EXPECT_EQ(group.timeouts(), 0);
  EXPECT_EQ(group.mismatches(), 0);
  for (int r = 0; r < world; ++r) {
    const FailureLog& log = logs[static_cast<size_t>(r)];
    EXPECT_EQ(log.first_status, ZF_ERROR_INVALID_VALUE) << "rank " << r << " loaded alone";
    if (r == 0) EXPECT_TRUE(names_rank_one(log.first_message)) << log.first_message;
    for (size_t i = 0; i < model.params.size(); ++i)
      EXPECT_TRUE(log.params_after_failure[i].bitwise_equal(log.params_before_failure[i])) << "rank " << r;
    EXPECT_EQ(stats_after[static_cast<size_t>(r)].steps, stats_before[static_cast<size_t>(r)].steps) << "rank " << r;
  }
}

// ---- set_collectives ----

TEST(EngineParallel, SetCollectivesRejectsBadInputAndChangesNothing) {
  Model model = parallel_model(Dtypes::kF32);
  InProcessGroup group(2);
  const zf_engine_config config = parallel_config(TrajectoryCase{2, Dtypes::kF32, 0.3, 3, true, false, false});
  Model plain_model = parallel_model(Dtypes::kF32);
  zenflow::Engine plain(plain_model.tensors(), plain_model.param_groups, plain_model.groups, config);
  const size_t single_bytes = plain.device_memory_size();

  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, config);
  std::vector<zf_engine_collectives> bad;
  zf_engine_collectives c = group.collectives(0);
  c.rank = 2;  // out of range
  bad.push_back(c);
  c = group.collectives(0);
  c.rank = -1;
  bad.push_back(c);
  c = group.collectives(0);
  c.world_size = 0;
  bad.push_back(c);
  c.world_size = -3;
  c.rank = 0;
  bad.push_back(c);
  c = group.collectives(0);
  c.all_reduce_sum = nullptr;
  bad.push_back(c);
  c = group.collectives(0);
  c.reduce_scatter_sum = nullptr;
  bad.push_back(c);
  c = group.collectives(0);
  c.all_gather = nullptr;
  bad.push_back(c);
  for (size_t b = 0; b < bad.size(); ++b) {
    EXPECT_EQ(zf_engine_set_collectives(engine.get(), &bad[b]), ZF_ERROR_INVALID_VALUE) << "case " << b;
    EXPECT_NE(std::string(zf_last_error()), "") << "case " << b;
  }
  EXPECT_EQ(zf_engine_set_collectives(nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  // Nothing changed: still a single engine (same memory, no collective runs) that steps.
  EXPECT_EQ(engine.device_memory_size(), single_bytes);
  std::vector<StepGrads> stream = make_grad_stream(model, 1, 1, 2);
  std::vector<HostTensor> g = stream[0].mean;
  engine.step(tensors_of(g));
  EXPECT_EQ(group.counts(0).total_calls(), 0);
  EXPECT_EQ(engine.stats().collective_bytes_statistics, 0);
  // After the first step: refused, even when valid.
  const zf_engine_collectives good = group.collectives(0);
  EXPECT_EQ(zf_engine_set_collectives(engine.get(), &good), ZF_ERROR_INVALID_VALUE);
  g = stream[1].mean;
  engine.step(tensors_of(g));
  EXPECT_EQ(group.counts(0).total_calls(), 0);

  // A NULL last_error is allowed; set again to NULL, the engine is single again; a query of
  // the device memory does not fix it (the size follows the last set).
  Model other = parallel_model(Dtypes::kF32);
  zenflow::Engine second(other.tensors(), other.param_groups, other.groups, config);
  zf_engine_collectives no_errors = group.collectives(1);
  no_errors.last_error = nullptr;
  EXPECT_EQ(zf_engine_set_collectives(second.get(), &no_errors), ZF_SUCCESS) << zf_last_error();
  EXPECT_EQ(zf_engine_set_collectives(second.get(), nullptr), ZF_SUCCESS) << zf_last_error();
  EXPECT_EQ(second.device_memory_size(), single_bytes);
  EXPECT_EQ(zf_engine_set_collectives(second.get(), &no_errors), ZF_SUCCESS) << zf_last_error();
  EXPECT_GT(second.device_memory_size(), single_bytes);  // the reduction scratch and lists
  // After a load: refused.
  zenflow::EngineState state = engine.save_state();
  Model third_model = parallel_model(Dtypes::kF32);
  zenflow::Engine third(third_model.tensors(), third_model.param_groups, third_model.groups, config);
  third.load_state(state);
  EXPECT_EQ(zf_engine_set_collectives(third.get(), &good), ZF_ERROR_INVALID_VALUE);
}

}  // namespace
