// Descriptor validation at the C boundary, found by sanitizers and a descriptor fuzzer:
// shape products that overflow, raw out-of-range enum values, empty descriptors on a bad
// device, the overlap check across all the buffers of a call, and the layout checks (a
// tensor in another layout than the one another argument fixes, docs/c-api.md).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/column_checks.hpp"
#include "test_util.hpp"

namespace {

zf_tensor tensor_2d(void* data, zf_dtype dtype, int64_t rows, int64_t cols) {
  return zenflow::contiguous_tensor(data, dtype, {rows, cols});
}

struct StatsOutputs {
  std::vector<float> col_sq = std::vector<float>(4, -1.0f);
  float total = -1.0f;
  int32_t flag = -1;
  zf_tensor col_sq_t = zenflow::contiguous_tensor(col_sq.data(), ZF_DTYPE_F32, {4});
  zf_tensor total_t = zenflow::contiguous_tensor(&total, ZF_DTYPE_F32, {});
  zf_tensor flag_t = zenflow::contiguous_tensor(&flag, ZF_DTYPE_I32, {});
};

TEST(Validation, ShapesWhoseSizeOverflowsAreRejected) {
  float dummy[4] = {};
  StatsOutputs out;
  // 2^62 x 4 elements: the element count wraps to 0 in int64 arithmetic.
  zf_tensor grad = tensor_2d(dummy, ZF_DTYPE_F32, int64_t{1} << 62, 4);
  EXPECT_EQ(zf_column_stats(&grad, &out.col_sq_t, 1, &out.total_t, &out.flag_t, 0, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("PTRDIFF_MAX"), std::string::npos) << zf_last_error();
  // With NULL data it must not pass for empty either.
  grad.data = nullptr;
  EXPECT_EQ(zf_column_stats(&grad, &out.col_sq_t, 1, &out.total_t, &out.flag_t, 0, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_VALUE);
  // 2^32 x 2^32 fp32: 2^66 bytes.
  zf_tensor big = tensor_2d(dummy, ZF_DTYPE_F32, int64_t{1} << 32, int64_t{1} << 32);
  zf::ArgName name("params", 0);
  EXPECT_THROW(zf::check_descriptor(&big, name), zf::Error);
  EXPECT_EQ(out.total, -1.0f);
  EXPECT_EQ(out.flag, -1);
}

TEST(Validation, RawOutOfRangeEnumValuesAreRejected) {
  float data[4] = {};
  StatsOutputs out;
  zf_tensor grad = tensor_2d(data, ZF_DTYPE_F32, 1, 4);
  int bad_dtype = 77;
  std::memcpy(&grad.dtype, &bad_dtype, sizeof(bad_dtype));  // as a C caller could pass it
  EXPECT_EQ(zf_column_stats(&grad, &out.col_sq_t, 1, &out.total_t, &out.flag_t, 0, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_TYPE);
  EXPECT_NE(std::string(zf_last_error()).find("unknown dtype code 77"), std::string::npos) << zf_last_error();
  grad = tensor_2d(data, ZF_DTYPE_F32, 1, 4);
  int bad_device = 5;
  std::memcpy(&grad.device.type, &bad_device, sizeof(bad_device));
  EXPECT_EQ(zf_column_stats(&grad, &out.col_sq_t, 1, &out.total_t, &out.flag_t, 0, nullptr, nullptr, nullptr),
            ZF_ERROR_INVALID_TYPE);
}

// A build without CUDA refuses CUDA tensors, saying why it has no CUDA and how to get it.
TEST(Validation, ACudaTensorInABuildWithoutCudaSaysWhyAndHowToRebuild) {
  const std::string note = zf_cuda_build_note();
  if (zf_cuda_compiled()) {
    EXPECT_EQ(note, "");
    GTEST_SKIP() << "this build has CUDA";
  }
  EXPECT_FALSE(note.empty());
  float data[4] = {};
  StatsOutputs out;
  zf_tensor grad = tensor_2d(data, ZF_DTYPE_F32, 1, 4);
  grad.device = zf_device{ZF_DEVICE_CUDA, 0};
  out.col_sq_t.device = grad.device;
  EXPECT_EQ(zf_column_stats(&grad, &out.col_sq_t, 1, &out.total_t, &out.flag_t, 0, nullptr, nullptr, nullptr),
            ZF_ERROR_NOT_SUPPORTED);
  std::string message = zf_last_error();
  EXPECT_NE(message.find("grads[0]"), std::string::npos) << message;
  EXPECT_NE(message.find(note), std::string::npos) << message;
  EXPECT_NE(message.find("ZENFLOW_WITH_CUDA=1"), std::string::npos) << message;
  EXPECT_EQ(out.col_sq, std::vector<float>(4, -1.0f));

  const int32_t group = 0;
  zf_engine_group groups{};
  groups.lr = 1e-3;
  zf_engine* engine = nullptr;
  const zf_engine_config config = zf_engine_config_default();
  EXPECT_EQ(zf_engine_create(&grad, &group, 1, &groups, 1, &config, &engine), ZF_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(engine, nullptr);
  message = zf_last_error();
  EXPECT_NE(message.find(note), std::string::npos) << message;
  EXPECT_NE(message.find("ZENFLOW_WITH_CUDA=1"), std::string::npos) << message;
}

TEST(Validation, EmptyDescriptorsHaveTheirDeviceChecked) {
  float data[4] = {};
  StatsOutputs out;
  zf_tensor grad = tensor_2d(data, ZF_DTYPE_F32, 1, 4);
  zf_tensor empty = tensor_2d(nullptr, ZF_DTYPE_F32, 0, 0);
  zf_tensor empty_out = zenflow::contiguous_tensor(nullptr, ZF_DTYPE_F32, {0});
  empty.device = zf_device{ZF_DEVICE_CUDA, -3};
  const zf_tensor grads[2] = {grad, empty};
  const zf_tensor outs[2] = {out.col_sq_t, empty_out};
  EXPECT_NE(zf_column_stats(grads, outs, 2, &out.total_t, &out.flag_t, 0, nullptr, nullptr, nullptr), ZF_SUCCESS);
  EXPECT_NE(std::string(zf_last_error()).find("grads[1]"), std::string::npos) << zf_last_error();
  empty.device = zf_device{ZF_DEVICE_CUDA, 0};  // a valid device, but not the call's
  const zf_tensor grads_other[2] = {grad, empty};
  EXPECT_NE(zf_column_stats(grads_other, outs, 2, &out.total_t, &out.flag_t, 0, nullptr, nullptr, nullptr), ZF_SUCCESS);
  EXPECT_EQ(out.col_sq, std::vector<float>(4, -1.0f));
}

TEST(Validation, OverlapCheckFindsWrittenBuffersSharingMemory) {
  std::vector<float> memory(64);
  const auto view = [&](size_t offset, int64_t n) {
    return zenflow::contiguous_tensor(memory.data() + offset, ZF_DTYPE_F32, {n});
  };
  {
    zf::OverlapCheck check;  // reads may share memory
    check.add(view(0, 16), "a", false);
    check.add(view(8, 16), "b", false);
    check.add(view(32, 8), "c", true);
    EXPECT_NO_THROW(check.check());
  }
  {
    zf::OverlapCheck check;  // a write overlapping a read that starts before it
    check.add(view(0, 16), "read", false);
    check.add(view(15, 4), "written", true);
    EXPECT_THROW(check.check(), zf::Error);
  }
  {
    zf::OverlapCheck check;  // a long write covering later, disjoint buffers
    check.add(view(0, 40), zf::ArgName("outs", 3), true);
    check.add(view(10, 2), "x", false);
    check.add(view(20, 2), "y", false);
    try {
      check.check();
      FAIL() << "no overlap reported";
    } catch (const zf::Error& e) {
      EXPECT_NE(std::string(e.what()).find("outs[3]"), std::string::npos) << e.what();
    }
  }
  {
    zf::OverlapCheck check;  // adjacent buffers do not overlap; empty ones take no memory
    check.add(view(0, 8), "a", true);
    check.add(view(8, 8), "b", true);
    check.add(view(4, 0), "empty", true);
    EXPECT_NO_THROW(check.check());
  }
}

TEST(Validation, ColumnStatsOutputsSharingMemoryAreRejected) {
  std::vector<float> grad(2 * 4, 1.0f);
  std::vector<float> col_sq(8, -1.0f);
  float total = -1.0f;
  int32_t flag = -1;
  const zf_tensor grad_t = tensor_2d(grad.data(), ZF_DTYPE_F32, 2, 4);
  const zf_tensor grads[2] = {grad_t, grad_t};  // reading one gradient twice is fine
  const zf_tensor outs[2] = {zenflow::contiguous_tensor(col_sq.data(), ZF_DTYPE_F32, {4}),
                             zenflow::contiguous_tensor(col_sq.data() + 2, ZF_DTYPE_F32, {4})};
  const zf_tensor total_t = zenflow::contiguous_tensor(&total, ZF_DTYPE_F32, {});
  const zf_tensor flag_t = zenflow::contiguous_tensor(&flag, ZF_DTYPE_I32, {});
  EXPECT_EQ(zf_column_stats(grads, outs, 2, &total_t, &flag_t, 0, nullptr, nullptr, nullptr), ZF_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(zf_last_error()).find("out_col_sq[1]"), std::string::npos) << zf_last_error();
  EXPECT_EQ(total, -1.0f);
}

// The host step reads its gradient in the host layout [n, m] that state.exp_avg gives: W's
// own row-major gradient [m, n] is refused by name and nothing is written; the same elements
// as a flat 1-D buffer are read as they are.
TEST(Validation, HostStepRefusesAGradientInAnotherLayout) {
  const int64_t m = 2, n = 3;
  std::vector<float> master(n * m, 1.0f), exp_avg(n * m, 0.0f), exp_avg_sq(n * m, 0.0f), grad(n * m, 0.5f);
  std::vector<int32_t> steps(n, 0);
  zf_column_state state{tensor_2d(master.data(), ZF_DTYPE_F32, n, m), tensor_2d(exp_avg.data(), ZF_DTYPE_F32, n, m),
                        tensor_2d(exp_avg_sq.data(), ZF_DTYPE_F32, n, m),
                        zenflow::contiguous_tensor(steps.data(), ZF_DTYPE_I32, {n})};
  const double lr = 1e-3, wd = 0.0;
  const zf_adam_hparams hparams = ZF_ADAM_HPARAMS_DEFAULT;
  const zf_tensor row_major = tensor_2d(grad.data(), ZF_DTYPE_F32, m, n);
  EXPECT_EQ(zf_cpu_adamw_step_skip_columns(&state, nullptr, 1, &row_major, nullptr, nullptr, &lr, &wd, &hparams, 1.0f,
                                           ZF_CPU_ADAMW_INCREMENT_STEPS),
            ZF_ERROR_INVALID_VALUE);
  const std::string message = zf_last_error();
  EXPECT_NE(message.find("grads[0]: shape [2, 3] is not [3, 2], the host layout"), std::string::npos) << message;
  EXPECT_EQ(master, std::vector<float>(n * m, 1.0f));
  EXPECT_EQ(steps, std::vector<int32_t>(n, 0));

  const zf_tensor flat = zenflow::contiguous_tensor(grad.data(), ZF_DTYPE_F32, {n * m});
  EXPECT_EQ(zf_cpu_adamw_step_skip_columns(&state, nullptr, 1, &flat, nullptr, nullptr, &lr, &wd, &hparams, 1.0f,
                                           ZF_CPU_ADAMW_INCREMENT_STEPS),
            ZF_SUCCESS)
      << zf_last_error();
  EXPECT_EQ(steps, std::vector<int32_t>(n, 1));
}

// The device update reads its state in the compact layout [m, k]: a [k, m] state is refused.
TEST(Validation, SelectedColumnsUpdateRefusesStateInAnotherLayout) {
  const int64_t m = 3, n = 4, k = 2;
  std::vector<float> w(m * n, 1.0f), g(m * n, 0.5f), exp_avg(k * m, 0.0f), exp_avg_sq(k * m, 0.0f);
  std::vector<int32_t> selected = {0, 2}, steps(k, 0);
  const zf_tensor w_t = tensor_2d(w.data(), ZF_DTYPE_F32, m, n), g_t = tensor_2d(g.data(), ZF_DTYPE_F32, m, n);
  const zf_tensor selected_t = zenflow::contiguous_tensor(selected.data(), ZF_DTYPE_I32, {k});
  const zf_column_state state{
      zenflow::contiguous_tensor(nullptr, ZF_DTYPE_F32, {0}), tensor_2d(exp_avg.data(), ZF_DTYPE_F32, k, m),
      tensor_2d(exp_avg_sq.data(), ZF_DTYPE_F32, k, m), zenflow::contiguous_tensor(steps.data(), ZF_DTYPE_I32, {k})};
  const double lr = 1e-3, wd = 0.0;
  const zf_adam_hparams hparams = ZF_ADAM_HPARAMS_DEFAULT;
  EXPECT_EQ(zf_adamw_selected_columns(&w_t, &g_t, &selected_t, &state, 1, &lr, &wd, nullptr, &hparams, nullptr, nullptr,
                                      nullptr),
            ZF_ERROR_INVALID_VALUE);
  const std::string message = zf_last_error();
  EXPECT_NE(message.find("state[0].exp_avg: shape [2, 3] is not [3, 2]"), std::string::npos) << message;
  EXPECT_EQ(w, std::vector<float>(m * n, 1.0f));
}

}  // namespace
