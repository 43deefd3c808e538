// The engine's lane ordering, tested without a GPU: a simulated asynchronous backend
// (simulated_backend.hpp) runs each lane's work lazily, in a random interleaving of the
// lanes, and honours only the orderings the engine states with record / wait / host_wait, as
// CUDA streams and events do. A missing event in the state machine lets a copy read a slot
// before its pack, a scatter read the upload buffer before its copy, or the host lane
// overwrite U while it is still being copied up: the weights then differ from the host
// backend's. Every run must match the host backend bit for bit, whatever the interleaving.
#include <gtest/gtest.h>
#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/thread_pool.hpp"
#include "engine/host_backend.hpp"
#include "engine/testing.hpp"
#include "simulated_backend.hpp"
#include "test_engine_util.hpp"

namespace {

using zf_engine_test::HostTensor;
using zf_engine_test::make_grads;
using zf_engine_test::Model;
using zf_engine_test::standard_model;
using zf_engine_test::step_lrs;
using zf_engine_test::tensors_of;

using zf_sim::SimulatedAsyncBackend;
using zf_sim::SimulatedWorld;

struct RunOptions {
  bool simulated = false;
  uint64_t seed = 0;
  int eagerness = 30;
  bool slow_copies = false;
  bool fp32 = false;  // no fp32 master: the weights are read back where the host needs them
  bool overlap = true;
  bool split = false;
  // Readiness (zf_engine_mark_ready): every gradient marked ready first with other values
  // (runs submitted, buckets copied down), then again with the step's own, so that
  // end_step_with retakes the step whole.
  bool ready_retake = false;
  // release_gradients: every gradient marked ready in backward's order; each one the engine
  // reports released is poisoned at once (NaN: the caller reuses its memory) and given to
  // end_step_with as NULL. On the host backend, checks what each step held (the stats).
  bool release = false;
  bool fp16_overflow = false;
  int64_t update_interval = 3;
  int64_t update_lag = 1;  // the default: an overlapped result lands a step into the next window
  // false: every closing step accumulates as any other (the unfused passes, issue 29)
  bool fuse = true;
  bool clip = true;
  bool sync_every_step = true;  // false: the lanes run on across steps; only the end is kept
  int64_t save_at = 0;          // > 0: a save (discarded) after this step
  int64_t resume_at = 0;        // > 0: after this step, save, then a new engine loads it and goes on
  // Not empty: the parameters split into parts as on several devices (parts[i]: params[i]'s),
  // each part on its own backend (simulated ones share one world).
  std::vector<size_t> parts;
};

// An engine over `model` with its parameters in `parts` (host backends).
zenflow::Engine engine_in_parts(Model& model, const zf_engine_config& c, const std::vector<size_t>& parts) {
  return zenflow::Engine(
      zf::testing::create_engine_in_parts(model.tensors(), model.param_groups, model.groups, c, parts));
}

// The engine of a run: one engine, or one over parts, on host or simulated backends.
// `simulated` (when given): the backend of a simulated engine of one part.
zenflow::Engine make_engine(Model& model, const zf_engine_config& c, const RunOptions& o,
                            SimulatedAsyncBackend** simulated = nullptr) {
  if (o.parts.empty()) {
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
    if (o.simulated) {
      auto backend = std::make_unique<SimulatedAsyncBackend>(o.seed, o.eagerness, o.slow_copies);
      if (simulated != nullptr) *simulated = backend.get();
      zf::testing::use_backend(engine.get(), std::move(backend));
    }
    if (!o.fuse) zf::testing::set_fuse_window_close(engine.get(), false);
    return engine;
  }
  zenflow::Engine engine = engine_in_parts(model, c, o.parts);
  if (o.simulated) {
    auto world = std::make_shared<SimulatedWorld>();
    for (size_t d = 0; d < engine.device_count(); ++d)
      zf::testing::use_backend(
          engine.get(), std::make_unique<SimulatedAsyncBackend>(o.seed + 101 * d, o.eagerness, o.slow_copies, world),
          d);
  }
  if (!o.fuse) zf::testing::set_fuse_window_close(engine.get(), false);
  return engine;
}

// One step driven as a backward's hooks drive it with release_gradients: each gradient marked
// ready (last parameter first); after each, the released ones are taken (two at a time: the
// rest come with the next call) and poisoned, and go to end_step_with as NULL. On a
// simulated device the poison is written on the compute lane (stream-ordered, as memory
// freed to torch's caching allocator is reused): a read the engine enqueued after reporting
// the release would see it. With
// `check_held` (one engine on the host backend, where a release is reported at once): a step
// releases every matrix (and then held at most its largest bucket and the dense gradients at
// once) or none (a selection step: it held every gradient).
size_t release_step(zenflow::Engine& engine, const Model& model, std::vector<HostTensor>& grads,
                    const std::vector<double>& lrs, bool check_held, SimulatedAsyncBackend* simulated,
                    std::deque<std::vector<HostTensor>>& alive) {
  alive.push_back(grads);  // the poison, written from here on a simulated device
  std::vector<HostTensor>& poison = alive.back();
  for (HostTensor& p : poison)
    for (int64_t e = 0; e < p.numel(); ++e) p.set(e, NAN);
  std::vector<zf_tensor> g = tensors_of(grads);
  std::vector<zf_tensor> at_end = g;
  engine.begin_step(lrs);
  size_t released = 0;
  for (size_t i = g.size(); i-- > 0;) {
    EXPECT_EQ(zf_engine_mark_ready(engine.get(), i, &g[i]), ZF_SUCCESS) << zf_last_error();
    size_t taken[2], count = 0;
    do {
      EXPECT_EQ(zf_engine_take_released(engine.get(), taken, 2, &count), ZF_SUCCESS) << zf_last_error();
      for (size_t r = 0; r < count; ++r) {
        if (taken[r] >= g.size() || at_end[taken[r]].data == nullptr) {
          ADD_FAILURE() << "parameter " << taken[r] << " out of range or released twice";
          return released;
        }
        HostTensor& dead = grads[taken[r]];
        if (simulated != nullptr) {
          simulated->copy_device(dead.data(), poison[taken[r]].data(),
                                 static_cast<size_t>(dead.numel()) * zf_dtype_size(dead.dtype));
        } else {
          for (int64_t e = 0; e < dead.numel(); ++e) dead.set(e, NAN);
        }
        at_end[taken[r]].data = nullptr;
        ++released;
      }
    } while (count == 2);
  }
  EXPECT_EQ(zf_engine_end_step_with(engine.get(), at_end.data(), at_end.size()), ZF_SUCCESS) << zf_last_error();
  size_t count = 1;
  EXPECT_EQ(zf_engine_take_released(engine.get(), nullptr, 0, &count), ZF_SUCCESS);
  EXPECT_EQ(count, 0u);  // nothing outside a split step
  if (!check_held) return released;
  size_t matrices = 0;
  int64_t dense_bytes = 0, all_bytes = 0, largest_bucket = 0;
  for (const HostTensor& p : model.params) {
    const auto bytes = static_cast<int64_t>(p.numel() * zf_dtype_size(p.dtype));
    all_bytes += bytes;
    if (p.shape.size() >= 2 && &p != &model.params[5])
      ++matrices;  // parameter 5 is in the dense group
    else
      dense_bytes += bytes;
  }
  for (const zf::testing::BucketSpan& b : zf::testing::buckets(engine.get()))
    largest_bucket = std::max(largest_bucket, static_cast<int64_t>(b.max_bytes));
  const zf_engine_stats stats = engine.stats();
  if (released == 0) {
    EXPECT_EQ(stats.held_gradient_bytes_peak, all_bytes) << "a selection step holds every gradient";
  } else {
    EXPECT_EQ(released, matrices);
    EXPECT_LE(stats.held_gradient_bytes_peak, largest_bucket + dense_bytes);
  }
  return released;
}

// These tests' windows: 30% of the columns selected, strategy "step" (select_interval 0:
// one selection), the given window length, landing and overlap.
zf_engine_config window_config(int64_t update_interval, int64_t update_lag, bool overlap, int64_t select_interval) {
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  c.update_interval = update_interval;
  c.update_lag = update_lag;
  c.overlap_step = overlap ? 1 : 0;
  c.select_strategy = ZF_SELECT_STEP;
  c.select_interval = select_interval;
  return c;
}

// Parameters after every step (the backend synchronised), then the whole saved state.
std::vector<std::vector<HostTensor>> trajectory(const RunOptions& o) {
  Model model = standard_model(o.fp16_overflow ? ZF_DTYPE_F16 : (o.fp32 ? ZF_DTYPE_F32 : ZF_DTYPE_BF16), 11);
  zf_engine_config c = window_config(o.update_interval, o.update_lag, o.overlap, 4);
  c.max_grad_norm = o.clip ? 5.0 : 0.0;
  c.bucket_bytes = 100;  // several buckets through a ring of two slots
  c.staging_slots = 2;
  if (o.fp16_overflow) {
    c.loss_scaling = ZF_LOSS_SCALING_DYNAMIC;
    c.initial_scale = 8.0;
    c.growth_interval = 3;
  }
  c.release_gradients = o.release ? 1 : 0;
  SimulatedAsyncBackend* simulated = nullptr;
  zenflow::Engine engine = make_engine(model, c, o, &simulated);
  std::vector<std::vector<HostTensor>> out;
  std::deque<std::vector<HostTensor>> alive;  // gradients stay valid (and in place) while queued work may read them
  int64_t steps_released = 0;
  for (int64_t t = 1; t <= 13; ++t) {
    alive.push_back(make_grads(model, t, true, 3));
    std::vector<HostTensor>& grads = alive.back();
    if (o.fp16_overflow) {
      const double scale = engine.loss_scale();
      for (auto& g : grads)
        for (int64_t e = 0; e < g.numel(); ++e) g.set(e, static_cast<float>(g.get(e) * scale));
      if (t == 5) grads[1].set(3, INFINITY);
    }
    std::vector<zf_tensor> g = tensors_of(grads);
    if (o.ready_retake) {
      alive.push_back(make_grads(model, t + 100, true, 3));
      std::vector<zf_tensor> first = tensors_of(alive.back());
      engine.begin_step(step_lrs(model, t));
      for (size_t i = g.size(); i-- > 0;) EXPECT_EQ(zf_engine_mark_ready(engine.get(), i, &first[i]), ZF_SUCCESS);
      for (size_t i = g.size(); i-- > 0;) EXPECT_EQ(zf_engine_mark_ready(engine.get(), i, &g[i]), ZF_SUCCESS);
      EXPECT_EQ(zf_engine_end_step_with(engine.get(), g.data(), g.size()), ZF_SUCCESS) << zf_last_error();
    } else if (o.release) {
      const size_t released =
          release_step(engine, model, grads, step_lrs(model, t), !o.simulated && o.parts.empty(), simulated, alive);
      steps_released += released > 0 ? 1 : 0;
    } else if (o.split) {
      // a backward that failed half way first: some gradients submitted (buckets packed and
      // copied down at submit), then the step discarded
      alive.push_back(make_grads(model, t + 100, true, 3));
      std::vector<zf_tensor> failed = tensors_of(alive.back());
      engine.begin_step(step_lrs(model, t + 100));
      engine.submit(2, std::vector<zf_tensor>(failed.begin() + 2, failed.end()));
      engine.abort_step();
      engine.begin_step(step_lrs(model, t));
      const std::vector<size_t> cuts = {0, 2, 3, g.size()};
      for (size_t part = cuts.size() - 1; part > 0; --part)
        engine.submit(cuts[part - 1], std::vector<zf_tensor>(g.begin() + cuts[part - 1], g.begin() + cuts[part]));
      engine.end_step();
    } else {
      engine.step(g, step_lrs(model, t));
    }
    if (t == o.save_at) (void)engine.save_state();  // a checkpoint must not change the run
    if (t == o.resume_at) {
      zenflow::EngineState state = engine.save_state();
      zf::testing::synchronize_backend(engine.get());
      const std::vector<HostTensor> params = model.params;  // the parameters saved beside it
      engine.reset();                                       // the process ends
      for (HostTensor& p : model.params)                    // a new process: other values
        for (int64_t e = 0; e < p.numel(); ++e) p.set(e, 7.0f);
      engine = make_engine(model, c, o, &simulated);
      engine.load_state(state);
      model.params = params;  // restored after the optimizer (Trainer's order)
    }
    if (!o.sync_every_step) continue;
    zf::testing::synchronize_backend(engine.get());
    out.push_back(model.params);
  }
  // Releasing on the host backend: every step but the selection steps (1, 5 and 9; 10 of 13
  // steps release, 11 with fp16, whose overflow step moves the schedule).
  if (o.release && !o.simulated && o.parts.empty()) EXPECT_GE(steps_released, 9);
  engine.flush();
  zf::testing::synchronize_backend(engine.get());
  out.push_back(model.params);
  zenflow::EngineState state = engine.save_state();
  std::vector<HostTensor> saved;
  for (size_t e = 0; e < state.layout.size(); ++e) {
    HostTensor t(ZF_DTYPE_F32, {static_cast<int64_t>((state.layout[e].bytes + 3) / 4)});
    std::memcpy(t.f32.data(), state.data(e), state.layout[e].bytes);
    saved.push_back(std::move(t));
  }
  out.push_back(std::move(saved));
  return out;
}

void expect_same(const std::vector<std::vector<HostTensor>>& a, const std::vector<std::vector<HostTensor>>& b,
                 const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size()) << what;
    for (size_t i = 0; i < a[s].size(); ++i)
      ASSERT_TRUE(a[s][i].bitwise_equal(b[s][i])) << what << ": step " << s + 1 << ", tensor " << i;
  }
}

