/*
 * Trains a linear model y = W x + b with the zenflow engine through the C ABI alone: plain
 * C99, no Python, no torch (issue 14; docs/c-api.md).
 *
 * The data is synthetic: a hidden W* [OUT, IN] and b* [OUT], inputs x uniform in [-1, 1],
 * targets y = W* x + b* + noise. Each step draws a batch, computes the loss
 * L = mean over the batch of |W x + b - y|^2 / 2 and its gradient here in C
 * (dL/dW = mean of (W x + b - y) x^T, dL/db = mean of (W x + b - y)), and hands both to
 * zf_engine_step: W is the engine's matrix (its top-k columns updated at once, the others
 * on the host every update_interval steps, one window late), b a dense parameter.
 *
 * Host backend by default. In a build of libzenflow with CUDA (ZENFLOW_EXAMPLE_CUDA is then
 * defined by examples/c/CMakeLists.txt) and with a GPU present, W and b and their gradients
 * live in cudaMalloc'd memory and the engine runs its CUDA backend; the gradient is still
 * computed on the host from a copy of the weights. `--host` forces the host backend.
 *
 * Prints the loss every 50 steps, then the engine's stall seconds and bytes moved, and exits
 * non-zero unless the loss fell below 5% of its starting value.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zenflow/zenflow.h"

#ifdef ZENFLOW_EXAMPLE_CUDA
#include <cuda_runtime.h>
#endif

enum { IN = 48, OUT = 12, BATCH = 64, STEPS = 400, REPORT_EVERY = 50 };

#define CHECK(call)                                                                                            \
  do {                                                                                                         \
    zf_status status_ = (call);                                                                                \
    if (status_ != ZF_SUCCESS) {                                                                               \
      fprintf(stderr, "train_linear: %s failed: %s: %s\n", #call, zf_status_string(status_), zf_last_error()); \
      return 1;                                                                                                \
    }                                                                                                          \
  } while (0)

/* A small deterministic generator (xorshift64*), so every run sees the same data. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform(void) { /* in [-1, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 4503599627370496.0 - 1.0;
}

static zf_tensor f32_tensor(void* data, int on_gpu, int32_t ndim, int64_t rows, int64_t cols) {
  zf_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = ZF_DTYPE_F32;
  t.device.type = on_gpu ? ZF_DEVICE_CUDA : ZF_DEVICE_CPU;
  t.device.index = 0;
  t.ndim = ndim;
  if (ndim == 1) {
    t.shape[0] = cols;
    t.strides[0] = 1;
  } else {
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.strides[0] = cols;
    t.strides[1] = 1;
  }
  return t;
}

/* One batch: the loss at the current weights, and its gradient into grad_w / grad_b. */
static double loss_and_gradient(const float* w, const float* b, const float* true_w, const float* true_b, float* grad_w,
                                float* grad_b) {
  double loss = 0.0, x[IN], residual[OUT];
  double gw[OUT * IN], gb[OUT];
  int s, o, i;
  memset(gw, 0, sizeof(gw));
  memset(gb, 0, sizeof(gb));
  for (s = 0; s < BATCH; ++s) {
    for (i = 0; i < IN; ++i) x[i] = uniform();
    for (o = 0; o < OUT; ++o) {
      double prediction = b[o], target = true_b[o] + 0.01 * uniform();
      for (i = 0; i < IN; ++i) {
        prediction += (double)w[o * IN + i] * x[i];
        target += (double)true_w[o * IN + i] * x[i];
      }
      residual[o] = prediction - target;
      loss += 0.5 * residual[o] * residual[o];
    }
    for (o = 0; o < OUT; ++o) {
      gb[o] += residual[o];
      for (i = 0; i < IN; ++i) gw[o * IN + i] += residual[o] * x[i];
    }
  }
  for (o = 0; o < OUT; ++o) {
    grad_b[o] = (float)(gb[o] / BATCH);
    for (i = 0; i < IN; ++i) grad_w[o * IN + i] = (float)(gw[o * IN + i] / BATCH);
  }
  return loss / BATCH;
}

