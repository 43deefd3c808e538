/* A program outside the zenflow tree, built against an installed zenflow (CMake
 * find_package or pkg-config; tools/test_install.sh): creates an engine over one matrix and
 * one dense parameter, takes a few steps, and checks that both moved against their gradient. */
#include <stdio.h>
#include <string.h>

#include "zenflow/zenflow.h"

#define ROWS 4
#define COLS 6

static zf_tensor cpu_f32(float* data, int32_t ndim, int64_t rows, int64_t cols) {
  zf_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = ZF_DTYPE_F32;
  t.device.type = ZF_DEVICE_CPU;
  t.ndim = ndim;
  t.shape[0] = ndim == 1 ? cols : rows;
  t.strides[0] = ndim == 1 ? 1 : cols;
  if (ndim == 2) {
    t.shape[1] = cols;
    t.strides[1] = 1;
  }
  return t;
}

static int fail(const char* what, zf_status status) {
  fprintf(stderr, "consumer: %s failed: %s (%s)\n", what, zf_status_string(status), zf_last_error());
  return 1;
}

int main(void) {
  float weight[ROWS * COLS], bias[COLS], weight_grad[ROWS * COLS], bias_grad[COLS];
  zf_tensor params[2], grads[2];
  int32_t param_groups[2] = {0, 0};
  zf_engine_group group = {0.01, 0.0, 0};
  zf_engine_config config = zf_engine_config_default();
  zf_engine_stats stats;
  zf_engine* engine = NULL;
  zf_status status;
  int i, step;

  if (strcmp(zf_version(), ZENFLOW_VERSION_STRING) != 0) {
    fprintf(stderr, "consumer: header version %s, library version %s\n", ZENFLOW_VERSION_STRING, zf_version());
    return 1;
  }
  for (i = 0; i < ROWS * COLS; ++i) {
    weight[i] = 1.0f;
    weight_grad[i] = 0.5f; /* a constant positive gradient: AdamW moves every weight down */
  }
  for (i = 0; i < COLS; ++i) {
    bias[i] = 1.0f;
    bias_grad[i] = -0.5f;
  }
  params[0] = cpu_f32(weight, 2, ROWS, COLS);
  params[1] = cpu_f32(bias, 1, 1, COLS);
  grads[0] = cpu_f32(weight_grad, 2, ROWS, COLS);
  grads[1] = cpu_f32(bias_grad, 1, 1, COLS);
  config.topk_ratio = 0.5;
  config.update_interval = 2;
  config.compute_threads = 1;
  config.host_threads = 1;

  status = zf_engine_create(params, param_groups, 2, &group, 1, &config, &engine);
  if (status != ZF_SUCCESS) return fail("zf_engine_create", status);
  for (step = 0; step < 4; ++step) {
    status = zf_engine_step(engine, grads, 2, NULL, 0);
    if (status != ZF_SUCCESS) return fail("zf_engine_step", status);
  }
  status = zf_engine_flush(engine);
  if (status != ZF_SUCCESS) return fail("zf_engine_flush", status);
  status = zf_engine_get_stats(engine, &stats);
  if (status != ZF_SUCCESS) return fail("zf_engine_get_stats", status);
  status = zf_engine_destroy(engine);
  if (status != ZF_SUCCESS) return fail("zf_engine_destroy", status);

  for (i = 0; i < ROWS * COLS; ++i) {
    if (!(weight[i] < 1.0f)) {
      fprintf(stderr, "consumer: weight[%d] = %g did not move down\n", i, weight[i]);
      return 1;
    }
  }
  for (i = 0; i < COLS; ++i) {
    if (!(bias[i] > 1.0f)) {
      fprintf(stderr, "consumer: bias[%d] = %g did not move up\n", i, bias[i]);
      return 1;
    }
  }
  if (stats.steps != 4 || stats.bytes_down <= 0) {
    fprintf(stderr, "consumer: stats: %lld steps, %lld bytes down\n", (long long)stats.steps,
            (long long)stats.bytes_down);
    return 1;
  }
  printf("consumer: zenflow %s, %lld steps, weight[0] %.4f, bias[0] %.4f, %lld bytes down\n", zf_version(),
         (long long)stats.steps, weight[0], bias[0], (long long)stats.bytes_down);
  return 0;
}