class EngineLaneOrdering : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(EngineLaneOrdering, AnyInterleavingMatchesTheHostBackendBitForBit) {
  RunOptions o;
  std::tie(o.overlap, o.split, o.fp16_overflow) = GetParam();
  const auto reference = trajectory(o);
  o.simulated = true;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    for (int eagerness : {0, 30, 100}) {
      o.seed = seed;
      o.eagerness = eagerness;
      o.slow_copies = seed % 2 == 0;
      const auto simulated = trajectory(o);
      expect_same(reference, simulated, "simulated asynchronous backend");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OverlapSplitOverflow, EngineLaneOrdering,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool()));

// Issue 29: a window's closing step packed into U and added to A inside the update (the fused
// passes) gives the bits of the unfused ones (its accumulate, then the update reading A back),
// on the host backend and on a simulated device in any interleaving: overlapped (landing a
// step in, or at the next close, where the closing step takes the second upload copy while
// the first still holds the last result) or not, windows of 1, 2 and 3 steps and the
// adaptive rule, split steps (one discarded half way), an fp16 overflow, released gradients,
// a readiness retake and a resume mid-window.
class EngineFusedWindowClose : public ::testing::TestWithParam<std::tuple<bool, int64_t, int64_t>> {};

TEST_P(EngineFusedWindowClose, FusingTheClosingStepChangesNoBit) {
  RunOptions o;
  std::tie(o.overlap, o.update_interval, o.update_lag) = GetParam();
  for (int variant = 0; variant < 5; ++variant) {
    RunOptions v = o;
    v.split = variant == 1;
    v.fp16_overflow = variant == 2;
    v.release = variant == 3;
    v.ready_retake = variant == 4;
    v.fuse = false;
    const auto unfused = trajectory(v);
    v.fuse = true;
    expect_same(unfused, trajectory(v), "fused, host backend");
    v.resume_at = 5;
    expect_same(unfused, trajectory(v), "fused, resumed after step 5");
    v.resume_at = 0;
    // The lanes running on across steps (no synchronisation but the end's): a closing step's
    // copy down into U must wait for the last result's copies up out of it.
    RunOptions running = v;
    running.sync_every_step = false;
    running.fuse = false;
    const auto unfused_running = trajectory(running);
    running.fuse = true;
    v.simulated = running.simulated = true;
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      v.seed = running.seed = seed;
      v.eagerness = running.eagerness = seed == 1 ? 0 : (seed == 2 ? 100 : 30);
      v.slow_copies = running.slow_copies = seed != 2;
      expect_same(unfused, trajectory(v), "fused, simulated device");
      expect_same(unfused_running, trajectory(running), "fused, simulated device running on");
    }
    if (HasFatalFailure()) {
      ADD_FAILURE() << "variant " << variant;
      return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OverlapIntervalLag, EngineFusedWindowClose,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(int64_t{1}, int64_t{2}, int64_t{3}, int64_t{0}),
                                            ::testing::Values(int64_t{0}, int64_t{1})));

