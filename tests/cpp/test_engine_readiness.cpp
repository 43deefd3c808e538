// Readiness in the engine (engine.h: zf_engine_mark_ready, zf_engine_end_step_with,
// zf_engine_check_params): the runs a backward's hooks produce, a split step driven by
// readiness alone equals the whole step bit for bit (any order, any bucket size, one device
// or several, a parameter marked twice before or after its submit), and a parameter whose
// memory moved is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/readiness.hpp"
#include "engine/testing.hpp"
#include "test_engine_util.hpp"

namespace {

using namespace zf_engine_test;
using Range = zf::ReadyRuns::Range;

// ---- the bookkeeping alone ----

TEST(ReadyRuns, RunsJoinOnBothSidesAndGoOutAtTheThreshold) {
  zf::ReadyRuns runs;
  runs.reset(6);
  EXPECT_TRUE(runs.mark(4, 10, 35).empty());
  EXPECT_TRUE(runs.mark(2, 10, 35).empty());
  EXPECT_TRUE(runs.mark(2, 10, 35).empty());  // ready again before its submit: nothing new
  const Range joined = runs.mark(3, 10, 35);  // joins [2] and [4]: 30 bytes, still below
  EXPECT_TRUE(joined.empty());
  const Range out = runs.mark(5, 10, 35);  // [2, 6): 40 bytes
  EXPECT_EQ(out.first, 2u);
  EXPECT_EQ(out.stop, 6u);
  runs.submitted(out.first, out.stop);
  EXPECT_EQ(runs.arrived_after_submit(), 6u);
  const std::vector<Range> rest = runs.unsubmitted();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].first, 0u);
  EXPECT_EQ(rest[0].stop, 2u);
  EXPECT_TRUE(runs.mark(3, 10, 35).empty());  // after its submit: recorded
  EXPECT_EQ(runs.arrived_after_submit(), 3u);
  runs.reset(6);
  EXPECT_EQ(runs.arrived_after_submit(), 6u);
  EXPECT_EQ(runs.unsubmitted().size(), 1u);
}

TEST(ReadyRuns, AThresholdOfOneSubmitsEachParameterAlone) {
  zf::ReadyRuns runs;
  runs.reset(3);
  for (size_t i : {2u, 0u, 1u}) {
    const Range r = runs.mark(i, 4, 1);
    EXPECT_EQ(r.first, i);
    EXPECT_EQ(r.stop, i + 1);
    runs.submitted(r.first, r.stop);
  }
  EXPECT_TRUE(runs.unsubmitted().empty());
}

// ---- the engine ----

enum class Drive { kWhole, kReadyInOrder, kReadyShuffled, kMarkedTwice, kRetaken };

zf_engine_config readiness_config(size_t bucket_bytes) {
  zf_engine_config c = test_config();
  c.topk_ratio = 0.3;
  c.update_interval = 3;
  c.select_strategy = ZF_SELECT_STEP;
  c.select_interval = 4;
  c.max_grad_norm = 5.0;
  c.bucket_bytes = bucket_bytes;
  return c;
}

// Weights and state after 9 steps driven as `drive` says; `parts` > 1 runs the parameters
// as if on that many devices.
std::vector<HostTensor> readiness_run(Drive drive, size_t bucket_bytes, size_t parts) {
  Model model = standard_model(ZF_DTYPE_BF16, 5);
  const zf_engine_config config = readiness_config(bucket_bytes);
  std::vector<zf_tensor> params = model.tensors();
  zf_engine* raw = nullptr;
  if (parts > 1) {
    std::vector<size_t> part_of(params.size());
    for (size_t i = 0; i < part_of.size(); ++i) part_of[i] = i % parts;
    raw = zf::testing::create_engine_in_parts(params, model.param_groups, model.groups, config, part_of);
  } else {
    EXPECT_EQ(zf_engine_create(params.data(), model.param_groups.data(), params.size(), model.groups.data(),
                               model.groups.size(), &config, &raw),
              ZF_SUCCESS);
  }
  std::mt19937 order_rng(7);
  for (int64_t t = 1; t <= 9; ++t) {
    std::vector<HostTensor> grads = make_grads(model, t, true, 3);
    std::vector<zf_tensor> g = tensors_of(grads);
    const std::vector<double> lrs = step_lrs(model, t);
    if (drive == Drive::kWhole) {
      EXPECT_EQ(zf_engine_step(raw, g.data(), g.size(), lrs.data(), lrs.size()), ZF_SUCCESS) << zf_last_error();
      continue;
    }
    EXPECT_EQ(zf_engine_begin_step(raw, lrs.data(), lrs.size()), ZF_SUCCESS);
    std::vector<size_t> order(g.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;  // backward's order
    if (drive == Drive::kReadyShuffled) std::shuffle(order.begin(), order.end(), order_rng);
    // kMarkedTwice / kRetaken: parameter 0's gradient arrives first as a part of itself (a
    // zeroed copy), then whole; kRetaken leaves time for its run to be submitted in between.
    std::vector<HostTensor> partial = grads;
    for (HostTensor& p : partial)
      for (int64_t e = 0; e < p.numel(); ++e) p.set(e, 0.0f);
    std::vector<zf_tensor> early = tensors_of(partial);
    const bool twice = drive == Drive::kMarkedTwice || drive == Drive::kRetaken;
    if (twice) EXPECT_EQ(zf_engine_mark_ready(raw, 0, &early[0]), ZF_SUCCESS) << zf_last_error();
    for (size_t i : order) {
      if (twice && i == 0) continue;
      EXPECT_EQ(zf_engine_mark_ready(raw, i, &g[i]), ZF_SUCCESS) << zf_last_error();
    }
    if (twice) EXPECT_EQ(zf_engine_mark_ready(raw, 0, &g[0]), ZF_SUCCESS);
    EXPECT_EQ(zf_engine_end_step_with(raw, g.data(), g.size()), ZF_SUCCESS) << zf_last_error();
  }
  zenflow::Engine engine(raw);  // owns it from here
  engine.flush();
  std::vector<HostTensor> out = model.params;
  zenflow::EngineState state = engine.save_state();
  for (size_t e = 0; e < state.layout.size(); ++e) {  // the whole state too, as f32 bits
    HostTensor t(ZF_DTYPE_F32, {static_cast<int64_t>((state.layout[e].bytes + 3) / 4)});
    std::memcpy(t.f32.data(), state.data(e), state.layout[e].bytes);
    out.push_back(std::move(t));
  }
  return out;
}

void expect_same(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].bitwise_equal(b[i])) << what << ": buffer " << i;
}

