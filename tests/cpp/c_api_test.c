/* Drives the C ABI from C: proves zenflow.h is C and the entry points work without C++. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_util.h"
#include "zenflow/zenflow.h"

int main(void) {
  float grad[2 * 3] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}; /* [2, 3] row-major */
  float col_sq[3] = {-1.0f, -1.0f, -1.0f};
  float total = -1.0f;
  int32_t nonfinite = -1;
  int32_t indices[2] = {-1, -1};
  zf_tensor g, out, total_t, flag_t, scores, picked;
  size_t workspace_bytes = 123;

  EXPECT(strcmp(zf_version(), ZENFLOW_VERSION_STRING) == 0);
  EXPECT(zf_get_num_threads() >= 1);

  memset(&g, 0, sizeof(g));
  g.data = grad;
  g.dtype = ZF_DTYPE_F32;
  g.device.type = ZF_DEVICE_CPU;
  g.ndim = 2;
  g.shape[0] = 2;
  g.shape[1] = 3;
  g.strides[0] = 3;
  g.strides[1] = 1;
  out = tensor_1d(col_sq, ZF_DTYPE_F32, 3);
  total_t = tensor_1d(&total, ZF_DTYPE_F32, 1);
  flag_t = tensor_1d(&nonfinite, ZF_DTYPE_I32, 1);

  /* Query-then-run: the host needs no workspace. */
  EXPECT(zf_column_stats(&g, &out, 1, &total_t, &flag_t, 0, NULL, &workspace_bytes, NULL) == ZF_SUCCESS);
  EXPECT(workspace_bytes == 0);
  EXPECT(col_sq[0] == -1.0f);
  EXPECT(zf_column_stats(&g, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL) == ZF_SUCCESS);
  EXPECT(col_sq[0] == 17.0f && col_sq[1] == 29.0f && col_sq[2] == 45.0f);
  EXPECT(total == 91.0f);
  EXPECT(nonfinite == 0);

  scores = tensor_1d(col_sq, ZF_DTYPE_F32, 3);
  picked = tensor_1d(indices, ZF_DTYPE_I32, 2);
  EXPECT(zf_select_topk_columns(&scores, &picked, 1, NULL, NULL, NULL) == ZF_SUCCESS);
  EXPECT(indices[0] == 1 && indices[1] == 2);

  /* Bad input: a status, a message that names the argument, and nothing written. */
  g.dtype = ZF_DTYPE_I32;
  col_sq[0] = -1.0f;
  EXPECT(zf_column_stats(&g, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL) == ZF_ERROR_INVALID_TYPE);
  EXPECT(strstr(zf_last_error(), "grads[0]") != NULL);
  EXPECT(col_sq[0] == -1.0f);
  picked.shape[0] = 4; /* k > n */
  EXPECT(zf_select_topk_columns(&scores, &picked, 1, NULL, NULL, NULL) == ZF_ERROR_INVALID_VALUE);
  EXPECT(strstr(zf_last_error(), "out_indices[0]") != NULL);
  EXPECT(zf_set_num_threads(0, NULL, 0) == ZF_ERROR_INVALID_VALUE);
  EXPECT(strlen(zf_status_string(ZF_ERROR_CUDA)) > 0);
  EXPECT(zf_cuda_device_count() >= 0);

  /* CPU AdamW: one step from zero moments moves each weight by lr * sign(g). */
  {
    float weights[4] = {1.0f, 1.0f, 1.0f, 1.0f}, m[4] = {0}, v[4] = {0}, g[4] = {0.5f, -2.0f, 3.0f, -0.25f};
    int64_t step = 1;
    double lr = 0.1, weight_decay = 0.0;
    zf_adam_hparams hp = ZF_ADAM_HPARAMS_DEFAULT;
    zf_tensor w_t = tensor_1d(weights, ZF_DTYPE_F32, 4), m_t = tensor_1d(m, ZF_DTYPE_F32, 4);
    zf_tensor v_t = tensor_1d(v, ZF_DTYPE_F32, 4), g_t = tensor_1d(g, ZF_DTYPE_F32, 4);
    int i;
    EXPECT(zf_cpu_adamw_step(&w_t, &m_t, &v_t, &g_t, NULL, 1, &step, &lr, &weight_decay, &hp, 1.0f, 0) == ZF_SUCCESS);
    for (i = 0; i < 4; ++i) EXPECT(fabsf(weights[i] - (g[i] > 0 ? 0.9f : 1.1f)) < 1e-6f);
    hp.beta1 = 1.5; /* out of range: rejected, nothing written */
    EXPECT(zf_cpu_adamw_step(&w_t, &m_t, &v_t, &g_t, NULL, 1, &step, &lr, &weight_decay, &hp, 1.0f, 0) ==
           ZF_ERROR_INVALID_VALUE);
    EXPECT(strstr(zf_last_error(), "beta1") != NULL);
    EXPECT(fabsf(weights[0] - 0.9f) < 1e-6f);
  }

  /* The skip-columns step on host-layout state [n=2, m=2] with column 1 selected: column 0
   * is updated and its step count incremented; column 1 is untouched. */
  {
    float master[4] = {1.0f, 1.0f, 1.0f, 1.0f}, m[4] = {0}, v[4] = {0}, acc[4] = {1.0f, -1.0f, 7.0f, 7.0f};
    int32_t steps[2] = {0, 5}, selected = 1;
    double lr = 0.1, weight_decay = 0.0;
    zf_adam_hparams hp = ZF_ADAM_HPARAMS_DEFAULT;
    zf_column_state state;
    zf_tensor acc_t = tensor_1d(acc, ZF_DTYPE_F32, 4), selected_t = tensor_1d(&selected, ZF_DTYPE_I32, 1);
    state.master = tensor_1d(master, ZF_DTYPE_F32, 4);
    state.exp_avg = tensor_1d(m, ZF_DTYPE_F32, 4);
    state.exp_avg.ndim = 2;
    state.exp_avg.shape[0] = 2;
    state.exp_avg.shape[1] = 2;
    state.exp_avg.strides[0] = 2;
    state.exp_avg.strides[1] = 1;
    state.exp_avg_sq = tensor_1d(v, ZF_DTYPE_F32, 4);
    state.steps = tensor_1d(steps, ZF_DTYPE_I32, 2);
    EXPECT(zf_cpu_adamw_step_skip_columns(&state, &selected_t, 1, &acc_t, NULL, NULL, &lr, &weight_decay, &hp, 1.0f,
                                          ZF_CPU_ADAMW_ZERO_GRAD | ZF_CPU_ADAMW_INCREMENT_STEPS) == ZF_SUCCESS);
    EXPECT(fabsf(master[0] - 0.9f) < 1e-6f && fabsf(master[1] - 1.1f) < 1e-6f);
    EXPECT(master[2] == 1.0f && master[3] == 1.0f);
    EXPECT(steps[0] == 1 && steps[1] == 5);
    EXPECT(acc[0] == 0.0f && acc[1] == 0.0f && acc[2] == 7.0f);
  }

  /* accumulate and pack: the per-step host and device work of deferral. */
  {
    float acc[4] = {0}, block[4] = {1.0f, 2.0f, 3.0f, 4.0f}, packed[4] = {-1.0f, -1.0f, -1.0f, -1.0f};
    int32_t selected = 1;
    zf_tensor acc_t = tensor_1d(acc, ZF_DTYPE_F32, 4), block_t = tensor_1d(block, ZF_DTYPE_F32, 4);
    zf_tensor packed_t = tensor_1d(packed, ZF_DTYPE_F32, 4), selected_t = tensor_1d(&selected, ZF_DTYPE_I32, 1);
    EXPECT(zf_cpu_accumulate(&acc_t, NULL, 1, &block_t, 0.5f) == ZF_SUCCESS);
    EXPECT(acc[0] == 0.5f && acc[3] == 2.0f);
    g.dtype = ZF_DTYPE_F32; /* grad [2, 3] = {1..6}; columns 0 and 2 are unselected */
    EXPECT(zf_pack_columns(&g, &selected_t, 1, &packed_t, NULL, NULL) == ZF_SUCCESS);
    EXPECT(packed[0] == 1.0f && packed[1] == 4.0f && packed[2] == 3.0f && packed[3] == 6.0f);
  }

  /* Any int is a valid argument in C: a value that is not a level is rejected, not UB. */
  EXPECT(zf_set_simd_level((zf_simd_level)9) == ZF_ERROR_INVALID_VALUE);
  EXPECT(strstr(zf_last_error(), "level") != NULL);
  EXPECT(zf_set_simd_level((zf_simd_level)-1) == ZF_ERROR_INVALID_VALUE);
  EXPECT(strcmp(zf_simd_level_name((zf_simd_level)9), "unknown") == 0);
  EXPECT(strcmp(zf_simd_level_name((zf_simd_level)-1), "unknown") == 0);
  EXPECT(zf_simd_level_active() <= zf_simd_level_supported());

  /* ZENFLOW_SIMD (the ctest c_api_bogus_simd runs this with ZENFLOW_SIMD=bogus): an unknown
   * value keeps the supported level and says so. */
  {
    const char* requested = getenv("ZENFLOW_SIMD");
    if (requested == NULL || requested[0] == '\0') {
      EXPECT(zf_simd_environment_warning()[0] == '\0');
    } else if (strcmp(requested, "bogus") == 0) {
      EXPECT(zf_simd_level_active() == zf_simd_level_supported());
      EXPECT(strstr(zf_simd_environment_warning(), "ZENFLOW_SIMD='bogus' is not one of") != NULL);
    }
  }

  /* The pool size has an upper bound instead of starting any number of threads. */
  EXPECT(zf_set_num_threads(100000, NULL, 0) == ZF_ERROR_INVALID_VALUE);
  EXPECT(strstr(zf_last_error(), "num_threads") != NULL);

  if (failures == 0) printf("c_api: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