// Every closing step is fused, with the upload copies the schedule needs: the host lane's
// bytes, per deferred element and window, are those of the fused passes ((g + 8) S + 16 + w)
// with the defaults (windows of 3 landing a step in: one copy), overlap off (one copy),
// overlapped windows of one step and a landing at the next close (two copies: the closing
// step finds the last result still owed in one), and those of the unfused passes
// ((g + 8) S + 24 + w) with fusing turned off. Four windows are counted, after a flush. The
// second copy is the weights' bytes of every matrix, in host_state_bytes.
TEST(EngineFusedWindowClose, EveryClosingStepIsFusedWithTheUploadCopiesItNeeds) {
  struct Case {
    bool overlap;
    int64_t interval, lag;
    bool fuse;
    int64_t fused_windows;
    int copies;
  };
  const Case cases[] = {{true, 3, 1, true, 4, 1},  {false, 3, 1, true, 4, 1}, {false, 1, 1, true, 4, 1},
                        {true, 1, 1, true, 4, 2},  {true, 3, 0, true, 4, 2},  {true, 3, 1, false, 0, 1},
                        {false, 2, 0, true, 4, 1}, {true, 2, 2, true, 4, 2}};
  int64_t one_copy_bytes = -1, matrix_bytes = 0;
  for (const Case& k : cases) {
    Model model = standard_model(ZF_DTYPE_BF16, 11);
    // one selection: every window has the same deferred columns
    const zf_engine_config c = window_config(k.interval, k.lag, k.overlap, 0);
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
    if (!k.fuse) zf::testing::set_fuse_window_close(engine.get(), false);
    const int64_t windows = 4;
    zf_engine_stats before{};
    for (int64_t t = 1; t <= (windows + 1) * k.interval; ++t) {
      std::vector<HostTensor> grads = make_grads(model, t, true, 3);
      engine.step(tensors_of(grads), step_lrs(model, t));
      if (t == k.interval) {  // after the first window (its selection)
        engine.flush();
        before = engine.stats();
      }
    }
    engine.flush();
    const zf_engine_stats after = engine.stats();
    int64_t deferred = 0, columns = 0;
    matrix_bytes = 0;
    for (size_t i = 0; i < model.params.size(); ++i) {
      if (!model.matrix(i)) continue;
      matrix_bytes += 2 * model.params[i].numel();
      const int64_t cols = model.params[i].cols(), rows = model.params[i].numel() / cols;
      const int64_t k_cols = std::max<int64_t>(1, static_cast<int64_t>(0.3 * static_cast<double>(cols)));
      deferred += rows * (cols - k_cols);
      columns += cols - k_cols;
    }
    const int64_t moved = after.host_lane_bytes_read + after.host_lane_bytes_written - before.host_lane_bytes_read -
                          before.host_lane_bytes_written - 8 * columns * windows;
    const int64_t unfused = (2 + 8) * k.interval + 24 + 2;  // bf16 gradients and weights
    EXPECT_EQ(moved, (unfused * windows - 8 * k.fused_windows) * deferred)
        << "overlap " << k.overlap << " interval " << k.interval << " lag " << k.lag << " fuse " << k.fuse;
    if (one_copy_bytes < 0) one_copy_bytes = after.host_state_bytes;  // the first case has one copy
    EXPECT_EQ(after.host_state_bytes, one_copy_bytes + (k.copies - 1) * matrix_bytes)
        << "overlap " << k.overlap << " interval " << k.interval << " lag " << k.lag;
  }
}

TEST(EngineLaneOrdering, AStepRetakenByReadinessMatchesThePlainStepInAnyInterleaving) {
  RunOptions o;
  const auto reference = trajectory(o);
  o.ready_retake = true;
  expect_same(reference, trajectory(o), "retaken, host backend");
  o.simulated = true;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    for (int eagerness : {0, 100}) {
      o.seed = seed;
      o.eagerness = eagerness;
      o.slow_copies = seed % 2 == 0;
      expect_same(reference, trajectory(o), "retaken, simulated asynchronous backend");
    }
  }
  o.parts = {0, 1, 0, 1, 0, 1};
  o.simulated = false;
  RunOptions plain_parts;
  plain_parts.parts = o.parts;
  expect_same(trajectory(plain_parts), trajectory(o), "retaken, 2 parts");
}

// Gradient release: the engine never reads a gradient after reporting it released (each is
// poisoned then), and the run equals plain steps bit for bit: overlap on and off, fixed and
// auto windows, fp32, bf16 and fp16 with an overflow step, clipping, re-selections; on the
// host backend, the simulated asynchronous one and two parts (as on two devices).
class EngineReleaseGradients : public ::testing::TestWithParam<std::tuple<bool, int, int64_t>> {};

TEST_P(EngineReleaseGradients, ReleasedGradientsAreNeverReadAndTheRunIsUnchanged) {
  RunOptions o;
  int dtype = 0;
  std::tie(o.overlap, dtype, o.update_interval) = GetParam();
  o.fp32 = dtype == 1;
  o.fp16_overflow = dtype == 2;
  const auto reference = trajectory(o);
  o.release = true;
  expect_same(reference, trajectory(o), "released, host backend");
  o.simulated = true;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    o.seed = seed;
    o.eagerness = seed == 1 ? 0 : 60;
    o.slow_copies = seed == 2;
    expect_same(reference, trajectory(o), "released, simulated asynchronous backend");
  }
  o.simulated = false;
  o.parts = {0, 1, 0, 1, 0, 1};
  RunOptions plain_parts = o;
  plain_parts.release = false;
  expect_same(trajectory(plain_parts), trajectory(o), "released, 2 parts");
}

INSTANTIATE_TEST_SUITE_P(OverlapDtypeWindow, EngineReleaseGradients,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1, 2),
                                            ::testing::Values(int64_t{3}, int64_t{0})));

TEST(EngineReleaseGradients, AGradientArrivingAgainAfterItsSubmitIsRefusedAndChangesNothing) {
  Model model = standard_model(ZF_DTYPE_BF16, 11);
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  c.release_gradients = 1;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  std::vector<HostTensor> first = make_grads(model, 1, true, 3);
  engine.step(tensors_of(first), step_lrs(model, 1));
  zenflow::EngineState before = engine.save_state();
  const std::vector<HostTensor> params = model.params;
  std::vector<HostTensor> grads = make_grads(model, 2, true, 3);
  std::vector<zf_tensor> g = tensors_of(grads);
  engine.begin_step(step_lrs(model, 2));
  for (size_t i = g.size(); i-- > 0;) ASSERT_EQ(zf_engine_mark_ready(engine.get(), i, &g[i]), ZF_SUCCESS);
  ASSERT_EQ(zf_engine_mark_ready(engine.get(), 0, &g[0]), ZF_SUCCESS);  // reentrant checkpointing
  EXPECT_EQ(zf_engine_end_step_with(engine.get(), g.data(), g.size()), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("grads[0]: its gradient arrived again"), std::string::npos)
      << zf_last_error();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].bitwise_equal(model.params[i])) << i;
  zenflow::EngineState after = engine.save_state();
  ASSERT_EQ(before.layout.size(), after.layout.size());
  for (size_t e = 0; e < before.layout.size(); ++e)
    EXPECT_EQ(std::memcmp(before.data(e), after.data(e), before.layout[e].bytes), 0) << "state entry " << e;
  size_t count = 0;
  EXPECT_EQ(zf_engine_take_released(engine.get(), nullptr, 1, &count), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_engine_take_released(engine.get(), nullptr, 0, nullptr), ZF_ERROR_INVALID_VALUE);
  engine.step(g, step_lrs(model, 2));  // the engine goes on
}