TEST(EngineReadiness, ReadinessAloneEqualsTheWholeStepBitForBit) {
  for (size_t parts : {1u, 2u}) {
    const std::vector<HostTensor> whole = readiness_run(Drive::kWhole, 100, parts);
    for (size_t bucket : {size_t{1}, size_t{100}, size_t{64} << 20}) {
      const std::string where = std::to_string(parts) + " part(s), bucket " + std::to_string(bucket);
      expect_same(whole, readiness_run(Drive::kReadyInOrder, bucket, parts), "in order, " + where);
      expect_same(whole, readiness_run(Drive::kReadyShuffled, bucket, parts), "shuffled, " + where);
    }
  }
}

TEST(EngineReadiness, AGradientThatGrewAfterItsSubmitRetakesTheStepWhole) {
  // Bucket 1 submits parameter 0's zeroed first arrival at once: what was submitted is not
  // its gradient, so end_step_with must retake the step from the final gradients. Bucket
  // 64 MiB keeps it waiting: the second arrival only replaces it.
  const std::vector<HostTensor> whole = readiness_run(Drive::kWhole, 100, 1);
  expect_same(whole, readiness_run(Drive::kRetaken, 1, 1), "retaken");
  expect_same(whole, readiness_run(Drive::kMarkedTwice, size_t{64} << 20, 1), "replaced before its submit");
  expect_same(whole, readiness_run(Drive::kRetaken, 1, 2), "retaken, 2 parts");
}

TEST(EngineReadiness, BadCallsAreRefusedAndChangeNothing) {
  Model model = standard_model();
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, readiness_config(100));
  std::vector<HostTensor> grads = make_grads(model, 1);
  std::vector<zf_tensor> g = tensors_of(grads);
  EXPECT_EQ(zf_engine_mark_ready(engine.get(), 0, &g[0]), ZF_ERROR_INVALID_VALUE);  // no split step
  EXPECT_NE(std::string(zf_last_error()).find("begin_step"), std::string::npos) << zf_last_error();
  EXPECT_EQ(zf_engine_end_step_with(engine.get(), g.data(), g.size()), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_engine_mark_ready(nullptr, 0, &g[0]), ZF_ERROR_INVALID_VALUE);
  engine.begin_step();
  EXPECT_EQ(zf_engine_mark_ready(engine.get(), g.size(), &g[0]), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("out of range"), std::string::npos) << zf_last_error();
  EXPECT_EQ(zf_engine_mark_ready(engine.get(), 0, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_engine_end_step_with(engine.get(), g.data(), g.size() - 1), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("gradients for"), std::string::npos) << zf_last_error();
  EXPECT_EQ(zf_engine_end_step_with(engine.get(), g.data(), g.size()), ZF_SUCCESS) << zf_last_error();
  EXPECT_EQ(engine.stats().steps, 1u);
}

TEST(EngineReadiness, AParameterWhoseMemoryMovedIsNamed) {
  Model model = standard_model();
  zenflow::Engine engine(model.tensors(), model.param_groups, model.groups, readiness_config(100));
  std::vector<const void*> data;
  for (auto& p : model.params) data.push_back(p.data());
  EXPECT_EQ(zf_engine_check_params(engine.get(), data.data(), data.size()), ZF_SUCCESS);
  std::vector<float> elsewhere(16);
  data[2] = elsewhere.data();
  EXPECT_EQ(zf_engine_check_params(engine.get(), data.data(), data.size()), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("params[2]: its memory moved"), std::string::npos) << zf_last_error();
  EXPECT_EQ(zf_engine_check_params(engine.get(), data.data(), data.size() - 1), ZF_ERROR_INVALID_VALUE);
  EXPECT_EQ(zf_engine_check_params(engine.get(), nullptr, data.size()), ZF_ERROR_INVALID_VALUE);
}

}  // namespace