int main(int argc, char** argv) {
  static float w[OUT * IN], b[OUT], true_w[OUT * IN], true_b[OUT], grad_w[OUT * IN], grad_b[OUT];
  void* param_w = w; /* where the engine's parameters live: these host arrays, or GPU memory */
  void* param_b = b;
  void* grad_w_dev = grad_w;
  void* grad_b_dev = grad_b;
  void* device_memory = NULL;
  int use_gpu = 0, step, i;
  zf_tensor params[2], grads[2];
  int32_t param_groups[2] = {0, 0};
  zf_engine_group group = {0.05, 0.0, 0}; /* lr, weight decay, dense */
  zf_engine_config config = zf_engine_config_default();
  zf_engine* engine = NULL;
  zf_engine_stats stats;
  double first_loss = 0.0, loss = 0.0, stall;
  size_t device_bytes = 0;

  for (i = 0; i < OUT * IN; ++i) true_w[i] = (float)uniform();
  for (i = 0; i < OUT; ++i) true_b[i] = (float)uniform();
  memset(w, 0, sizeof(w));
  memset(b, 0, sizeof(b));

  if (zf_cuda_compiled() && zf_cuda_device_count() > 0 && !(argc > 1 && strcmp(argv[1], "--host") == 0)) {
#ifdef ZENFLOW_EXAMPLE_CUDA
    use_gpu = cudaMalloc(&param_w, sizeof(w)) == cudaSuccess && cudaMalloc(&param_b, sizeof(b)) == cudaSuccess &&
              cudaMalloc(&grad_w_dev, sizeof(grad_w)) == cudaSuccess &&
              cudaMalloc(&grad_b_dev, sizeof(grad_b)) == cudaSuccess &&
              cudaMemcpy(param_w, w, sizeof(w), cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(param_b, b, sizeof(b), cudaMemcpyHostToDevice) == cudaSuccess;
    if (!use_gpu) {
      fprintf(stderr, "train_linear: CUDA allocation failed (%s)\n", cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
#else
    printf("train_linear: libzenflow has CUDA, but this example was built without the CUDA runtime; host backend\n");
#endif
  }
  printf("train_linear: zenflow %s, W [%d, %d] + b [%d], %s backend, SIMD %s\n", zf_version(), OUT, IN, OUT,
         use_gpu ? "CUDA" : "host", zf_simd_level_name(zf_simd_level_active()));

  params[0] = f32_tensor(param_w, use_gpu, 2, OUT, IN);
  params[1] = f32_tensor(param_b, use_gpu, 1, 1, OUT);
  grads[0] = f32_tensor(grad_w_dev, use_gpu, 2, OUT, IN);
  grads[1] = f32_tensor(grad_b_dev, use_gpu, 1, 1, OUT);
  config.topk_ratio = 0.25;   /* 12 of the 48 columns of W on the "device" every step */
  config.update_interval = 4; /* the other 36 on the host every 4 steps */
  config.overlap_step = 1;    /* in the background, applied one window later */
  config.compute_threads = 1;
  config.host_threads = 1;
  CHECK(zf_engine_create(params, param_groups, 2, &group, 1, &config, &engine));
  if (use_gpu) {
#ifdef ZENFLOW_EXAMPLE_CUDA
    CHECK(zf_engine_device_memory_size(engine, &device_bytes));
    if (cudaMalloc(&device_memory, device_bytes) != cudaSuccess) {
      fprintf(stderr, "train_linear: cudaMalloc of %zu bytes failed\n", device_bytes);
      return 1;
    }
    CHECK(zf_engine_attach_device_memory(engine, device_memory, device_bytes));
#endif
  }

  for (step = 0; step < STEPS; ++step) {
#ifdef ZENFLOW_EXAMPLE_CUDA
    /* The host computes the gradient from the current weights: copy them down (this waits
     * for the engine's work on the default stream, its compute stream here). */
    if (use_gpu && (cudaMemcpy(w, param_w, sizeof(w), cudaMemcpyDeviceToHost) != cudaSuccess ||
                    cudaMemcpy(b, param_b, sizeof(b), cudaMemcpyDeviceToHost) != cudaSuccess)) {
      fprintf(stderr, "train_linear: cudaMemcpy failed\n");
      return 1;
    }
#endif
    loss = loss_and_gradient(w, b, true_w, true_b, grad_w, grad_b);
    if (step == 0) first_loss = loss;
    if (step % REPORT_EVERY == 0) printf("step %4d  loss %.6f\n", step, loss);
#ifdef ZENFLOW_EXAMPLE_CUDA
    if (use_gpu && (cudaMemcpy(grad_w_dev, grad_w, sizeof(grad_w), cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaMemcpy(grad_b_dev, grad_b, sizeof(grad_b), cudaMemcpyHostToDevice) != cudaSuccess)) {
      fprintf(stderr, "train_linear: cudaMemcpy failed\n");
      return 1;
    }
#endif
    CHECK(zf_engine_step(engine, grads, 2, NULL, 0));
  }
  CHECK(zf_engine_flush(engine)); /* the parameters now hold the exact weights */
#ifdef ZENFLOW_EXAMPLE_CUDA
  if (use_gpu && (cudaMemcpy(w, param_w, sizeof(w), cudaMemcpyDeviceToHost) != cudaSuccess ||
                  cudaMemcpy(b, param_b, sizeof(b), cudaMemcpyDeviceToHost) != cudaSuccess)) {
    fprintf(stderr, "train_linear: cudaMemcpy failed\n");
    return 1;
  }
#endif
  loss = loss_and_gradient(w, b, true_w, true_b, grad_w, grad_b);
  CHECK(zf_engine_get_stats(engine, &stats));
  CHECK(zf_engine_destroy(engine));
#ifdef ZENFLOW_EXAMPLE_CUDA
  if (use_gpu) {
    cudaFree(param_w);
    cudaFree(param_b);
    cudaFree(grad_w_dev);
    cudaFree(grad_b_dev);
    cudaFree(device_memory);
  }
#endif

  stall = stats.stall_seconds_window_close + stats.stall_seconds_back_pressure + stats.stall_seconds_flush +
          stats.stall_seconds_readback;
  printf("final     loss %.6f (from %.6f: %.2f%%)\n", loss, first_loss, 100.0 * loss / first_loss);
  printf("steps %lld, host windows %lld, selected fraction %.3f\n", (long long)stats.steps, (long long)stats.windows,
         stats.selected_fraction);
  printf("stall seconds %.6f (window close %.6f, back-pressure %.6f, flush %.6f, readback %.6f)\n", stall,
         stats.stall_seconds_window_close, stats.stall_seconds_back_pressure, stats.stall_seconds_flush,
         stats.stall_seconds_readback);
  printf("bytes moved: down %lld, up %lld (%.3f and %.3f per step as a share of W's %zu bytes)\n",
         (long long)stats.bytes_down, (long long)stats.bytes_up, (double)stats.bytes_down / STEPS / sizeof(w),
         (double)stats.bytes_up / STEPS / sizeof(w), sizeof(w));
  (void)device_bytes;
  (void)device_memory;
  if (!(loss < 0.05 * first_loss)) {
    fprintf(stderr, "train_linear: FAIL: the loss fell only to %.2f%% of its start (5%% required)\n",
            100.0 * loss / first_loss);
    return 1;
  }
  printf("train_linear: the loss fell to %.2f%% of its start\n", 100.0 * loss / first_loss);
  return 0;
}