TEST(EngineLaneOrdering, Fp32WeightsAreTheirOwnMasterInAnyInterleaving) {
  // Re-selections move leaving columns' weights to the host, and the checkpoint reads the
  // weights: both through copies from the device.
  RunOptions o;
  o.fp32 = true;
  const auto reference = trajectory(o);
  o.simulated = true;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    o.seed = seed;
    o.eagerness = seed == 1 ? 0 : 40;
    o.slow_copies = seed != 3;
    expect_same(reference, trajectory(o), "fp32 model, simulated asynchronous backend");
  }
}

// A checkpoint does not change the run, and a resume from it is the uninterrupted run, bit
// for bit: at every position inside a window (windows of 3, 13 steps, re-selections every 4),
// overlap on and off, whole and split steps, an fp16 overflow step, clipping, fixed and auto
// windows; on the host backend and on the simulated asynchronous one.
class EngineCheckpointMidWindow : public ::testing::TestWithParam<std::tuple<bool, bool, bool, int64_t>> {};

TEST_P(EngineCheckpointMidWindow, SavingChangesNothingAndResumingIsTheUninterruptedRun) {
  RunOptions o;
  std::tie(o.overlap, o.split, o.fp16_overflow, o.update_interval) = GetParam();
  const auto reference = trajectory(o);
  for (const bool simulated : {false, true}) {
    o.simulated = simulated;
    o.seed = 5;
    o.eagerness = 30;
    for (int64_t at = 1; at <= 12; ++at) {
      o.save_at = at;
      o.resume_at = 0;
      expect_same(reference, trajectory(o), simulated ? "saved, simulated device" : "saved");
      o.save_at = 0;
      o.resume_at = at;
      expect_same(reference, trajectory(o), simulated ? "resumed, simulated device" : "resumed");
      if (HasFatalFailure()) {
        ADD_FAILURE() << "at step " << at;
        return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OverlapSplitOverflowInterval, EngineCheckpointMidWindow,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(int64_t{3}, int64_t{0})));

TEST(EngineLaneOrdering, WarmUpAndIntervalOneEveryStepThroughTheRing) {
  RunOptions o;
  o.update_interval = 1;
  o.overlap = false;
  const auto reference = trajectory(o);
  o.simulated = true;
  o.seed = 7;
  o.eagerness = 0;
  expect_same(reference, trajectory(o), "synchronous offload, lazy device");
}

// A non-finite gradient without loss scaling, on a backend whose scalars are not visible
// to the host: the step writes nothing, and a later call raises a sticky error.
TEST(EngineLaneOrdering, NonFiniteGradientIsFoundAfterItsStepAndSticks) {
  Model model = standard_model(ZF_DTYPE_F32, 3);
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  zf::testing::use_backend(engine.get(), std::make_unique<SimulatedAsyncBackend>(3, 0));
  std::vector<std::vector<HostTensor>> alive;
  alive.push_back(make_grads(model, 1));
  engine.step(tensors_of(alive.back()));
  zf::testing::synchronize_backend(engine.get());
  const std::vector<HostTensor> before = model.params;
  alive.push_back(make_grads(model, 2));
  alive.back()[0].set(2, NAN);
  engine.step(tensors_of(alive.back()));  // returns: the device has not looked yet
  zf::testing::synchronize_backend(engine.get());
  for (size_t i = 0; i < model.params.size(); ++i)
    EXPECT_TRUE(model.params[i].bitwise_equal(before[i])) << "the non-finite step wrote param " << i;
  alive.push_back(make_grads(model, 3));
  try {
    engine.step(tensors_of(alive.back()));
    FAIL() << "the next step did not raise";
  } catch (const zenflow::Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite gradient"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine.step(tensors_of(alive.back())), zenflow::Error);  // sticky
}

// ---- an engine over several devices (engine_group.hpp), on CPU parts ----

// Parts of the standard model's six parameters: two devices, interleaved, so every split
// range and bucket crosses devices; three devices.
const std::vector<size_t> kTwoDevices = {0, 1, 0, 1, 1, 0};
const std::vector<size_t> kThreeDevices = {1, 0, 2, 1, 0, 2};
// The dense matrix alone on the first device, which then has no host work at all.
const std::vector<size_t> kDenseAlone = {1, 1, 1, 1, 1, 0};

class EngineDevices : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(EngineDevices, PartsOnSeveralDevicesMatchOneEngineBitForBit) {
  // Without clipping the step's norm only reports: every update is one engine's, bit for bit,
  // over the whole trajectory and the saved state (in the caller's parameter order). The
  // auto interval's counts are summed over the devices, so its windows are one engine's.
  RunOptions o;
  std::tie(o.overlap, o.split, o.fp16_overflow) = GetParam();
  o.clip = false;
  for (int64_t interval : {int64_t{3}, int64_t{0}}) {
    o.update_interval = interval;
    o.parts.clear();
    const auto one = trajectory(o);
    for (const auto& parts : {kTwoDevices, kThreeDevices, kDenseAlone}) {
      o.parts = parts;
      expect_same(one, trajectory(o), interval == 0 ? "parts, auto interval" : "parts, interval 3");
    }
  }
}

// The synchronous start's detection over parts on several devices: the devices' moment sums
// are added in device order before the one decision, so the parts decide and step as one
// engine, whether the gradients read as noise (the start ends after the probe) or as
// consistent (it runs to auto_warm_up_rounds).
TEST(EngineDevicesStart, PartsDecideTheStartAsOneEngine) {
  for (const bool consistent : {false, true}) {
    zf_engine_config c = zf_engine_test::test_config();
    c.auto_warm_up_rounds = 12;
    c.update_interval = 3;
    std::vector<std::vector<double>> finals[2];
    int64_t starts[2] = {0, 0};
    for (int split = 0; split < 2; ++split) {
      Model model = standard_model();
      zenflow::Engine engine = split ? engine_in_parts(model, c, kTwoDevices)
                                     : zenflow::Engine(model.tensors(), model.param_groups, model.groups, c);
      for (int64_t t = 1; t <= 18; ++t) {
        std::vector<HostTensor> grads = make_grads(model, consistent ? 1 : t);
        engine.step(tensors_of(grads), step_lrs(model, t));
      }
      engine.flush();
      starts[split] = engine.stats().synchronous_start_steps;
      for (const HostTensor& p : model.params) finals[split].push_back(p.values());
    }
    EXPECT_EQ(starts[0], consistent ? 12 : 8);
    EXPECT_EQ(starts[1], starts[0]);
    EXPECT_EQ(finals[0], finals[1]) << (consistent ? "consistent" : "noise");
  }
}

TEST_P(EngineDevices, AnyInterleavingOfEveryDeviceMatchesHostParts) {
  // Each device's lanes run lazily and in random orders, and one device's copy of another's
  // partial waits only for the events the engine records: a missing one changes the bits.
  RunOptions o;
  std::tie(o.overlap, o.split, o.fp16_overflow) = GetParam();
  o.parts = kTwoDevices;
  const auto host = trajectory(o);
  o.simulated = true;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    for (int eagerness : {0, 40}) {
      o.seed = seed;
      o.eagerness = eagerness;
      o.slow_copies = seed == 2;
      expect_same(host, trajectory(o), "parts on simulated asynchronous devices");
    }
  }
}

TEST_P(EngineDevices, DevicesRunOnAcrossStepsWithoutReadingAStaleOrFuturePartial) {
  // Nothing synchronises between steps: a device may still have to copy step t's partial of
  // another device when that device forms step t+1's. The partial is rewritten only after
  // every device read it (partials_read_), so the bits are those of the host parts.
  RunOptions o;
  std::tie(o.overlap, o.split, o.fp16_overflow) = GetParam();
  o.parts = kThreeDevices;
  o.sync_every_step = false;
  const auto host = trajectory(o);
  o.simulated = true;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    o.seed = seed;
    o.eagerness = seed % 2 == 0 ? 0 : 20;
    o.slow_copies = seed > 2;
    expect_same(host, trajectory(o), "parts on simulated devices, no synchronisation between steps");
  }
}

INSTANTIATE_TEST_SUITE_P(OverlapSplitOverflow, EngineDevices,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool()));

TEST(EngineDevices, ClippingUsesTheNormOverEveryDevice) {
  // With clipping the devices' sums are added in another order than one engine's, so the
  // clip coefficient may differ in its last bit: the weights agree to float rounding.
  RunOptions o;
  const auto one = trajectory(o);
  o.parts = kThreeDevices;
  const auto parts = trajectory(o);
  ASSERT_EQ(one.size(), parts.size());
  for (size_t s = 0; s + 1 < one.size(); ++s) {
    for (size_t i = 0; i < one[s].size(); ++i)
      for (int64_t e = 0; e < one[s][i].numel(); ++e)
        ASSERT_NEAR(one[s][i].get(e), parts[s][i].get(e), 1e-5 * (1.0 + std::fabs(one[s][i].get(e))))
            << "step " << s + 1 << ", param " << i << ", element " << e;
  }
  // And the norm is the global one: the devices' norms alone would be smaller.
  Model model = standard_model(ZF_DTYPE_F32, 5);
  zf_engine_config c = zf_engine_test::test_config();
  c.max_grad_norm = 1e9;
  zenflow::Engine whole(model.tensors(), model.param_groups, model.groups, c);
  Model copy = model;
  zenflow::Engine split = engine_in_parts(copy, c, kTwoDevices);
  std::vector<HostTensor> grads = make_grads(model, 1);
  whole.step(tensors_of(grads));
  split.step(tensors_of(grads));
  EXPECT_NEAR(split.stats().last_global_norm, whole.stats().last_global_norm, 1e-6 * whole.stats().last_global_norm);
}

TEST(EngineDevices, BadInputOnOneDeviceChangesNothingOnAny) {
  Model model = standard_model(ZF_DTYPE_BF16, 9);
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  c.update_interval = 2;
  zenflow::Engine engine = engine_in_parts(model, c, kTwoDevices);
  std::vector<std::vector<HostTensor>> alive;
  alive.push_back(make_grads(model, 1, true));
  engine.step(tensors_of(alive.back()));
  const std::vector<HostTensor> before = model.params;
  const zf_engine_stats stats_before = engine.stats();
  auto expect_unchanged = [&](const char* what) {
    for (size_t i = 0; i < model.params.size(); ++i)
      EXPECT_TRUE(model.params[i].bitwise_equal(before[i])) << what << ": param " << i << " changed";
    EXPECT_EQ(engine.stats().steps, stats_before.steps) << what;
    EXPECT_EQ(engine.stats().bytes_down, stats_before.bytes_down) << what;
  };
  auto expect_error = [&](const std::function<void()>& call, const std::string& needle, const char* what,
                          zf_status status = ZF_ERROR_INVALID_VALUE) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const zenflow::Error& e) {
      EXPECT_EQ(e.status(), status) << what;
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
    expect_unchanged(what);
  };
  // Parameter 4 is on the second device: its errors name it by the caller's index.
  alive.push_back(make_grads(model, 2, true));
  std::vector<zf_tensor> wrong = tensors_of(alive.back());
  wrong[4].dtype = ZF_DTYPE_F32;
  expect_error([&] { engine.step(wrong); }, "grads[4]", "a wrong dtype on the second device", ZF_ERROR_INVALID_TYPE);
  alive.push_back(make_grads(model, 2, true));
  alive.back()[4].set(5, NAN);
  expect_error([&] { engine.step(tensors_of(alive.back())); }, "grads[4]: non-finite", "a NaN on the second device");
  alive.push_back(make_grads(model, 2, true));
  alive.back()[3].set(0, INFINITY);
  expect_error([&] { engine.step(tensors_of(alive.back())); }, "grads[3]: non-finite", "an Inf in a bias");
  // The split form: a bad gradient in a range over both devices is refused whole.
  alive.push_back(make_grads(model, 2, true));
  std::vector<zf_tensor> good = tensors_of(alive.back());
  std::vector<zf_tensor> range(good.begin() + 2, good.begin() + 5);
  range[2].shape[0] += 1;
  engine.begin_step();
  expect_error([&] { engine.submit(2, range); }, "grads[4]", "a wrong shape in a submitted range");
  expect_error([&] { engine.end_step(); }, "parameter 0 was not submitted", "an incomplete split step");
  engine.submit(0, good);
  engine.end_step();  // the whole step goes through after the refusals
  EXPECT_EQ(engine.stats().steps, stats_before.steps + 1);
  // Out-of-range devices and the single-device calls are refused.
  zf_device device{};
  size_t bytes = 0;
  EXPECT_EQ(zf_engine_device_at(engine.get(), 2, &device, &bytes), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_engine_device_memory_size(engine.get(), &bytes), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("zf_engine_device_count"), std::string::npos) << zf_last_error();
  EXPECT_EQ(zf_engine_set_stream(engine.get(), nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_engine_set_stream_at(engine.get(), 1, nullptr), ZF_SUCCESS);
  zf_engine_collectives collectives{};
  collectives.world_size = 2;
  EXPECT_EQ(zf_engine_set_collectives(engine.get(), &collectives), ZF_ERROR_NOT_SUPPORTED);
}

class EngineDevicesStats : public ::testing::TestWithParam<std::vector<size_t>> {};

TEST_P(EngineDevicesStats, DevicesMemoryStatsAndThreads) {
  const std::vector<size_t>& parts = GetParam();
  const size_t devices = *std::max_element(parts.begin(), parts.end()) + 1;
  Model model = standard_model(ZF_DTYPE_BF16, 4);
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  c.select_strategy = ZF_SELECT_STEP;
  c.select_interval = 3;
  zenflow::Engine whole(model.tensors(), model.param_groups, model.groups, c);
  Model copy = model;
  zenflow::Engine split = engine_in_parts(copy, c, parts);
  ASSERT_EQ(whole.device_count(), 1u);
  ASSERT_EQ(split.device_count(), devices);
  EXPECT_EQ(whole.device_at(0).second, whole.device_memory_size());
  size_t split_bytes = 0;
  for (size_t d = 0; d < devices; ++d) {
    EXPECT_GT(split.device_at(d).second, 0u);
    split_bytes += split.device_at(d).second;
  }
  for (int64_t t = 1; t <= 9; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t, true);
    whole.step(tensors_of(grads));
    split.step(tensors_of(grads));
  }
  whole.flush();
  split.flush();
  const zf_engine_stats a = whole.stats(), b = split.stats();
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_GT(a.windows, 0);
  EXPECT_EQ(a.windows, b.windows);
  EXPECT_GT(a.reselections, 0);
  EXPECT_EQ(a.reselections, b.reselections);
  EXPECT_NEAR(a.last_global_norm, b.last_global_norm, 1e-6 * a.last_global_norm);  // summed in another order
  EXPECT_EQ(a.bytes_down, b.bytes_down);
  EXPECT_EQ(a.bytes_up, b.bytes_up);
  EXPECT_EQ(a.selected_fraction, b.selected_fraction);
  EXPECT_EQ(a.device_state_bytes, b.device_state_bytes);  // the same state, spread over the devices
  EXPECT_EQ(static_cast<size_t>(b.device_bytes), split_bytes);
  // The automatic host threads are shared out between the devices' host lanes.
  zf_engine_config automatic = zf_engine_config_default();
  automatic.host_threads = 0;
  zenflow::Engine shared = engine_in_parts(copy, automatic, kTwoDevices);
  zenflow::Engine alone(copy.tensors(), copy.param_groups, copy.groups, automatic);
  const int total = zf::testing::host_lane_threads(alone.get());
  for (size_t d = 0; d < 2; ++d) EXPECT_EQ(zf::testing::host_lane_threads(shared.get(), d), std::max(1, total / 2));
}

INSTANTIATE_TEST_SUITE_P(Parts, EngineDevicesStats, ::testing::Values(kThreeDevices, kDenseAlone));

TEST(EngineDevices, CheckpointsMoveBetweenOneEngineAndSeveralDevices) {
  Model model = standard_model(ZF_DTYPE_BF16, 6);
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  c.update_interval = 3;
  c.select_strategy = ZF_SELECT_STEP;
  c.select_interval = 4;
  zenflow::Engine split = engine_in_parts(model, c, kTwoDevices);
  std::vector<std::vector<HostTensor>> alive;
  for (int64_t t = 1; t <= 5; ++t) {
    alive.push_back(make_grads(model, t, true, 2));
    split.step(tensors_of(alive.back()), step_lrs(model, t));
  }
  zenflow::EngineState state = split.save_state();
  // One engine over a copy of the model loads the state of the two devices, and the other
  // way round; both then follow the same trajectory.
  Model copy = model;
  zenflow::Engine whole(copy.tensors(), copy.param_groups, copy.groups, c);
  whole.load_state(state);
  zenflow::EngineState whole_state = whole.save_state();
  ASSERT_EQ(whole_state.layout.size(), state.layout.size());
  for (size_t e = 0; e < state.layout.size(); ++e) {
    EXPECT_EQ(whole_state.layout[e].param, state.layout[e].param) << "entry " << e;
    EXPECT_EQ(whole_state.layout[e].kind, state.layout[e].kind) << "entry " << e;
    EXPECT_EQ(std::memcmp(whole_state.data(e), state.data(e), state.layout[e].bytes), 0) << "entry " << e;
  }
  Model third = model;
  zenflow::Engine again = engine_in_parts(third, c, kThreeDevices);
  again.load_state(whole_state);
  for (int64_t t = 6; t <= 13; ++t) {
    alive.push_back(make_grads(model, t, true, 2));
    split.step(tensors_of(alive.back()), step_lrs(model, t));
    whole.step(tensors_of(alive.back()), step_lrs(model, t));
    again.step(tensors_of(alive.back()), step_lrs(model, t));
  }
  split.flush();
  whole.flush();
  again.flush();
  for (size_t i = 0; i < model.params.size(); ++i) {
    EXPECT_TRUE(model.params[i].bitwise_equal(copy.params[i])) << "one engine, param " << i;
    EXPECT_TRUE(model.params[i].bitwise_equal(third.params[i])) << "three devices, param " << i;
  }
  // A state of another model is refused before any device changes.
  zenflow::EngineState bad = split.save_state();
  bad.layout[9].shape[0] += 1;  // params[1]'s moment buffer: another shape
  std::vector<zf_tensor> buffers;
  for (size_t e = 0; e < bad.layout.size(); ++e) {
    std::vector<int64_t> shape(bad.layout[e].shape, bad.layout[e].shape + bad.layout[e].ndim);
    buffers.push_back(zenflow::contiguous_tensor(bad.data(e), bad.layout[e].dtype, shape));
  }
  EXPECT_EQ(zf_engine_load_state(again.get(), buffers.data(), buffers.size(), bad.counters.data(), bad.loss_scale),
            ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("buffers[9]"), std::string::npos) << zf_last_error();
}

TEST(EngineDevices, AHostLaneFailureOnOneDeviceIsRaisedOnTheTrainingThread) {
  Model model = standard_model(ZF_DTYPE_F32, 2);
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  c.update_interval = 1;
  zenflow::Engine engine = engine_in_parts(model, c, kTwoDevices);
  std::vector<HostTensor> grads = make_grads(model, 1);
  engine.step(tensors_of(grads));
  ASSERT_EQ(zf_engine_inject_host_lane_fault_for_testing(engine.get(), "injected"), ZF_SUCCESS);
  bool raised = false;
  for (int t = 0; t < 4 && !raised; ++t) {
    try {
      engine.step(tensors_of(grads));
      engine.flush();
    } catch (const zenflow::Error& e) {
      raised = std::string(e.what()).find("injected") != std::string::npos;
    }
  }
  EXPECT_TRUE(raised);
  EXPECT_THROW(engine.step(tensors_of(grads)), zenflow::Error);  // sticky until a load
}

}  // namespace

namespace {

// The device memory of docs/design.md section 7: the compact selected state (fp32 master,
// m, v: 12 bytes per selected element, plus a step count per selected column), the dense
// state, and a staging ring and upload buffer whose size depends on bucket_bytes and
// staging_slots, never on the model's size.
size_t device_bytes_for(int64_t matrices, int staging_slots, size_t bucket_bytes, zf_engine_stats* stats) {
  Model model;
  model.groups = {zf_engine_group{1e-3, 0.0, 0}};
  for (int64_t i = 0; i < matrices; ++i) {
    model.params.emplace_back(ZF_DTYPE_BF16, std::vector<int64_t>{128, 200});
    model.param_groups.push_back(0);
  }
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.1;  // k = 20 of 200
  c.staging_slots = staging_slots;
  c.bucket_bytes = bucket_bytes;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  std::vector<HostTensor> grads = make_grads(model, 1);
  engine.step(tensors_of(grads));
  *stats = engine.stats();
  return engine.device_memory_size();
}

TEST(EngineMemoryLayout, StagingIsARingOfSlotsWhateverTheModelSize) {
  zf_engine_stats small{}, large{}, more_slots{};
  const size_t bucket = 128 * 200 * 2;  // one matrix's bf16 gradient per bucket
  const size_t bytes_small = device_bytes_for(4, 2, bucket, &small);
  const size_t bytes_large = device_bytes_for(16, 2, bucket, &large);
  const size_t bytes_more_slots = device_bytes_for(16, 4, bucket, &more_slots);
  // Per matrix: master, m, v of 128 x 20 fp32 and 20 step counts, each 256-byte aligned.
  const size_t per_matrix = 3 * 10240 + 256;
  EXPECT_EQ(static_cast<size_t>(small.device_state_bytes), 4 * per_matrix);
  EXPECT_EQ(static_cast<size_t>(large.device_state_bytes), 16 * per_matrix);
  // What is not state (ring, upload buffer, selections, column sums, scalars) grows with the
  // model only by the selections and the column sums (4 bytes per column each at most).
  const size_t other_small = bytes_small - static_cast<size_t>(small.device_state_bytes);
  const size_t other_large = bytes_large - static_cast<size_t>(large.device_state_bytes);
  EXPECT_LE(other_large - other_small, 12 * (200 * 4 + 256));
  // Two more slots cost two slots (header and alignment included), nothing else.
  const size_t slot = (256 + bucket + 255) / 256 * 256;
  EXPECT_EQ(bytes_more_slots - bytes_large, 2 * slot);
  // stats() reports the same, and the upload copy on the host side (the host backend has no
  // pinned ring: its host lane reads the device slots in place).
  EXPECT_EQ(static_cast<size_t>(large.device_bytes), bytes_large);
  EXPECT_GE(static_cast<size_t>(large.pinned_host_bytes), size_t{16 * 128 * 200 * 2});
  EXPECT_LT(static_cast<size_t>(large.pinned_host_bytes), 2 * slot + 16 * 128 * 200 * 2);
  // About 1.2 bytes per bf16 parameter of state at r = 0.1, as section 7 says.
  const double per_param = static_cast<double>(large.device_state_bytes) / (16.0 * 128 * 200);
  EXPECT_GT(per_param, 1.2);
  EXPECT_LT(per_param, 1.3);
}

}  // namespace

namespace {

// CUDA-graph capture: a call on a capturing compute stream would hand work to host threads
// that a replay never runs. Every entry point refuses it before it changes anything.
TEST(EngineStreams, ACapturingComputeStreamIsRefusedByEveryCallAndChangesNothing) {
  Model model = standard_model(ZF_DTYPE_BF16, 5);
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  c.update_interval = 2;
  Model reference_model = model;
  Model donor_model = model;  // gives the state to load (saving flushes: not the reference)
  zenflow::Engine reference(reference_model.tensors(), reference_model.param_groups, reference_model.groups, c);
  zenflow::Engine donor(donor_model.tensors(), donor_model.param_groups, donor_model.groups, c);
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  auto backend = std::make_unique<SimulatedAsyncBackend>(5, 30);
  SimulatedAsyncBackend* simulated = backend.get();
  zf::testing::use_backend(engine.get(), std::move(backend));
  std::deque<std::vector<HostTensor>> alive;
  for (int64_t t = 1; t <= 3; ++t) {
    alive.push_back(make_grads(model, t));
    engine.step(tensors_of(alive.back()), step_lrs(model, t));
    reference.step(tensors_of(alive.back()), step_lrs(model, t));
    donor.step(tensors_of(alive.back()), step_lrs(model, t));
  }
  zf::testing::synchronize_backend(engine.get());
  const std::vector<HostTensor> before = model.params;
  const zf_engine_stats stats_before = engine.stats();
  zenflow::EngineState state = donor.save_state();

  simulated->set_capturing(true);
  alive.push_back(make_grads(model, 100));
  const std::vector<zf_tensor> bad = tensors_of(alive.back());
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"step", [&] { engine.step(bad, step_lrs(model, 4)); }},
      {"begin_step", [&] { engine.begin_step(step_lrs(model, 4)); }},
      {"flush", [&] { engine.flush(); }},
      {"save_state", [&] { engine.save_state(); }},
      {"load_state", [&] { engine.load_state(state); }},
      {"set_stream", [&] { engine.set_stream(nullptr); }},
  };
  for (const auto& call : calls) {
    try {
      call.second();
      ADD_FAILURE() << call.first << " ran on a capturing stream";
    } catch (const zenflow::Error& e) {
      EXPECT_EQ(e.status(), ZF_ERROR_NOT_SUPPORTED) << call.first;
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(call.first, 0), 0u) << message;
      EXPECT_NE(message.find("capturing a CUDA graph"), std::string::npos) << message;
    }
  }
  simulated->set_capturing(false);
  zf::testing::synchronize_backend(engine.get());
  for (size_t i = 0; i < model.params.size(); ++i)
    EXPECT_TRUE(model.params[i].bitwise_equal(before[i])) << "a refused call wrote param " << i;
  EXPECT_EQ(engine.stats().steps, stats_before.steps);
  EXPECT_EQ(engine.stats().bytes_down, stats_before.bytes_down);
  // ... and the run goes on as if nothing had been tried.
  for (int64_t t = 4; t <= 7; ++t) {
    alive.push_back(make_grads(model, t));
    engine.step(tensors_of(alive.back()), step_lrs(model, t));
    reference.step(tensors_of(alive.back()), step_lrs(model, t));
  }
  engine.flush();
  reference.flush();
  zf::testing::synchronize_backend(engine.get());
  for (size_t i = 0; i < model.params.size(); ++i)
    EXPECT_TRUE(model.params[i].bitwise_equal(reference_model.params[i])) << "param " << i;
}

// A bf16 model of 5 matrices, windows of 2 steps, on `simulated`: `before_steps` sees the
// backend once the engine holds it, then `steps` steps and a flush, then `after_flush` sees
// the backend (alive as long as the engine) and the engine's stats.
void step_on_simulated_backend(std::unique_ptr<SimulatedAsyncBackend> simulated, int64_t steps,
                               const std::function<void(SimulatedAsyncBackend&)>& before_steps,
                               const std::function<void(SimulatedAsyncBackend&, const zf_engine_stats&)>& after_flush) {
  Model model = standard_model(ZF_DTYPE_BF16, 5);
  zf_engine_config c = zf_engine_test::test_config();
  c.topk_ratio = 0.3;
  c.update_interval = 2;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  SimulatedAsyncBackend& backend = *simulated;
  zf::testing::use_backend(engine.get(), std::move(simulated));
  before_steps(backend);
  std::deque<std::vector<HostTensor>> alive;
  for (int64_t t = 1; t <= steps; ++t) {
    alive.push_back(make_grads(model, t));
    engine.step(tensors_of(alive.back()), step_lrs(model, t));
  }
  engine.flush();
  after_flush(backend, engine.stats());
}

// The host lane's thread binds itself to the backend before it waits for anything (on CUDA:
// its device, once, and the thread-local capture mode). The simulated backend raises on a
// wait from an engine thread that did not; here the lane must have bound exactly one thread.
TEST(EngineStreams, TheHostLaneBindsItsThreadOnceBeforeItsFirstWait) {
  step_on_simulated_backend(
      std::make_unique<SimulatedAsyncBackend>(9, 30), 6,
      [](SimulatedAsyncBackend& backend) { EXPECT_EQ(backend.bound_threads(), 0u); },
      [](SimulatedAsyncBackend& backend, const zf_engine_stats&) { EXPECT_EQ(backend.bound_threads(), 1u); });
}

// The host lane's timers count its passes, not its jobs' waits for the copies they read or
// write: with every such wait made long, the waits land in host_lane_wait_seconds and the
// accumulates and updates of a small model stay far below them.
TEST(EngineStreams, TheHostLaneTimesItsPassesWithoutItsWaitsForCopies) {
  const auto latency = std::chrono::milliseconds(40);
  auto simulated = std::make_unique<SimulatedAsyncBackend>(5, 30);
  simulated->set_lane_wait_latency(latency);
  step_on_simulated_backend(
      std::move(simulated), 8, [](SimulatedAsyncBackend&) {},
      [&](SimulatedAsyncBackend& backend, const zf_engine_stats& stats) {
        ASSERT_GE(backend.lane_waits(), 4u) << "the host lane's jobs waited for their copies";
        const double waited = static_cast<double>(backend.lane_waits()) * 1e-3 * static_cast<double>(latency.count());
        EXPECT_GE(stats.host_lane_wait_seconds, 0.95 * waited);
        EXPECT_GT(stats.accumulate_seconds, 0.0);
        EXPECT_GT(stats.host_update_seconds, 0.0);
        EXPECT_LT(stats.accumulate_seconds + stats.host_update_seconds, 0.25 * waited)
            << "the passes of a 5-matrix model took a fraction of one wait each";
      });
}

TEST(EngineStreams, TheHostBackendTakesOnlyTheNullStream) {
  Model model = standard_model();
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, zf_engine_test::test_config());
  engine.set_stream(nullptr);
  int not_a_stream = 0;
  try {
    engine.set_stream(&not_a_stream);
    FAIL() << "a stream was accepted by the host backend";
  } catch (const zenflow::Error& e) {
    EXPECT_EQ(e.status(), ZF_ERROR_INVALID_VALUE);
    EXPECT_NE(std::string(e.what()).find("stream"), std::string::npos) << e.what();
  }
  std::vector<HostTensor> grads = make_grads(model, 1);
  engine.step(tensors_of(grads));  // still usable: the refusal changed nothing
}

}  // namespace

namespace {

// The same, with no synchronisation between steps: the non-finite step's scalars must reach
// the host although the next step rewrites them on the device, in any interleaving.
TEST(EngineLaneOrdering, NonFiniteGradientIsFoundWhenTheNextStepRewritesTheScalars) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Model model = standard_model(ZF_DTYPE_F32, 3);
    zf_engine_config c = zf_engine_test::test_config();
    // With everything on the device nothing waits for the down lane until the scalar ring is
    // full, so a lazy device with slow copies runs later steps' kernels before this copy.
    c.topk_ratio = seed <= 4 ? 1.0 : 0.3;
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
    zf::testing::use_backend(engine.get(), std::make_unique<SimulatedAsyncBackend>(
                                               seed, seed <= 4 ? 0 : 20 * (seed % 4), seed <= 4 || seed % 2 == 1));
    std::deque<std::vector<HostTensor>> alive;
    bool raised = false;
    for (int64_t t = 1; t <= 12 && !raised; ++t) {
      alive.push_back(make_grads(model, t));
      if (t == 2) alive.back()[0].set(2, NAN);
      try {
        engine.step(tensors_of(alive.back()));
      } catch (const zenflow::Error& e) {
        raised = true;
        EXPECT_NE(std::string(e.what()).find("step 2"), std::string::npos) << e.what();
      }
    }
    if (!raised) {
      try {
        engine.flush();
      } catch (const zenflow::Error& e) {
        raised = true;
        EXPECT_NE(std::string(e.what()).find("step 2"), std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(raised) << "seed " << seed << ": the non-finite step 2 was never reported";
    zf::testing::synchronize_backend(engine.get());
  }
}

}  // namespace

namespace {

// The bucket planner: consecutive matrices of one dtype, at most bucket_bytes of packed
// gradient with nothing selected; a larger matrix is a bucket of its own; dense parameters
// (1-D, or in a dense group) are in no bucket.
TEST(EngineBuckets, ConsecutiveMatricesOfOneDtypeUpToTheBucketBytes) {
  Model model;
  model.groups = {zf_engine_group{1e-3, 0.0, 0}, zf_engine_group{1e-3, 0.0, 1}};
  const std::vector<std::pair<zf_dtype, std::vector<int64_t>>> params = {
      {ZF_DTYPE_BF16, {4, 10}},  // matrix 0: 80 bytes
      {ZF_DTYPE_BF16, {3, 10}},  // matrix 1: 60 bytes (with 0: 140 <= 150)
      {ZF_DTYPE_F32, {7}},       // dense (1-D)
      {ZF_DTYPE_BF16, {2, 5}},   // matrix 2: 20 bytes (160 > 150: a new bucket)
      {ZF_DTYPE_F32, {2, 5}},    // matrix 3: another dtype, a new bucket (40 bytes)
      {ZF_DTYPE_F32, {10, 10}},  // matrix 4: 400 bytes > 150, a bucket of its own
      {ZF_DTYPE_F32, {2, 2}},    // matrix 5: 16 bytes, after the large one: a new bucket
      {ZF_DTYPE_F32, {3, 3}},    // in the dense group: no bucket
      {ZF_DTYPE_F32, {1, 4}},    // matrix 6: 16 bytes, with matrix 5 (32 bytes)
  };
  for (size_t i = 0; i < params.size(); ++i) {
    model.params.emplace_back(params[i].first, params[i].second);
    model.param_groups.push_back(i == 7 ? 1 : 0);
  }
  zf_engine_config c = zf_engine_test::test_config();
  c.bucket_bytes = 150;
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
  const std::vector<zf::testing::BucketSpan> got = zf::testing::buckets(engine.get());
  const std::vector<zf::testing::BucketSpan> want = {{0, 2, ZF_DTYPE_BF16, 140},
                                                     {2, 3, ZF_DTYPE_BF16, 20},
                                                     {3, 4, ZF_DTYPE_F32, 40},
                                                     {4, 5, ZF_DTYPE_F32, 400},
                                                     {5, 7, ZF_DTYPE_F32, 32}};
  ASSERT_EQ(got.size(), want.size());
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(got[b].first, want[b].first) << "bucket " << b;
    EXPECT_EQ(got[b].last, want[b].last) << "bucket " << b;
    EXPECT_EQ(got[b].dtype, want[b].dtype) << "bucket " << b;
    EXPECT_EQ(got[b].max_bytes, want[b].max_bytes) << "bucket " << b;
  }
  // The staging slots hold the largest bucket: the ring's size follows bucket_bytes.
  zf_engine_stats stats{};
  std::vector<HostTensor> grads = make_grads(model, 1);
  engine.step(tensors_of(grads));
  stats = engine.stats();
  const size_t slot = (256 + 400 + 255) / 256 * 256;
  EXPECT_GE(static_cast<size_t>(stats.device_bytes), static_cast<size_t>(c.staging_slots) * slot);
}

}  // namespace

namespace {

// The automatic thread counts split the cores only when host work can run beside the
// caller's compute; a synchronous configuration gives both lanes every core.
// The published thread plan (zf_engine_thread_plan_for): data-parallel ranks on one host
// share its cores, unless a launcher pinned each rank (its affinity is then its share).
TEST(EngineThreads, ThePlanSharesTheHostsCoresAmongItsRanksUnlessTheyArePinned) {
  zf_engine_config c = zf_engine_config_default();
  zf_engine_thread_plan whole{};
  ASSERT_EQ(zf_engine_thread_plan_for(&c, &whole), ZF_SUCCESS);
  EXPECT_GE(whole.cores, 1);
  EXPECT_EQ(whole.host_threads, std::max(1, whole.cores - whole.cores / 2));
  EXPECT_EQ(whole.framework_threads, std::max(1, whole.cores - whole.host_threads));
  c.ranks_per_host = 2;
  zf_engine_thread_plan half{};
  ASSERT_EQ(zf_engine_thread_plan_for(&c, &half), ZF_SUCCESS);
  EXPECT_EQ(half.cores, std::max(1, whole.cores / 2));
  c.ranks_per_host = 1000;
  zf_engine_thread_plan crowded{};
  ASSERT_EQ(zf_engine_thread_plan_for(&c, &crowded), ZF_SUCCESS);
  EXPECT_EQ(crowded.cores, 1);
  EXPECT_EQ(crowded.host_threads, 1);
  EXPECT_EQ(crowded.framework_threads, 1);
#if defined(__linux__)
  if (whole.cores > 1) {
    // This thread pinned to one CPU, as a launcher pins a rank: one core, not divided again.
    int pinned_cores = 0, pinned_shared = 0;
    std::thread pinned([&] {
      cpu_set_t allowed, one;
      CPU_ZERO(&one);
      sched_getaffinity(0, sizeof(allowed), &allowed);
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &allowed)) continue;
        CPU_SET(cpu, &one);
        break;
      }
      ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
      zf_engine_config pinned_config = zf_engine_config_default();
      zf_engine_thread_plan plan{};
      zf_engine_thread_plan_for(&pinned_config, &plan);
      pinned_cores = plan.cores;
      pinned_config.ranks_per_host = 2;
      zf_engine_thread_plan_for(&pinned_config, &plan);
      pinned_shared = plan.cores;
    });
    pinned.join();
    EXPECT_EQ(pinned_cores, 1);
    EXPECT_EQ(pinned_shared, 1);
  }
#endif
  c.ranks_per_host = -3;
  EXPECT_EQ(zf_engine_thread_plan_for(&c, &whole), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("ranks_per_host"), std::string::npos) << zf_last_error();
  EXPECT_EQ(zf_engine_thread_plan_for(nullptr, &whole), ZF_ERROR_INVALID_VALUE);
}

TEST(EngineThreads, AutomaticCountsSplitTheCoresOnlyWhenHostWorkOverlaps) {
  Model model = standard_model(ZF_DTYPE_F32, 3);
  const int cores = zf::host_cpu_count();
  const int host_share = zf::reserved_split_thread_count(cores, 0.5);
  struct Case {
    double topk;
    int64_t interval;
    int32_t overlap;
    bool synchronous;
  };
  for (const Case& k : {Case{0.0, 1, 0, true}, Case{0.3, 1, 0, true}, Case{1.0, 4, 1, true}, Case{0.0, 1, 1, false},
                        Case{0.3, 2, 0, false}, Case{0.3, 0, 0, false}, Case{0.3, 4, 1, false}}) {
    zf_engine_config c = zf_engine_test::test_config();
    c.topk_ratio = k.topk;
    c.update_interval = k.interval;
    c.overlap_step = k.overlap;
    c.pt_reserved_cores_perc = 0.5;
    c.compute_threads = 0;
    c.host_threads = 0;
    zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, c);
    const std::string what = "topk " + std::to_string(k.topk) + ", interval " + std::to_string(k.interval) +
                             ", overlap " + std::to_string(k.overlap);
    EXPECT_EQ(zf::testing::compute_lane_threads(engine.get()), k.synchronous ? cores : std::max(1, cores - host_share))
        << what;
    EXPECT_EQ(zf::testing::host_lane_threads(engine.get()), k.synchronous ? cores : host_share) << what;
  }
}

}  // namespace
