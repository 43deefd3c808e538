/*
 * The whole C ABI driven from C (issue 14): every ZF_API entry point of
 * the headers in cpp/include/zenflow is called here at least once with good arguments (results checked
 * against values worked out by hand) and with bad ones: NULL pointers, wrong dtypes, wrong
 * shapes, out-of-range enums. Every status code and its zf_last_error() text; a failed call
 * changes nothing; engine handles that were destroyed, destroyed twice or never created are
 * a clear INVALID_VALUE; zf_last_error() is per thread (two pthreads failing at once).
 * ZF_ERROR_INTERNAL is a bug by definition and has no input that produces it: only its name
 * is checked.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_util.h"
#include "zenflow/zenflow.h"

/* Under AddressSanitizer or ThreadSanitizer (tools/run_sanitizers.sh) a failed operator new
 * ends the process whatever allocator_may_return_null says, so the OUT_OF_MEMORY check runs
 * in the plain builds only. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ZF_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ZF_TEST_SANITIZED 1
#endif
#endif

static zf_tensor t2(void* data, zf_dtype dtype, int64_t rows, int64_t cols) {
  zf_tensor t = tensor_1d(data, dtype, rows);
  t.ndim = 2;
  t.shape[1] = cols;
  t.strides[0] = cols;
  t.strides[1] = 1;
  return t;
}

/* The data of wrong-dtype i64 descriptors: 8-byte aligned, so that the dtype, not the
 * alignment, is what the call rejects. */
static int64_t wide[16];

static zf_tensor empty_f32(void) { return tensor_1d(NULL, ZF_DTYPE_F32, 0); }

static int all_equal(const float* values, int n, float expected) {
  int i;
  for (i = 0; i < n; ++i)
    if (values[i] != expected) return 0;
  return 1;
}

/* ---- types.h: version, errors, dtypes, SIMD, threads, CUDA queries ---- */
/* A parallel runtime of one thread that runs a team of `num_threads` shares in turn: the
 * contract of zf_parallel_run kept without threads. */
static int serial_runtime_regions = 0;
static void run_serially(void* context, zf_parallel_body body, void* body_context, int num_threads) {
  int i;
  *(int*)context += 1;
  for (i = 0; i < num_threads; ++i) body(body_context, i, num_threads);
}

static void check_runtime_calls(void) {
  char name[64];
  const zf_dtype dtypes[5] = {ZF_DTYPE_F32, ZF_DTYPE_F16, ZF_DTYPE_BF16, ZF_DTYPE_I32, ZF_DTYPE_I64};
  const size_t sizes[5] = {4, 2, 2, 4, 8};
  const char* names[5] = {"f32", "f16", "bf16", "i32", "i64"};
  int i, threads;

  EXPECT(strcmp(zf_version(), ZENFLOW_VERSION_STRING) == 0);
  EXPECT(ZENFLOW_VERSION == ZENFLOW_VERSION_MAJOR * 10000 + ZENFLOW_VERSION_MINOR * 100 + ZENFLOW_VERSION_PATCH);
  /* Every status has its own name; an unknown value is not NULL. */
  EXPECT(strcmp(zf_status_string(ZF_SUCCESS), zf_status_string(ZF_ERROR_INVALID_VALUE)) != 0);
  for (i = ZF_SUCCESS; i <= ZF_ERROR_INTERNAL; ++i) {
    int j;
    EXPECT(zf_status_string((zf_status)i) != NULL && zf_status_string((zf_status)i)[0] != '\0');
    for (j = 0; j < i; ++j) EXPECT(strcmp(zf_status_string((zf_status)i), zf_status_string((zf_status)j)) != 0);
  }
  EXPECT(zf_status_string((zf_status)99) != NULL);
  for (i = 0; i < 5; ++i) {
    EXPECT(zf_dtype_size(dtypes[i]) == sizes[i]);
    EXPECT(strstr(zf_dtype_name(dtypes[i]), names[i]) != NULL);
  }
  EXPECT(zf_dtype_size((zf_dtype)42) == 0);
  EXPECT(zf_dtype_name((zf_dtype)42) != NULL);

  EXPECT(zf_simd_level_active() <= zf_simd_level_supported());
  EXPECT(strcmp(zf_simd_level_name(ZF_SIMD_SCALAR), "scalar") == 0);
  EXPECT(strcmp(zf_simd_level_name(ZF_SIMD_AVX2), "avx2") == 0);
  EXPECT(strcmp(zf_simd_level_name(ZF_SIMD_AVX512), "avx512") == 0);
  EXPECT(zf_simd_environment_warning() != NULL);
  {
    const zf_simd_level active = zf_simd_level_active();
    EXPECT_OK(zf_set_simd_level(ZF_SIMD_SCALAR));
    EXPECT(zf_simd_level_active() == ZF_SIMD_SCALAR);
    EXPECT_OK(zf_set_simd_level(active));
    EXPECT_ERROR(zf_set_simd_level((zf_simd_level)7), ZF_ERROR_INVALID_VALUE, "level");
    EXPECT(zf_simd_level_active() == active);
  }

  EXPECT(zf_host_cpu_count() >= 1);
  { /* the streaming roof: a measurement, and every bad argument refused before any work */
    zf_stream_spec shape[3] = {
        {ZF_DTYPE_BF16, ZF_STREAM_READ}, {ZF_DTYPE_F32, ZF_STREAM_READ_WRITE}, {ZF_DTYPE_F16, ZF_STREAM_WRITE}};
    zf_stream_spec bad[2] = {{ZF_DTYPE_F32, ZF_STREAM_READ}, {ZF_DTYPE_F32, ZF_STREAM_READ}};
    double bandwidth = -1.0;
    EXPECT_OK(zf_host_stream_bandwidth(shape, 3, 4099, 2, 2, &bandwidth));
    EXPECT(bandwidth > 0.0);
    bandwidth = -1.0;
    EXPECT_ERROR(zf_host_stream_bandwidth(NULL, 3, 4099, 1, 1, &bandwidth), ZF_ERROR_INVALID_VALUE, "streams");
    EXPECT_ERROR(zf_host_stream_bandwidth(shape, 0, 4099, 1, 1, &bandwidth), ZF_ERROR_INVALID_VALUE, "count");
    EXPECT_ERROR(zf_host_stream_bandwidth(shape, 17, 4099, 1, 1, &bandwidth), ZF_ERROR_INVALID_VALUE, "count");
    EXPECT_ERROR(zf_host_stream_bandwidth(shape, 3, 0, 1, 1, &bandwidth), ZF_ERROR_INVALID_VALUE, "elements");
    EXPECT_ERROR(zf_host_stream_bandwidth(shape, 3, 4099, 0, 1, &bandwidth), ZF_ERROR_INVALID_VALUE, "threads");
    EXPECT_ERROR(zf_host_stream_bandwidth(shape, 3, 4099, 1, 0, &bandwidth), ZF_ERROR_INVALID_VALUE, "repetitions");
    EXPECT_ERROR(zf_host_stream_bandwidth(shape, 3, 4099, 1, 1, NULL), ZF_ERROR_INVALID_VALUE, "bytes_per_second");
    EXPECT_ERROR(zf_host_stream_bandwidth(bad, 2, 4099, 1, 1, &bandwidth), ZF_ERROR_INVALID_VALUE,
                 "one stream read and one written");
    bad[1].dtype = ZF_DTYPE_I32;
    EXPECT_ERROR(zf_host_stream_bandwidth(bad, 2, 4099, 1, 1, &bandwidth), ZF_ERROR_INVALID_VALUE, "streams[1].dtype");
    bad[1].dtype = ZF_DTYPE_F32;
    bad[1].access = (zf_stream_access)5;
    EXPECT_ERROR(zf_host_stream_bandwidth(bad, 2, 4099, 1, 1, &bandwidth), ZF_ERROR_INVALID_VALUE, "streams[1].access");
    EXPECT(bandwidth == -1.0); /* untouched by every refusal */
  }
  threads = zf_get_num_threads();
  EXPECT(threads >= 1);
  EXPECT_OK(zf_set_num_threads(2, NULL, 0));
  EXPECT(zf_get_num_threads() == 2);
  {
    const int cores[1] = {0};
    EXPECT_OK(zf_set_num_threads(2, cores, 1));
  }
  EXPECT_ERROR(zf_set_num_threads(-3, NULL, 0), ZF_ERROR_INVALID_VALUE, "num_threads");
  EXPECT(zf_get_num_threads() == 2); /* a failed resize keeps the pool */
  EXPECT_OK(zf_set_num_threads(threads, NULL, 0));

  /* A parallel runtime: the pool's regions go to it, pinning is refused while it is set,
   * and NULL gives the regions back to zenflow's threads. */
  EXPECT(zf_parallel_runtime_is_set() == 0);
  EXPECT_OK(zf_set_parallel_runtime(&run_serially, &serial_runtime_regions));
  EXPECT(zf_parallel_runtime_is_set() == 1);
  EXPECT_OK(zf_set_num_threads(3, NULL, 0));
  EXPECT(zf_get_num_threads() == 3);
  {
    const int cores[1] = {0};
    EXPECT_ERROR(zf_set_num_threads(2, cores, 1), ZF_ERROR_INVALID_VALUE, "cores");
    EXPECT(zf_get_num_threads() == 3);
  }
  {
    static float p[1 << 16], m[1 << 16], v[1 << 16], g[1 << 16];
    const int n = 1 << 16;
    const int64_t step = 1;
    const double lr = 0.1, weight_decay = 0.0;
    const zf_adam_hparams hparams = ZF_ADAM_HPARAMS_DEFAULT;
    zf_tensor p_t = tensor_1d(p, ZF_DTYPE_F32, n), m_t = tensor_1d(m, ZF_DTYPE_F32, n),
              v_t = tensor_1d(v, ZF_DTYPE_F32, n), g_t = tensor_1d(g, ZF_DTYPE_F32, n);
    int i;
    for (i = 0; i < n; ++i) {
      p[i] = 1.0f;
      g[i] = (i % 2) ? 1.0f : -1.0f;
    }
    EXPECT_OK(zf_cpu_adamw_step(&p_t, &m_t, &v_t, &g_t, NULL, 1, &step, &lr, &weight_decay, &hparams, 1.0f, 0));
    EXPECT(serial_runtime_regions >= 1);
    /* Adam's first step moves every weight by lr against the sign of its gradient. */
    for (i = 0; i < n; ++i) {
      if (fabsf(p[i] - ((i % 2) ? 0.9f : 1.1f)) > 1e-6f) break;
    }
    EXPECT(i == n);
  }
  EXPECT_OK(zf_set_parallel_runtime(NULL, NULL));
  EXPECT(zf_parallel_runtime_is_set() == 0);
  EXPECT(zf_get_num_threads() == 3);
  EXPECT_OK(zf_set_num_threads(threads, NULL, 0));

  EXPECT(zf_cuda_compiled() == 0 || zf_cuda_compiled() == 1);
  EXPECT(zf_cuda_architectures() != NULL);
  EXPECT((zf_cuda_compiled() == 0) == (zf_cuda_architectures()[0] == '\0'));
  EXPECT(zf_cuda_build_note() != NULL);
  EXPECT((zf_cuda_compiled() == 0) == (zf_cuda_build_note()[0] != '\0')); /* a reason exactly without CUDA */
  EXPECT(zf_cuda_device_count() >= 0);
  EXPECT_ERROR(zf_cuda_device_name(0, NULL, 16), ZF_ERROR_INVALID_VALUE, "buf");
  EXPECT_ERROR(zf_cuda_device_name(0, name, 0), ZF_ERROR_INVALID_VALUE, "buf");
  EXPECT_ERROR(zf_cuda_device_name(zf_cuda_device_count(), name, sizeof(name)), ZF_ERROR_INVALID_VALUE, "index");
  EXPECT_ERROR(zf_cuda_device_name(-1, name, sizeof(name)), ZF_ERROR_INVALID_VALUE, "index");
  if (zf_cuda_device_count() > 0) {
    EXPECT_OK(zf_cuda_device_name(0, name, sizeof(name)));
    EXPECT(name[0] != '\0');
  }
}

/* ---- the ops: column statistics, top-k, pack/scatter, layouts ---- */
static void check_column_ops(void) {
  float grad[2 * 3] = {1, 2, 3, 4, 5, 6}, col_sq[3], total = -1, packed[4] = {-1, -1, -1, -1}, restored[6];
  int32_t flag = -1, picked[2] = {-1, -1}, selected = 1, bad_selected = 3;
  int64_t rows[2] = {2, 3}, cols[2] = {4, 5}, counts[2] = {1, 0}, offsets[3] = {-1, -1, -1};
  zf_tensor g = t2(grad, ZF_DTYPE_F32, 2, 3), out = tensor_1d(col_sq, ZF_DTYPE_F32, 3);
  zf_tensor total_t = tensor_1d(&total, ZF_DTYPE_F32, 1), flag_t = tensor_1d(&flag, ZF_DTYPE_I32, 1);
  zf_tensor picked_t = tensor_1d(picked, ZF_DTYPE_I32, 2), selected_t = tensor_1d(&selected, ZF_DTYPE_I32, 1);
  zf_tensor packed_t = tensor_1d(packed, ZF_DTYPE_F32, 4), restored_t = t2(restored, ZF_DTYPE_F32, 2, 3);
  zf_tensor bad;
  size_t workspace_bytes = 99;

  /* zf_column_stats: every failure leaves the outputs as they were. */
  col_sq[0] = col_sq[1] = col_sq[2] = -1.0f;
  EXPECT_ERROR(zf_column_stats(NULL, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE, "grads");
  EXPECT_ERROR(zf_column_stats(&g, &out, 1, NULL, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE, "total_sq");
  bad = g;
  bad.dtype = ZF_DTYPE_I64;
  bad.data = wide;
  EXPECT_ERROR(zf_column_stats(&bad, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_TYPE,
               "grads[0]");
  bad = g;
  bad.dtype = (zf_dtype)77; /* not a dtype at all */
  EXPECT_ERROR(zf_column_stats(&bad, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_TYPE,
               "grads[0]");
  bad = tensor_1d(col_sq, ZF_DTYPE_F32, 2); /* [2] for a matrix of 3 columns */
  EXPECT_ERROR(zf_column_stats(&g, &bad, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE,
               "out_col_sq[0]");
  bad = g;
  bad.ndim = ZF_MAX_DIMS + 1;
  EXPECT_ERROR(zf_column_stats(&bad, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE,
               "grads[0]");
  bad = g;
  bad.strides[0] = 1; /* not row-major */
  bad.strides[1] = 2;
  EXPECT_ERROR(zf_column_stats(&bad, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE,
               "grads[0]");
  bad = g;
  bad.shape[0] = -2;
  EXPECT_ERROR(zf_column_stats(&bad, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE,
               "grads[0]");
  bad = g;
  bad.data = NULL; /* elements but no data */
  EXPECT_ERROR(zf_column_stats(&bad, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE,
               "grads[0]");
  bad = g;
  bad.data = (char*)grad + 1; /* misaligned f32 */
  EXPECT_ERROR(zf_column_stats(&bad, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE,
               "grads[0]");
  bad = g;
  bad.device.type = (zf_device_type)5;
  EXPECT_ERROR(zf_column_stats(&bad, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL), ZF_ERROR_INVALID_TYPE,
               "grads[0]");
  EXPECT(col_sq[0] == -1.0f && total == -1.0f && flag == -1);
  EXPECT_OK(zf_column_stats(&g, &out, 1, &total_t, &flag_t, 0, NULL, &workspace_bytes, NULL));
  EXPECT(workspace_bytes == 0 && col_sq[0] == -1.0f); /* the query ran nothing */
  EXPECT_OK(zf_column_stats(&g, &out, 1, &total_t, &flag_t, ZF_COLUMN_STATS_ACCUMULATE, NULL, NULL, NULL));
  EXPECT(col_sq[0] == 16.0f && col_sq[1] == 28.0f && col_sq[2] == 44.0f); /* -1 + 17, -1 + 29, -1 + 45 */
  EXPECT_OK(zf_column_stats(&g, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL));
  EXPECT(col_sq[0] == 17.0f && col_sq[1] == 29.0f && col_sq[2] == 45.0f && total == 91.0f && flag == 0);

  /* The CUDA status codes: NOT_SUPPORTED without CUDA; with it, a device that does not
   * exist is a failed CUDA call. */
  bad = g;
  bad.device.type = ZF_DEVICE_CUDA;
  bad.device.index = zf_cuda_device_count() + 7;
  {
    zf_tensor cuda_out = out, cuda_total = total_t, cuda_flag = flag_t, cuda_packed = packed_t;
    zf_tensor cuda_selected = selected_t;
    cuda_out.device = cuda_total.device = cuda_flag.device = cuda_packed.device = cuda_selected.device = bad.device;
    if (zf_cuda_compiled()) {
      EXPECT_ERROR(zf_pack_columns(&bad, &cuda_selected, 1, &cuda_packed, NULL, NULL), ZF_ERROR_CUDA, "");
    } else {
      EXPECT_ERROR(zf_column_stats(&bad, &cuda_out, 1, &cuda_total, &cuda_flag, 0, NULL, NULL, NULL),
                   ZF_ERROR_NOT_SUPPORTED, "has no CUDA");
      EXPECT(strstr(zf_last_error(), zf_cuda_build_note()) != NULL); /* and says why */
    }
    EXPECT(packed[0] == -1.0f); /* the failed call wrote nothing */
  }
  /* Tensors of one call on two devices. */
  if (!zf_cuda_compiled()) {
    zf_tensor cuda_total = total_t;
    cuda_total.device.type = ZF_DEVICE_CUDA;
    EXPECT(zf_column_stats(&g, &out, 1, &cuda_total, &flag_t, 0, NULL, NULL, NULL) != ZF_SUCCESS);
  }

  /* zf_select_topk_columns */
  EXPECT_ERROR(zf_select_topk_columns(&out, NULL, 1, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE, "out_indices");
  bad = tensor_1d(wide, ZF_DTYPE_I64, 2);
  EXPECT_ERROR(zf_select_topk_columns(&out, &bad, 1, NULL, NULL, NULL), ZF_ERROR_INVALID_TYPE, "out_indices[0]");
  bad = tensor_1d(picked, ZF_DTYPE_I32, 4); /* k > n */
  EXPECT_ERROR(zf_select_topk_columns(&out, &bad, 1, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE, "out_indices[0]");
  col_sq[1] = NAN;
  EXPECT_ERROR(zf_select_topk_columns(&out, &picked_t, 1, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE, "NaN");
  EXPECT(picked[0] == -1);
  col_sq[1] = 29.0f;
  EXPECT_OK(zf_select_topk_columns(&out, &picked_t, 1, NULL, NULL, NULL));
  EXPECT(picked[0] == 1 && picked[1] == 2);

  /* zf_packed_layout: matrix 0 keeps 2 * (4 - 1) = 6 elements, matrix 1 all 15. */
  EXPECT_ERROR(zf_packed_layout(rows, cols, counts, 2, NULL), ZF_ERROR_INVALID_VALUE, "offsets");
  counts[1] = 6; /* more selected than columns */
  EXPECT_ERROR(zf_packed_layout(rows, cols, counts, 2, offsets), ZF_ERROR_INVALID_VALUE, "");
  EXPECT(offsets[0] == -1);
  counts[1] = 0;
  EXPECT_OK(zf_packed_layout(rows, cols, counts, 2, offsets));
  EXPECT(offsets[0] == 0 && offsets[1] == 6 && offsets[2] == 21);

  /* zf_pack_columns / zf_scatter_columns: columns 0 and 2 of [[1,2,3],[4,5,6]]. */
  packed[0] = packed[1] = packed[2] = packed[3] = -1.0f;
  EXPECT_ERROR(zf_pack_columns(&g, &selected_t, 1, NULL, NULL, NULL), ZF_ERROR_INVALID_VALUE, "packed");
  bad = tensor_1d(&bad_selected, ZF_DTYPE_I32, 1); /* column 3 of a 3-column matrix */
  EXPECT_ERROR(zf_pack_columns(&g, &bad, 1, &packed_t, NULL, NULL), ZF_ERROR_INVALID_VALUE, "selected[0]");
  bad = tensor_1d(packed, ZF_DTYPE_I32, 4);
  EXPECT_ERROR(zf_pack_columns(&g, &selected_t, 1, &bad, NULL, NULL), ZF_ERROR_INVALID_TYPE, "packed");
  bad = tensor_1d(packed, ZF_DTYPE_F32, 3);
  EXPECT_ERROR(zf_pack_columns(&g, &selected_t, 1, &bad, NULL, NULL), ZF_ERROR_INVALID_VALUE, "packed");
  EXPECT(all_equal(packed, 4, -1.0f));
  EXPECT_OK(zf_pack_columns(&g, &selected_t, 1, &packed_t, NULL, NULL));
  EXPECT(packed[0] == 1.0f && packed[1] == 4.0f && packed[2] == 3.0f && packed[3] == 6.0f);
  memset(restored, 0, sizeof(restored));
  EXPECT_ERROR(zf_scatter_columns(NULL, &restored_t, &selected_t, 1, NULL), ZF_ERROR_INVALID_VALUE, "packed");
  bad = t2(restored, ZF_DTYPE_I32, 2, 3);
  EXPECT_ERROR(zf_scatter_columns(&packed_t, &bad, &selected_t, 1, NULL), ZF_ERROR_INVALID_TYPE, "params[0]");
  bad = t2(restored, ZF_DTYPE_F32, 3, 2); /* 3 x (2 - 1) = 3 unselected elements, not 4 */
  EXPECT_ERROR(zf_scatter_columns(&packed_t, &bad, &selected_t, 1, NULL), ZF_ERROR_INVALID_VALUE, "packed");
  EXPECT(all_equal(restored, 6, 0.0f));
  EXPECT_OK(zf_scatter_columns(&packed_t, &restored_t, &selected_t, 1, NULL));
  EXPECT(restored[0] == 1.0f && restored[1] == 0.0f && restored[2] == 3.0f && restored[3] == 4.0f &&
         restored[4] == 0.0f && restored[5] == 6.0f);
}

/* ---- optimizer calls: the selected AdamW, the host AdamW, accumulate, column moves ---- */
static void check_optimizer_ops(void) {
  const double lr = 0.1, weight_decay = 0.0;
  const zf_adam_hparams hparams = ZF_ADAM_HPARAMS_DEFAULT;
  zf_adam_hparams bad_hparams = hparams;
  float weights[2 * 4] = {1, 1, 1, 1, 1, 1, 1, 1}, grads[2 * 4] = {1, -1, 1, -1, 1, -1, 1, -1};
  float m[2 * 2] = {0}, v[2 * 2] = {0};
  int32_t selected[2] = {1, 3}, steps[2] = {0, 0}, unsorted[2] = {3, 1};
  zf_tensor w_t = t2(weights, ZF_DTYPE_F32, 2, 4), g_t = t2(grads, ZF_DTYPE_F32, 2, 4);
  zf_tensor sel_t = tensor_1d(selected, ZF_DTYPE_I32, 2), bad;
  zf_column_state state;
  int i;

  state.master = empty_f32();
  state.exp_avg = t2(m, ZF_DTYPE_F32, 2, 2);
  state.exp_avg_sq = t2(v, ZF_DTYPE_F32, 2, 2);
  state.steps = tensor_1d(steps, ZF_DTYPE_I32, 2);
  EXPECT_ERROR(
      zf_adamw_selected_columns(&w_t, &g_t, &sel_t, &state, 1, &lr, &weight_decay, NULL, NULL, NULL, NULL, NULL),
      ZF_ERROR_INVALID_VALUE, "hparams");
  EXPECT_ERROR(
      zf_adamw_selected_columns(&w_t, &g_t, &sel_t, NULL, 1, &lr, &weight_decay, NULL, &hparams, NULL, NULL, NULL),
      ZF_ERROR_INVALID_VALUE, "state");
  bad = tensor_1d(unsorted, ZF_DTYPE_I32, 2);
  EXPECT_ERROR(
      zf_adamw_selected_columns(&w_t, &g_t, &bad, &state, 1, &lr, &weight_decay, NULL, &hparams, NULL, NULL, NULL),
      ZF_ERROR_INVALID_VALUE, "selected[0]");
  bad = t2(grads, ZF_DTYPE_I32, 2, 4);
  EXPECT_ERROR(
      zf_adamw_selected_columns(&w_t, &bad, &sel_t, &state, 1, &lr, &weight_decay, NULL, &hparams, NULL, NULL, NULL),
      ZF_ERROR_INVALID_TYPE, "grads[0]");
  bad = t2(grads, ZF_DTYPE_F32, 4, 2);
  EXPECT_ERROR(
      zf_adamw_selected_columns(&w_t, &bad, &sel_t, &state, 1, &lr, &weight_decay, NULL, &hparams, NULL, NULL, NULL),
      ZF_ERROR_INVALID_VALUE, "grads[0]");
  bad_hparams.mode = (zf_adam_mode)9;
  EXPECT_ERROR(zf_adamw_selected_columns(&w_t, &g_t, &sel_t, &state, 1, &lr, &weight_decay, NULL, &bad_hparams, NULL,
                                         NULL, NULL),
               ZF_ERROR_INVALID_VALUE, "mode");
  /* params and grads the same buffer: a written buffer overlapping a read one */
  EXPECT_ERROR(
      zf_adamw_selected_columns(&w_t, &w_t, &sel_t, &state, 1, &lr, &weight_decay, NULL, &hparams, NULL, NULL, NULL),
      ZF_ERROR_INVALID_VALUE, "overlap");
  EXPECT(all_equal(weights, 8, 1.0f) && steps[0] == 0 && steps[1] == 0);
  /* First Adam step from zero moments: each selected weight moves by lr against its gradient's sign. */
  EXPECT_OK(
      zf_adamw_selected_columns(&w_t, &g_t, &sel_t, &state, 1, &lr, &weight_decay, NULL, &hparams, NULL, NULL, NULL));
  for (i = 0; i < 8; ++i) {
    const int column = i % 4;
    const float expected = (column == 1 || column == 3) ? 1.1f : 1.0f; /* selected columns have g = -1 */
    EXPECT(fabsf(weights[i] - expected) < 1e-6f);
  }
  EXPECT(steps[0] == 1 && steps[1] == 1);

  /* Empty tensors whose other sizes are huge (found by the fuzzer): the element count is 0,
   * and a matrix view of 2^63 columns is refused, with no overflow on the way. */
  {
    zf_tensor empty = tensor_1d(NULL, ZF_DTYPE_F32, 0), huge_empty = tensor_1d(NULL, ZF_DTYPE_F32, 0);
    int64_t step = 1;
    huge_empty.ndim = 3;
    huge_empty.shape[0] = INT64_MAX;
    huge_empty.shape[1] = INT64_MAX;
    huge_empty.shape[2] = 0;
    EXPECT_OK(
        zf_cpu_adamw_step(&huge_empty, &empty, &empty, &empty, NULL, 1, &step, &lr, &weight_decay, &hparams, 1.0f, 0));
    huge_empty.shape[0] = 0;
    huge_empty.shape[1] = (int64_t)1 << 62;
    huge_empty.shape[2] = 2;
    EXPECT_ERROR(zf_adamw_selected_columns(&huge_empty, &huge_empty, NULL, &state, 1, &lr, &weight_decay, NULL,
                                           &hparams, NULL, NULL, NULL),
                 ZF_ERROR_INVALID_VALUE, "params[0]");
  }

  /* zf_cpu_adamw_step, zf_cpu_accumulate, zf_cpu_adamw_step_skip_columns: NULLs, dtypes, sizes. */
  {
    float p[3] = {1, 1, 1}, pm[3] = {0}, pv[3] = {0}, pg[3] = {2, -2, 2};
    int64_t step = 1;
    zf_tensor p_t = tensor_1d(p, ZF_DTYPE_F32, 3), m_t = tensor_1d(pm, ZF_DTYPE_F32, 3),
              v_t = tensor_1d(pv, ZF_DTYPE_F32, 3);
    zf_tensor pg_t = tensor_1d(pg, ZF_DTYPE_F32, 3);
    EXPECT_ERROR(zf_cpu_adamw_step(&p_t, &m_t, &v_t, &pg_t, NULL, 1, NULL, &lr, &weight_decay, &hparams, 1.0f, 0),
                 ZF_ERROR_INVALID_VALUE, "steps");
    bad = tensor_1d(pg, ZF_DTYPE_I32, 3);
    EXPECT_ERROR(zf_cpu_adamw_step(&p_t, &m_t, &v_t, &bad, NULL, 1, &step, &lr, &weight_decay, &hparams, 1.0f, 0),
                 ZF_ERROR_INVALID_TYPE, "grads[0]");
    bad = tensor_1d(pg, ZF_DTYPE_F32, 2);
    EXPECT_ERROR(zf_cpu_adamw_step(&p_t, &m_t, &v_t, &bad, NULL, 1, &step, &lr, &weight_decay, &hparams, 1.0f, 0),
                 ZF_ERROR_INVALID_VALUE, "grads[0]");
    EXPECT_ERROR(zf_cpu_adamw_step(&p_t, &m_t, &v_t, &pg_t, NULL, 1, &step, &lr, &weight_decay, &hparams, NAN, 0),
                 ZF_ERROR_INVALID_VALUE, "grad_scale");
    EXPECT(all_equal(p, 3, 1.0f));
    EXPECT_OK(zf_cpu_adamw_step(&p_t, &m_t, &v_t, &pg_t, NULL, 1, &step, &lr, &weight_decay, &hparams, 1.0f,
                                ZF_CPU_ADAMW_ZERO_GRAD));
    EXPECT(fabsf(p[0] - 0.9f) < 1e-6f && fabsf(p[1] - 1.1f) < 1e-6f && all_equal(pg, 3, 0.0f));

    /* zf_cpu_adamw_step_flat: two tensors' state in one buffer per field (a gap between
     * them is left alone); the same values as the per-tensor call above. */
    {
      float w0[3] = {1, 1, 1}, w1[1] = {1}, m[5] = {0}, v[5] = {0}, g0[3] = {2, -2, 2}, g1[1] = {-2};
      int64_t offsets[2] = {0, 4}, sizes[2] = {3, 1}, steps2[2] = {1, 1};
      double lrs[2] = {lr, lr}, wds[2] = {weight_decay, weight_decay};
      zf_tensor w_t[2], g_t[2];
      zf_tensor m_flat = tensor_1d(m, ZF_DTYPE_F32, 5), v_flat = tensor_1d(v, ZF_DTYPE_F32, 5);
      m[3] = 7.0f; /* the gap */
      w_t[0] = tensor_1d(w0, ZF_DTYPE_F32, 3);
      w_t[1] = tensor_1d(w1, ZF_DTYPE_F32, 1);
      g_t[0] = tensor_1d(g0, ZF_DTYPE_F32, 3);
      g_t[1] = tensor_1d(g1, ZF_DTYPE_F32, 1);
      EXPECT_ERROR(zf_cpu_adamw_step_flat(w_t, NULL, &m_flat, &v_flat, offsets, sizes, g_t, NULL, 2, NULL, lrs, wds,
                                          &hparams, 1.0f, 0),
                   ZF_ERROR_INVALID_VALUE, "steps");
      offsets[1] = 2; /* overlaps tensor 0's run */
      EXPECT_ERROR(zf_cpu_adamw_step_flat(w_t, NULL, &m_flat, &v_flat, offsets, sizes, g_t, NULL, 2, steps2, lrs, wds,
                                          &hparams, 1.0f, 0),
                   ZF_ERROR_INVALID_VALUE, "offsets[1]");
      EXPECT(all_equal(w0, 3, 1.0f) && w1[0] == 1.0f);
      offsets[1] = 4;
      EXPECT_OK(zf_cpu_adamw_step_flat(w_t, NULL, &m_flat, &v_flat, offsets, sizes, g_t, NULL, 2, steps2, lrs, wds,
                                       &hparams, 1.0f, 0));
      EXPECT(fabsf(w0[0] - 0.9f) < 1e-6f && fabsf(w0[1] - 1.1f) < 1e-6f && fabsf(w1[0] - 1.1f) < 1e-6f);
      EXPECT(m[3] == 7.0f && v[3] == 0.0f);
    }

    EXPECT_ERROR(zf_cpu_accumulate(NULL, NULL, 1, &pg_t, 1.0f), ZF_ERROR_INVALID_VALUE, "accumulators");
    bad = tensor_1d(pm, ZF_DTYPE_I32, 3);
    EXPECT_ERROR(zf_cpu_accumulate(&m_t, NULL, 1, &bad, 1.0f), ZF_ERROR_INVALID_TYPE, "packed");
    bad = tensor_1d(pg, ZF_DTYPE_F32, 4);
    EXPECT_ERROR(zf_cpu_accumulate(&m_t, NULL, 1, &bad, 1.0f), ZF_ERROR_INVALID_VALUE, "packed");
  }
  {
    /* host layout [n = 2, m = 1]: column 1 selected, column 0 updated */
    float master[2] = {1, 1}, hm[2] = {0}, hv[2] = {0}, acc[2] = {-3, 5};
    int32_t host_steps[2] = {0, 0}, one = 1;
    zf_column_state host;
    zf_tensor acc_t = t2(acc, ZF_DTYPE_F32, 2, 1), one_t = tensor_1d(&one, ZF_DTYPE_I32, 1);
    host.master = tensor_1d(master, ZF_DTYPE_F32, 2);
    host.exp_avg = t2(hm, ZF_DTYPE_F32, 2, 1);
    host.exp_avg_sq = tensor_1d(hv, ZF_DTYPE_F32, 2);
    host.steps = tensor_1d(host_steps, ZF_DTYPE_I32, 2);
    EXPECT_ERROR(zf_cpu_adamw_step_skip_columns(&host, &one_t, 1, NULL, NULL, NULL, &lr, &weight_decay, &hparams, 1.0f,
                                                ZF_CPU_ADAMW_INCREMENT_STEPS),
                 ZF_ERROR_INVALID_VALUE, "grads");
    bad = t2(wide, ZF_DTYPE_I64, 2, 1);
    EXPECT_ERROR(zf_cpu_adamw_step_skip_columns(&host, &one_t, 1, &bad, NULL, NULL, &lr, &weight_decay, &hparams, 1.0f,
                                                ZF_CPU_ADAMW_INCREMENT_STEPS),
                 ZF_ERROR_INVALID_TYPE, "grads[0]");
    bad = t2(acc, ZF_DTYPE_F32, 1, 1); /* 1 element for a [2, 1] state */
    EXPECT_ERROR(zf_cpu_adamw_step_skip_columns(&host, &one_t, 1, &bad, NULL, NULL, &lr, &weight_decay, &hparams, 1.0f,
                                                ZF_CPU_ADAMW_INCREMENT_STEPS),
                 ZF_ERROR_INVALID_VALUE, "grads[0]");
    EXPECT(master[0] == 1.0f && host_steps[0] == 0);
    EXPECT_OK(zf_cpu_adamw_step_skip_columns(&host, &one_t, 1, &acc_t, NULL, NULL, &lr, &weight_decay, &hparams, 1.0f,
                                             ZF_CPU_ADAMW_INCREMENT_STEPS));
    EXPECT(fabsf(master[0] - 1.1f) < 1e-6f && master[1] == 1.0f && host_steps[0] == 1 && host_steps[1] == 0);
  }

  /* zf_cpu_gather_columns / zf_cpu_scatter_columns: columns 1 and 3 of host state [n = 4, m = 2]. */
  {
    float hm[8] = {0, 1, 10, 11, 20, 21, 30, 31}, hv[8] = {0, 1, 2, 3, 4, 5, 6, 7}, om[4], ov[4];
    int32_t hsteps[4] = {5, 6, 7, 8}, osteps[2] = {-1, -1}, columns[2] = {1, 3}, bad_columns[2] = {1, 4};
    zf_column_state host, list;
    zf_tensor columns_t = tensor_1d(columns, ZF_DTYPE_I32, 2);
    host.master = empty_f32();
    host.exp_avg = t2(hm, ZF_DTYPE_F32, 4, 2);
    host.exp_avg_sq = tensor_1d(hv, ZF_DTYPE_F32, 8);
    host.steps = tensor_1d(hsteps, ZF_DTYPE_I32, 4);
    list.master = empty_f32();
    list.exp_avg = t2(om, ZF_DTYPE_F32, 2, 2);
    list.exp_avg_sq = t2(ov, ZF_DTYPE_F32, 2, 2);
    list.steps = tensor_1d(osteps, ZF_DTYPE_I32, 2);
    EXPECT_ERROR(zf_cpu_gather_columns(&host, &columns_t, 1, NULL), ZF_ERROR_INVALID_VALUE, "out");
    bad = tensor_1d(bad_columns, ZF_DTYPE_I32, 2);
    EXPECT_ERROR(zf_cpu_gather_columns(&host, &bad, 1, &list), ZF_ERROR_INVALID_VALUE, "columns[0]");
    bad = tensor_1d(wide, ZF_DTYPE_I64, 2);
    EXPECT_ERROR(zf_cpu_gather_columns(&host, &bad, 1, &list), ZF_ERROR_INVALID_TYPE, "columns[0]");
    EXPECT(osteps[0] == -1);
    EXPECT_OK(zf_cpu_gather_columns(&host, &columns_t, 1, &list));
    EXPECT(om[0] == 10 && om[1] == 11 && om[2] == 30 && om[3] == 31 && ov[2] == 6 && osteps[0] == 6 && osteps[1] == 8);
    om[0] = -5;
    osteps[1] = 42;
    EXPECT_ERROR(zf_cpu_scatter_columns(NULL, &columns_t, 1, &host), ZF_ERROR_INVALID_VALUE, "in");
    list.steps = tensor_1d(osteps, ZF_DTYPE_I32, 1);
    EXPECT_ERROR(zf_cpu_scatter_columns(&list, &columns_t, 1, &host), ZF_ERROR_INVALID_VALUE, "in[0]");
    list.steps = tensor_1d(osteps, ZF_DTYPE_I32, 2);
    EXPECT(hm[2] == 10);
    EXPECT_OK(zf_cpu_scatter_columns(&list, &columns_t, 1, &host));
    EXPECT(hm[2] == -5 && hsteps[3] == 42 && hsteps[0] == 5);
  }
}

/* ---- the selection exchange, per matrix and packed ---- */
static void check_exchange(void) {
  /* m = 2 rows; old selection {0, 1}, new {1, 2}: column 1 stays (old slot 1 -> new slot 0),
   * column 2 enters, column 0 leaves. */
  int32_t old_sel[2] = {0, 1}, new_sel[2] = {1, 2};
  float old_m[4] = {1, 2, 3, 4}, old_v[4] = {5, 6, 7, 8}, new_m[4], new_v[4];
  int32_t old_steps[2] = {10, 11}, new_steps[2] = {-1, -1};
  float enter_m[2] = {100, 101}, enter_v[2] = {200, 201}, leave_m[2], leave_v[2];
  int32_t enter_steps[1] = {50}, leave_steps[1] = {-1};
  int64_t enter_count = 1, leave_count = 1, wrong_count = 2;
  zf_tensor old_sel_t = tensor_1d(old_sel, ZF_DTYPE_I32, 2), new_sel_t = tensor_1d(new_sel, ZF_DTYPE_I32, 2);
  zf_column_state old_state, new_state, entering, leaving;
  int round;

  old_state.master = new_state.master = entering.master = leaving.master = empty_f32();
  old_state.exp_avg = t2(old_m, ZF_DTYPE_F32, 2, 2);
  old_state.exp_avg_sq = t2(old_v, ZF_DTYPE_F32, 2, 2);
  old_state.steps = tensor_1d(old_steps, ZF_DTYPE_I32, 2);
  new_state.exp_avg = t2(new_m, ZF_DTYPE_F32, 2, 2);
  new_state.exp_avg_sq = t2(new_v, ZF_DTYPE_F32, 2, 2);
  new_state.steps = tensor_1d(new_steps, ZF_DTYPE_I32, 2);
  entering.exp_avg = t2(enter_m, ZF_DTYPE_F32, 1, 2);
  entering.exp_avg_sq = t2(enter_v, ZF_DTYPE_F32, 1, 2);
  entering.steps = tensor_1d(enter_steps, ZF_DTYPE_I32, 1);
  leaving.exp_avg = t2(leave_m, ZF_DTYPE_F32, 1, 2);
  leaving.exp_avg_sq = t2(leave_v, ZF_DTYPE_F32, 1, 2);
  leaving.steps = tensor_1d(leave_steps, ZF_DTYPE_I32, 1);

  for (round = 0; round < 2; ++round) {
    const int packed = round == 1;
    zf_column_state bad_state = new_state;
    memset(new_m, 0, sizeof(new_m));
    memset(new_v, 0, sizeof(new_v));
    new_steps[0] = new_steps[1] = leave_steps[0] = -1;
    if (packed) {
      EXPECT_ERROR(zf_exchange_selected_columns_packed(&old_sel_t, &new_sel_t, &old_state, &new_state, NULL, &entering,
                                                       &leave_count, &leaving, 1, NULL, NULL, NULL),
                   ZF_ERROR_INVALID_VALUE, "NULL");
      EXPECT_ERROR(zf_exchange_selected_columns_packed(&old_sel_t, &new_sel_t, &old_state, &new_state, &wrong_count,
                                                       &entering, &leave_count, &leaving, 1, NULL, NULL, NULL),
                   ZF_ERROR_INVALID_VALUE, "entering");
      bad_state.steps = tensor_1d(new_steps, ZF_DTYPE_F32, 2);
      EXPECT_ERROR(zf_exchange_selected_columns_packed(&old_sel_t, &new_sel_t, &old_state, &bad_state, &enter_count,
                                                       &entering, &leave_count, &leaving, 1, NULL, NULL, NULL),
                   ZF_ERROR_INVALID_TYPE, "new_state[0]");
      EXPECT(new_steps[0] == -1 && leave_steps[0] == -1);
      EXPECT_OK(zf_exchange_selected_columns_packed(&old_sel_t, &new_sel_t, &old_state, &new_state, &enter_count,
                                                    &entering, &leave_count, &leaving, 1, NULL, NULL, NULL));
    } else {
      EXPECT_ERROR(zf_exchange_selected_columns(&old_sel_t, &new_sel_t, &old_state, &new_state, &entering, NULL, 1,
                                                NULL, NULL, NULL),
                   ZF_ERROR_INVALID_VALUE, "NULL");
      bad_state.exp_avg = t2(new_m, ZF_DTYPE_F32, 1, 4); /* [1, 4], not [m, k_new] = [2, 2] */
      EXPECT_ERROR(zf_exchange_selected_columns(&old_sel_t, &new_sel_t, &old_state, &bad_state, &entering, &leaving, 1,
                                                NULL, NULL, NULL),
                   ZF_ERROR_INVALID_VALUE, "new_state[0]");
      EXPECT(new_steps[0] == -1 && leave_steps[0] == -1);
      EXPECT_OK(zf_exchange_selected_columns(&old_sel_t, &new_sel_t, &old_state, &new_state, &entering, &leaving, 1,
                                             NULL, NULL, NULL));
    }
    /* new[r, 0] = old[r, 1]; new[r, 1] = entering[r]; leaving[r] = old[r, 0] */
    EXPECT(new_m[0] == 2 && new_m[1] == 100 && new_m[2] == 4 && new_m[3] == 101);
    EXPECT(new_v[0] == 6 && new_v[1] == 200 && new_v[2] == 8 && new_v[3] == 201);
    EXPECT(new_steps[0] == 11 && new_steps[1] == 50 && leave_steps[0] == 10);
    EXPECT(leave_m[0] == 1 && leave_m[1] == 3 && leave_v[0] == 5 && leave_v[1] == 7);
  }
}

/* ---- the engine ---- */
#define W_ROWS 3
#define W_COLS 5

typedef struct engine_fixture {
  float weight[W_ROWS * W_COLS], bias[W_COLS], weight_grad[W_ROWS * W_COLS], bias_grad[W_COLS];
  zf_tensor params[2], grads[2];
  int32_t param_groups[2];
  zf_engine_group group;
  zf_engine_config config;
} engine_fixture;

static void fixture_init(engine_fixture* f) {
  int i;
  for (i = 0; i < W_ROWS * W_COLS; ++i) {
    f->weight[i] = 1.0f;
    f->weight_grad[i] = (float)(i % W_COLS + 1) * 0.1f; /* column j has gradient (j + 1) / 10 */
  }
  for (i = 0; i < W_COLS; ++i) {
    f->bias[i] = 0.0f;
    f->bias_grad[i] = -1.0f;
  }
  f->params[0] = t2(f->weight, ZF_DTYPE_F32, W_ROWS, W_COLS);
  f->params[1] = tensor_1d(f->bias, ZF_DTYPE_F32, W_COLS);
  f->grads[0] = t2(f->weight_grad, ZF_DTYPE_F32, W_ROWS, W_COLS);
  f->grads[1] = tensor_1d(f->bias_grad, ZF_DTYPE_F32, W_COLS);
  f->param_groups[0] = f->param_groups[1] = 0;
  f->group.lr = 0.01;
  f->group.weight_decay = 0.0;
  f->group.dense = 0;
  f->config = zf_engine_config_default();
  f->config.topk_ratio = 0.4; /* k = 2 of 5 columns */
  f->config.update_interval = 2;
  f->config.compute_threads = 1;
  f->config.host_threads = 1;
  f->config.auto_warm_up_rounds = 0; /* windows from step 1 */
}

static zf_engine* fixture_engine(engine_fixture* f) {
  zf_engine* engine = NULL;
  EXPECT_OK(zf_engine_create(f->params, f->param_groups, 2, &f->group, 1, &f->config, &engine));
  return engine;
}

static void check_engine_create(void) {
  engine_fixture f;
  zf_engine* engine = (zf_engine*)&f; /* must stay untouched by every failed create */
  zf_engine* const sentinel = engine;
  zf_tensor bad_params[2];
  int32_t bad_groups[2] = {0, 3};
  zf_engine_group bad_group;
  zf_engine_config bad_config;
  fixture_init(&f);

  EXPECT_ERROR(zf_engine_create(f.params, f.param_groups, 2, &f.group, 1, &f.config, NULL), ZF_ERROR_INVALID_VALUE,
               "out");
  EXPECT_ERROR(zf_engine_create(f.params, f.param_groups, 2, &f.group, 1, NULL, &engine), ZF_ERROR_INVALID_VALUE,
               "config");
  EXPECT_ERROR(zf_engine_create(NULL, f.param_groups, 2, &f.group, 1, &f.config, &engine), ZF_ERROR_INVALID_VALUE,
               "params");
  EXPECT_ERROR(zf_engine_create(f.params, NULL, 2, &f.group, 1, &f.config, &engine), ZF_ERROR_INVALID_VALUE,
               "param_groups");
  EXPECT_ERROR(zf_engine_create(f.params, f.param_groups, 2, NULL, 1, &f.config, &engine), ZF_ERROR_INVALID_VALUE,
               "groups");
  EXPECT_ERROR(zf_engine_create(f.params, bad_groups, 2, &f.group, 1, &f.config, &engine), ZF_ERROR_INVALID_VALUE,
               "param_groups[1]");
  memcpy(bad_params, f.params, sizeof(bad_params));
  bad_params[0].dtype = ZF_DTYPE_I32;
  EXPECT_ERROR(zf_engine_create(bad_params, f.param_groups, 2, &f.group, 1, &f.config, &engine), ZF_ERROR_INVALID_TYPE,
               "params[0]");
  memcpy(bad_params, f.params, sizeof(bad_params));
  bad_params[0].strides[0] = 1; /* not contiguous */
  EXPECT_ERROR(zf_engine_create(bad_params, f.param_groups, 2, &f.group, 1, &f.config, &engine), ZF_ERROR_INVALID_VALUE,
               "params[0]");
  bad_group = f.group;
  bad_group.lr = NAN;
  EXPECT_ERROR(zf_engine_create(f.params, f.param_groups, 2, &bad_group, 1, &f.config, &engine), ZF_ERROR_INVALID_VALUE,
               "lr");
  bad_config = f.config;
  bad_config.topk_ratio = 1.5;
  EXPECT_ERROR(zf_engine_create(f.params, f.param_groups, 2, &f.group, 1, &bad_config, &engine), ZF_ERROR_INVALID_VALUE,
               "config.topk_ratio");
  bad_config = f.config;
  bad_config.master_weights = (zf_master_weights)2; /* found by the fuzzer: an enum C may hold */
  EXPECT_ERROR(zf_engine_create(f.params, f.param_groups, 2, &f.group, 1, &bad_config, &engine), ZF_ERROR_INVALID_VALUE,
               "config.master_weights");
  bad_config = f.config;
  bad_config.loss_scaling = (zf_loss_scaling)3;
  EXPECT_ERROR(zf_engine_create(f.params, f.param_groups, 2, &f.group, 1, &bad_config, &engine), ZF_ERROR_INVALID_VALUE,
               "config.loss_scaling");
  /* CUDA parameters: NOT_SUPPORTED without CUDA; with it, a device that does not exist. */
  memcpy(bad_params, f.params, sizeof(bad_params));
  bad_params[0].device.type = bad_params[1].device.type = ZF_DEVICE_CUDA;
  bad_params[0].device.index = bad_params[1].device.index = zf_cuda_device_count() + 7;
  if (zf_cuda_compiled()) {
    EXPECT(zf_engine_create(bad_params, f.param_groups, 2, &f.group, 1, &f.config, &engine) != ZF_SUCCESS);
  } else {
    EXPECT_ERROR(zf_engine_create(bad_params, f.param_groups, 2, &f.group, 1, &f.config, &engine),
                 ZF_ERROR_NOT_SUPPORTED, "CUDA");
  }
  /* OUT_OF_MEMORY: a [1, 2^45] f32 matrix (128 TiB) is a valid descriptor whose host state
   * no allocator can provide. Its data is never read: create only allocates. */
#ifndef ZF_TEST_SANITIZED
  memcpy(bad_params, f.params, sizeof(bad_params));
  bad_params[0] = t2(f.weight, ZF_DTYPE_F32, 1, (int64_t)1 << 45);
  EXPECT_ERROR(zf_engine_create(bad_params, f.param_groups, 1, &f.group, 1, &f.config, &engine), ZF_ERROR_OUT_OF_MEMORY,
               "");
#else
  printf("c_abi: OUT_OF_MEMORY check skipped under a sanitizer (its operator new cannot fail softly)\n");
#endif
  EXPECT(engine == sentinel);
  EXPECT(all_equal(f.weight, W_ROWS * W_COLS, 1.0f));
}

static void check_engine_calls(void) {
  engine_fixture f;
  zf_engine* engine;
  zf_engine_stats stats;
  zf_engine_state_entry entries[32];
  size_t count = 0, bytes = 1, i;
  double scale = 0.0, lrs[2] = {0.01, 0.02};
  zf_tensor bad_grads[2];
  float saved_weight[W_ROWS * W_COLS];
  int k;
  fixture_init(&f);
  engine = fixture_engine(&f);
  if (engine == NULL) return;

  /* device memory, stream, stats, loss scale */
  EXPECT_ERROR(zf_engine_device_memory_size(engine, NULL), ZF_ERROR_INVALID_VALUE, "bytes");
  EXPECT_OK(zf_engine_device_memory_size(engine, &bytes));
  EXPECT(bytes > 0);
  EXPECT_ERROR(zf_engine_attach_device_memory(engine, NULL, bytes), ZF_ERROR_INVALID_VALUE, "");
  {
    void* memory = NULL;
    size_t rounded = (bytes + 255) / 256 * 256;
    EXPECT(posix_memalign(&memory, 256, rounded) == 0 && memory != NULL);
    EXPECT_ERROR(zf_engine_attach_device_memory(engine, memory, bytes - 1), ZF_ERROR_INVALID_VALUE, "");
    EXPECT_ERROR(zf_engine_attach_device_memory(engine, (char*)memory + 1, bytes), ZF_ERROR_INVALID_VALUE, "");
    free(memory); /* the engine allocates its own at the first step */
  }
  EXPECT_OK(zf_engine_set_stream(engine, NULL));
  EXPECT_ERROR(zf_engine_set_stream(engine, (zf_stream)&f), ZF_ERROR_INVALID_VALUE, "stream");
  /* the per-device forms: CPU parameters are one device, number 0 */
  {
    size_t devices = 0, at_bytes = 0;
    zf_device device;
    EXPECT_ERROR(zf_engine_device_count(engine, NULL), ZF_ERROR_INVALID_VALUE, "count");
    EXPECT_OK(zf_engine_device_count(engine, &devices));
    EXPECT(devices == 1);
    EXPECT_ERROR(zf_engine_device_at(engine, 0, NULL, &at_bytes), ZF_ERROR_INVALID_VALUE, "device");
    EXPECT_ERROR(zf_engine_device_at(engine, 0, &device, NULL), ZF_ERROR_INVALID_VALUE, "memory_bytes");
    EXPECT_ERROR(zf_engine_device_at(engine, 1, &device, &at_bytes), ZF_ERROR_INVALID_VALUE, "device: 1");
    EXPECT_OK(zf_engine_device_at(engine, 0, &device, &at_bytes));
    EXPECT(device.type == ZF_DEVICE_CPU && at_bytes == bytes);
    EXPECT_ERROR(zf_engine_attach_device_memory_at(engine, 1, NULL, bytes), ZF_ERROR_INVALID_VALUE, "device: 1");
    EXPECT_ERROR(zf_engine_attach_device_memory_at(engine, 0, NULL, bytes), ZF_ERROR_INVALID_VALUE, "memory");
    EXPECT_ERROR(zf_engine_set_stream_at(engine, 3, NULL), ZF_ERROR_INVALID_VALUE, "device: 3");
    EXPECT_ERROR(zf_engine_set_stream_at(engine, 0, (zf_stream)&f), ZF_ERROR_INVALID_VALUE, "stream");
    EXPECT_OK(zf_engine_set_stream_at(engine, 0, NULL));
  }
  EXPECT_ERROR(zf_engine_get_stats(engine, NULL), ZF_ERROR_INVALID_VALUE, "stats");
  EXPECT_ERROR(zf_engine_loss_scale(engine, NULL), ZF_ERROR_INVALID_VALUE, "loss_scale");
  EXPECT_OK(zf_engine_loss_scale(engine, &scale));
  EXPECT(scale == 1.0);

  /* zf_engine_step: bad input changes nothing */
  memcpy(bad_grads, f.grads, sizeof(bad_grads));
  EXPECT_ERROR(zf_engine_step(engine, NULL, 2, NULL, 0), ZF_ERROR_INVALID_VALUE, "grads");
  EXPECT_ERROR(zf_engine_step(engine, f.grads, 1, NULL, 0), ZF_ERROR_INVALID_VALUE, "grads");
  EXPECT_ERROR(zf_engine_step(engine, f.grads, 2, lrs, 2), ZF_ERROR_INVALID_VALUE, "lr");
  bad_grads[1].dtype = ZF_DTYPE_BF16;
  EXPECT_ERROR(zf_engine_step(engine, bad_grads, 2, NULL, 0), ZF_ERROR_INVALID_TYPE, "grads[1]");
  memcpy(bad_grads, f.grads, sizeof(bad_grads));
  bad_grads[0] = t2(f.weight_grad, ZF_DTYPE_F32, W_COLS, W_ROWS);
  EXPECT_ERROR(zf_engine_step(engine, bad_grads, 2, NULL, 0), ZF_ERROR_INVALID_VALUE, "grads[0]");
  f.weight_grad[3] = INFINITY; /* non-finite without loss scaling: the step is skipped */
  EXPECT_ERROR(zf_engine_step(engine, f.grads, 2, NULL, 0), ZF_ERROR_INVALID_VALUE, "0");
  f.weight_grad[3] = 0.4f;
  EXPECT(all_equal(f.weight, W_ROWS * W_COLS, 1.0f) && all_equal(f.bias, W_COLS, 0.0f));
  EXPECT_OK(zf_engine_get_stats(engine, &stats));
  EXPECT(stats.steps == 0);

  /* Good steps: whole, then split; the selected columns (the two largest, 3 and 4) move at once. */
  EXPECT_OK(zf_engine_step(engine, f.grads, 2, lrs, 1));
  EXPECT(f.weight[3] < 1.0f && f.weight[4] < 1.0f && f.weight[0] == 1.0f && f.bias[0] > 0.0f);
  EXPECT_ERROR(zf_engine_submit(engine, 0, f.grads, 2), ZF_ERROR_INVALID_VALUE, "begin_step");
  EXPECT_ERROR(zf_engine_end_step(engine), ZF_ERROR_INVALID_VALUE, "begin_step");
  EXPECT_OK(zf_engine_abort_step(engine)); /* nothing open: nothing to do */
  EXPECT_ERROR(zf_engine_begin_step(engine, lrs, 2), ZF_ERROR_INVALID_VALUE, "lr");
  EXPECT_OK(zf_engine_begin_step(engine, NULL, 0));
  EXPECT_ERROR(zf_engine_step(engine, f.grads, 2, NULL, 0), ZF_ERROR_INVALID_VALUE, "");
  EXPECT_ERROR(zf_engine_submit(engine, 1, f.grads, 2), ZF_ERROR_INVALID_VALUE, "");
  EXPECT_ERROR(zf_engine_submit(engine, 0, NULL, 1), ZF_ERROR_INVALID_VALUE, "grads");
  EXPECT_OK(zf_engine_submit(engine, 1, f.grads + 1, 1));
  EXPECT_ERROR(zf_engine_submit(engine, 1, f.grads + 1, 1), ZF_ERROR_INVALID_VALUE, "");
  EXPECT_ERROR(zf_engine_end_step(engine), ZF_ERROR_INVALID_VALUE, "");
  EXPECT_OK(zf_engine_abort_step(engine)); /* forget the half-submitted step */
  memcpy(saved_weight, f.weight, sizeof(saved_weight));
  EXPECT_OK(zf_engine_begin_step(engine, NULL, 0));
  EXPECT_OK(zf_engine_submit(engine, 0, f.grads, 1));
  EXPECT_OK(zf_engine_submit(engine, 1, f.grads + 1, 1));
  EXPECT_OK(zf_engine_end_step(engine));
  EXPECT(f.weight[3] < saved_weight[3]);
  { /* per-step hyper-parameters: bad values are named and change nothing; good ones stick */
    const double decays[2] = {0.01, 0.02};
    EXPECT_ERROR(zf_engine_set_hyperparameters(NULL, 0.9, 0.999, 1e-8, NULL, 0), ZF_ERROR_INVALID_VALUE,
                 "engine: NULL");
    EXPECT_ERROR(zf_engine_set_hyperparameters(engine, 1.0, 0.999, 1e-8, NULL, 0), ZF_ERROR_INVALID_VALUE, "beta1");
    EXPECT_ERROR(zf_engine_set_hyperparameters(engine, 0.9, NAN, 1e-8, NULL, 0), ZF_ERROR_INVALID_VALUE, "beta2");
    EXPECT_ERROR(zf_engine_set_hyperparameters(engine, 0.9, 0.999, -1.0, NULL, 0), ZF_ERROR_INVALID_VALUE, "eps");
    EXPECT_ERROR(zf_engine_set_hyperparameters(engine, 0.9, 0.999, 1e-8, decays, 2), ZF_ERROR_INVALID_VALUE,
                 "weight_decays");
    EXPECT_OK(zf_engine_set_hyperparameters(engine, 0.8, 0.99, 1e-8, NULL, 0));
    EXPECT_OK(zf_engine_set_hyperparameters(engine, 0.9, 0.999, 1e-8, decays, 1));
  }
  { /* readiness: hooks mark, the end takes every gradient; the parameters are where they were */
    const void* data[2] = {f.weight, f.bias};
    const void* moved[2] = {f.bias, f.bias};
    EXPECT_ERROR(zf_engine_mark_ready(engine, 0, f.grads), ZF_ERROR_INVALID_VALUE, "begin_step");
    EXPECT_OK(zf_engine_begin_step(engine, NULL, 0));
    EXPECT_ERROR(zf_engine_mark_ready(engine, 2, f.grads), ZF_ERROR_INVALID_VALUE, "out of range");
    EXPECT_OK(zf_engine_mark_ready(engine, 1, f.grads + 1));
    EXPECT_ERROR(zf_engine_end_step_with(engine, f.grads, 1), ZF_ERROR_INVALID_VALUE, "grads");
    EXPECT_OK(zf_engine_end_step_with(engine, f.grads, 2));
    EXPECT_OK(zf_engine_check_params(engine, data, 2));
    EXPECT_ERROR(zf_engine_check_params(engine, moved, 2), ZF_ERROR_INVALID_VALUE, "params[0]");
  }
  for (k = 0; k < 4; ++k) EXPECT_OK(zf_engine_step(engine, f.grads, 2, NULL, 0));
  EXPECT_OK(zf_engine_flush(engine));
  EXPECT(f.weight[0] < 1.0f); /* deferred columns arrived from the host */
  EXPECT_OK(zf_engine_get_stats(engine, &stats));
  EXPECT(stats.steps == 7 && stats.windows >= 2 && stats.bytes_down > 0 && stats.bytes_up > 0);
  EXPECT(fabs(stats.selected_fraction - 0.4) < 1e-12);

  /* Checkpoint: layout query, save, a failed load, a good load. */
  for (k = ZF_STATE_MASTER; k <= ZF_STATE_ACCUMULATOR; ++k)
    EXPECT(strcmp(zf_engine_state_kind_name((zf_engine_state_kind)k), "unknown") != 0);
  EXPECT(strcmp(zf_engine_state_kind_name(ZF_STATE_EXP_AVG), "exp_avg") == 0);
  EXPECT(strcmp(zf_engine_state_kind_name((zf_engine_state_kind)99), "unknown") == 0);
  EXPECT_ERROR(zf_engine_state_layout(engine, NULL, NULL), ZF_ERROR_INVALID_VALUE, "count");
  EXPECT_OK(zf_engine_state_layout(engine, NULL, &count));
  EXPECT(count > 0 && count <= 32);
  if (count == 0 || count > 32) {
    zf_engine_destroy(engine);
    return;
  }
  {
    size_t too_few = count - 1;
    EXPECT_ERROR(zf_engine_state_layout(engine, entries, &too_few), ZF_ERROR_INVALID_VALUE, "count");
  }
  EXPECT_OK(zf_engine_state_layout(engine, entries, &count));
  { /* one parameter's entries, as the engine describes them: the same as in its layout */
    zf_engine_state_entry one[8];
    size_t n = 0, j;
    EXPECT_ERROR(zf_engine_param_state_layout(NULL, 0, NULL, &n), ZF_ERROR_INVALID_VALUE, "param");
    EXPECT_ERROR(zf_engine_param_state_layout(&f.params[0], 0, NULL, NULL), ZF_ERROR_INVALID_VALUE, "count");
    EXPECT_OK(zf_engine_param_state_layout(&f.params[0], 0, NULL, &n));
    EXPECT(n == 8);
    n = 7;
    EXPECT_ERROR(zf_engine_param_state_layout(&f.params[0], 0, one, &n), ZF_ERROR_INVALID_VALUE, "count");
    n = 8;
    EXPECT_OK(zf_engine_param_state_layout(&f.params[0], 0, one, &n));
    for (j = 0; j < n && j < count; ++j) { /* the weight comes first; it has stepped, so its
                                              selection ([2]) is the one entry that differs */
      EXPECT(one[j].kind == entries[j].kind && one[j].dtype == entries[j].dtype);
      if (one[j].kind != ZF_STATE_SELECTED) EXPECT(one[j].bytes == entries[j].bytes);
    }
    EXPECT_OK(zf_engine_param_state_layout(&f.params[0], 1, NULL, &n)); /* in a dense group */
    EXPECT(n == 4);
    EXPECT_OK(zf_engine_param_state_layout(&f.params[1], 0, NULL, &n)); /* a vector */
    EXPECT(n == 4);
  }
  {
    zf_tensor buffers[32];
    void* storage[32];
    int64_t counters[ZF_ENGINE_STATE_COUNTERS], bad_counters[ZF_ENGINE_STATE_COUNTERS];
    double saved_scale = 0.0;
    zf_engine_stats after;
    for (i = 0; i < count; ++i) {
      int d;
      storage[i] = calloc(entries[i].bytes + 1, 1);
      memset(&buffers[i], 0, sizeof(buffers[i]));
      buffers[i].data = storage[i];
      buffers[i].dtype = entries[i].dtype;
      buffers[i].device.type = ZF_DEVICE_CPU;
      buffers[i].ndim = entries[i].ndim;
      for (d = entries[i].ndim - 1; d >= 0; --d) {
        buffers[i].shape[d] = entries[i].shape[d];
        buffers[i].strides[d] = d == entries[i].ndim - 1 ? 1 : buffers[i].strides[d + 1] * entries[i].shape[d + 1];
      }
    }
    EXPECT_ERROR(zf_engine_save_state(engine, buffers, count, NULL, &saved_scale), ZF_ERROR_INVALID_VALUE, "counters");
    EXPECT_ERROR(zf_engine_save_state(engine, buffers, count - 1, counters, &saved_scale), ZF_ERROR_INVALID_VALUE,
                 "buffers");
    EXPECT_OK(zf_engine_save_state(engine, buffers, count, counters, &saved_scale));
    EXPECT(counters[ZF_COUNTER_STEP] == 7 && saved_scale == 1.0);
    /* A state of another model: the first entry with a wrong dtype, then a wrong shape. */
    buffers[0].dtype = ZF_DTYPE_F16;
    EXPECT(zf_engine_load_state(engine, buffers, count, counters, 1.0) != ZF_SUCCESS);
    buffers[0].dtype = entries[0].dtype;
    buffers[0].shape[0] += 1;
    EXPECT_ERROR(zf_engine_load_state(engine, buffers, count, counters, 1.0), ZF_ERROR_INVALID_VALUE, "");
    buffers[0].shape[0] -= 1;
    memcpy(bad_counters, counters, sizeof(counters));
    bad_counters[ZF_COUNTER_STEP] = -4;
    EXPECT(zf_engine_load_state(engine, buffers, count, bad_counters, 1.0) == ZF_ERROR_INVALID_VALUE);
    EXPECT_ERROR(zf_engine_load_state(engine, buffers, count, NULL, 1.0), ZF_ERROR_INVALID_VALUE, "counters");
    EXPECT_ERROR(zf_engine_load_state(engine, NULL, count, counters, 1.0), ZF_ERROR_INVALID_VALUE, "buffers");
    EXPECT_OK(zf_engine_get_stats(engine, &after));
    EXPECT(after.steps == 7);
    EXPECT_OK(zf_engine_load_state(engine, buffers, count, counters, 1.0));
    EXPECT_OK(zf_engine_step(engine, f.grads, 2, NULL, 0));
    EXPECT_OK(zf_engine_get_stats(engine, &after));
    EXPECT(after.steps == 8);
    for (i = 0; i < count; ++i) free(storage[i]);
  }
  EXPECT_OK(zf_engine_destroy(engine));
}

/* Every engine call on a handle that is not a live engine: destroyed, or never created. */
static void check_dead_handle(zf_engine* dead) {
  const char* text = "not a live engine";
  engine_fixture f;
  zf_engine_stats stats;
  zf_engine_state_entry entries[4];
  size_t bytes = 0, count = 4;
  double scale = 0.0;
  int64_t counters[ZF_ENGINE_STATE_COUNTERS] = {0};
  fixture_init(&f);
  EXPECT_ERROR(zf_engine_device_memory_size(dead, &bytes), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_attach_device_memory(dead, f.weight, sizeof(f.weight)), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_set_stream(dead, NULL), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_device_count(dead, &count), ZF_ERROR_INVALID_VALUE, text);
  {
    zf_device device;
    EXPECT_ERROR(zf_engine_device_at(dead, 0, &device, &bytes), ZF_ERROR_INVALID_VALUE, text);
  }
  EXPECT_ERROR(zf_engine_attach_device_memory_at(dead, 0, f.weight, sizeof(f.weight)), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_set_stream_at(dead, 0, NULL), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_set_collectives(dead, NULL), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_inject_host_lane_fault_for_testing(dead, "fault"), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_step(dead, f.grads, 2, NULL, 0), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_begin_step(dead, NULL, 0), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_submit(dead, 0, f.grads, 2), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_end_step(dead), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_abort_step(dead), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_flush(dead), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_set_hyperparameters(dead, 0.9, 0.999, 1e-8, NULL, 0), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_mark_ready(dead, 0, f.grads), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_end_step_with(dead, f.grads, 2), ZF_ERROR_INVALID_VALUE, text);
  {
    const void* data[2] = {f.weight, f.bias};
    EXPECT_ERROR(zf_engine_check_params(dead, data, 2), ZF_ERROR_INVALID_VALUE, text);
  }
  EXPECT_ERROR(zf_engine_get_stats(dead, &stats), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_loss_scale(dead, &scale), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_state_layout(dead, entries, &count), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_save_state(dead, f.grads, 0, counters, &scale), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_load_state(dead, f.grads, 0, counters, 1.0), ZF_ERROR_INVALID_VALUE, text);
  EXPECT_ERROR(zf_engine_destroy(dead), ZF_ERROR_INVALID_VALUE, text);
}

static void check_engine_lifetime(void) {
  engine_fixture f;
  zf_engine *engine, *other;
  uint64_t never_an_engine[64] = {0};
  fixture_init(&f);
  EXPECT_OK(zf_engine_destroy(NULL));
  EXPECT_ERROR(zf_engine_flush(NULL), ZF_ERROR_INVALID_VALUE, "engine: NULL");
  engine = fixture_engine(&f);
  other = fixture_engine(&f);
  if (engine == NULL || other == NULL) return;
  EXPECT_OK(zf_engine_step(engine, f.grads, 2, NULL, 0));
  EXPECT_OK(zf_engine_destroy(engine));
  check_dead_handle(engine); /* use after destroy and double destroy */
  check_dead_handle((zf_engine*)never_an_engine);
  EXPECT_OK(zf_engine_step(other, f.grads, 2, NULL, 0)); /* the other engine is unaffected */
  EXPECT_OK(zf_engine_destroy(other));
  check_dead_handle(other);
}

/* ---- zf_last_error is per thread ---- */
#define THREAD_ROUNDS 2000
static pthread_barrier_t barrier;

typedef struct thread_result {
  int which;
  int mismatches;
} thread_result;

static void* fail_repeatedly(void* arg) {
  thread_result* result = (thread_result*)arg;
  int64_t grad[2] = {0};
  float col_sq[2], total;
  int32_t flag;
  zf_tensor g = t2(grad, ZF_DTYPE_I64, 1, 2), out = tensor_1d(col_sq, ZF_DTYPE_F32, 2);
  zf_tensor total_t = tensor_1d(&total, ZF_DTYPE_F32, 1), flag_t = tensor_1d(&flag, ZF_DTYPE_I32, 1);
  int round;
  if (zf_last_error()[0] != '\0') ++result->mismatches; /* a new thread starts with no error */
  pthread_barrier_wait(&barrier);
  for (round = 0; round < THREAD_ROUNDS; ++round) {
    /* Thread 0 fails on a dtype, thread 1 on a thread count; each must read its own text. */
    if (result->which == 0) {
      if (zf_column_stats(&g, &out, 1, &total_t, &flag_t, 0, NULL, NULL, NULL) != ZF_ERROR_INVALID_TYPE ||
          strstr(zf_last_error(), "grads[0]") == NULL || strstr(zf_last_error(), "num_threads") != NULL)
        ++result->mismatches;
    } else {
      if (zf_set_num_threads(-1 - round, NULL, 0) != ZF_ERROR_INVALID_VALUE ||
          strstr(zf_last_error(), "num_threads") == NULL || strstr(zf_last_error(), "grads[0]") != NULL)
        ++result->mismatches;
    }
  }
  /* One thread's success does not clear the other's message. */
  pthread_barrier_wait(&barrier);
  if (result->which == 1) {
    if (zf_set_num_threads(1, NULL, 0) != ZF_SUCCESS) ++result->mismatches;
  }
  pthread_barrier_wait(&barrier);
  if (result->which == 0 && strstr(zf_last_error(), "grads[0]") == NULL) ++result->mismatches;
  return NULL;
}

static void check_thread_local_errors(void) {
  pthread_t threads[2];
  thread_result results[2] = {{0, 0}, {1, 0}};
  const int pool = zf_get_num_threads();
  int i;
  EXPECT(zf_set_num_threads(-5, NULL, 0) == ZF_ERROR_INVALID_VALUE);
  EXPECT(pthread_barrier_init(&barrier, NULL, 2) == 0);
  for (i = 0; i < 2; ++i) EXPECT(pthread_create(&threads[i], NULL, fail_repeatedly, &results[i]) == 0);
  for (i = 0; i < 2; ++i) EXPECT(pthread_join(threads[i], NULL) == 0);
  pthread_barrier_destroy(&barrier);
  EXPECT(results[0].mismatches == 0);
  EXPECT(results[1].mismatches == 0);
  /* The main thread's own message is still there. */
  EXPECT(strstr(zf_last_error(), "num_threads") != NULL);
  EXPECT_OK(zf_set_num_threads(pool, NULL, 0));
}

/* The configuration table (zf_engine_config_key_*): one entry per field, the defaults as engine.h
 * documents them, and every field's out-of-range value refused by create and check, naming the
 * field, with *out untouched. */
static void write_key(zf_engine_config* c, const zf_engine_config_key* k, double value) {
  char* p = (char*)c + k->offset;
  if (k->type == ZF_CONFIG_FLOAT) {
    memcpy(p, &value, sizeof(value));
  } else if (k->size == sizeof(int32_t)) {
    int32_t v = (int32_t)value;
    memcpy(p, &v, sizeof(v));
  } else {
    int64_t v = (int64_t)value;
    memcpy(p, &v, sizeof(v));
  }
}

static void check_engine_config_table(void) {
  const zf_engine_config d = zf_engine_config_default();
  zf_engine_config_key k;
  size_t i, count = zf_engine_config_key_count();
  size_t covered = 0, previous_end = 0;
  engine_fixture f;
  zf_engine* engine = (zf_engine*)&f;
  zf_engine* const sentinel = engine;
  fixture_init(&f);
  /* The documented defaults (engine.h), independent of the table that produces them. */
  EXPECT(d.topk_ratio == 0.1 && d.select_strategy == ZF_SELECT_AUTO && d.select_interval == 0);
  EXPECT(d.steps_per_epoch == 0 && d.update_interval == 4 && d.full_warm_up_rounds == 0 && d.overlap_step == 1);
  EXPECT(d.update_lag == 1);
  EXPECT(d.auto_ratio == 0.99 && d.pt_reserved_cores_perc == 0.5 && d.max_update_interval == 16);
  EXPECT(d.master_weights == ZF_MASTER_FP32 && d.selection_score == ZF_SCORE_STEP && d.max_grad_norm == 0.0);
  EXPECT(d.beta1 == 0.9 && d.beta2 == 0.999 && d.eps == 1e-8 && d.loss_scaling == ZF_LOSS_SCALING_NONE);
  EXPECT(d.initial_scale == 65536.0 && d.growth_factor == 2.0 && d.backoff_factor == 0.5);
  EXPECT(d.growth_interval == 2000 && d.bucket_bytes == ((size_t)64 << 20) && d.staging_slots == 4);
  EXPECT(d.compute_threads == 0 && d.host_threads == 0 && d.ranks_per_host == 1);
  EXPECT(d.hysteresis == 1 && d.consecutive_hysteresis == 0 && d.min_loss_scale == 0.0);
  EXPECT_OK(zf_engine_config_check(&d));
  EXPECT_ERROR(zf_engine_config_check(NULL), ZF_ERROR_INVALID_VALUE, "config");
  EXPECT_ERROR(zf_engine_config_key_at(count, &k), ZF_ERROR_INVALID_VALUE, "index");
  EXPECT_ERROR(zf_engine_config_key_at(0, NULL), ZF_ERROR_INVALID_VALUE, "out");
  for (i = 0; i < count; ++i) {
    zf_engine_config bad = f.config;
    char name[96];
    double value;
    EXPECT_OK(zf_engine_config_key_at(i, &k));
    EXPECT(k.name != NULL && k.meaning[0] != '\0' && k.range_text[0] != '\0' && k.default_text[0] != '\0');
    EXPECT(k.deepspeed_key != NULL && k.deepspeed_default != NULL && k.deepspeed_difference != NULL);
    EXPECT(k.offset + k.size <= sizeof(zf_engine_config));
    covered += k.size;
    /* a value out of range: every minimum is >= 0, so -1 is below it (and not a zero
     * sentinel); a bool of 2 and a choice past the last are unknown */
    value = k.type == ZF_CONFIG_BOOL ? 2 : k.type == ZF_CONFIG_CHOICE ? 7 : -1;
    EXPECT(k.type == ZF_CONFIG_BOOL || k.type == ZF_CONFIG_CHOICE || k.minimum >= 0);
    EXPECT(i == 0 || k.offset >= previous_end); /* field order, no overlap */
    previous_end = k.offset + k.size;
    write_key(&bad, &k, value);
    snprintf(name, sizeof(name), "config.%s", k.name);
    EXPECT_ERROR(zf_engine_config_check(&bad), ZF_ERROR_INVALID_VALUE, name);
    EXPECT_ERROR(zf_engine_create(f.params, f.param_groups, 2, &f.group, 1, &bad, &engine), ZF_ERROR_INVALID_VALUE,
                 name);
    /* and past a finite maximum (where the field can hold the value) */
    if ((k.type == ZF_CONFIG_FLOAT || k.type == ZF_CONFIG_INT) && k.maximum < 1e15 &&
        !(k.size == sizeof(int32_t) && k.maximum >= 2147483647.0)) {
      bad = f.config;
      write_key(&bad, &k, k.maximum_open ? k.maximum : k.maximum + 1);
      EXPECT_ERROR(zf_engine_config_check(&bad), ZF_ERROR_INVALID_VALUE, name);
    }
    EXPECT(engine == sentinel);
  }
  /* every field has its entry (the sizes add up to the fields' bytes: padding aside) */
  EXPECT(count == 33 && covered <= sizeof(zf_engine_config) && covered + 32 >= sizeof(zf_engine_config));
  /* the rules between fields: "auto" takes no interval; DeepSpeed's rules on top */
  f.config.select_interval = 4;
  EXPECT_ERROR(zf_engine_config_check(&f.config), ZF_ERROR_INVALID_VALUE, "config.select_interval");
  f.config.select_strategy = ZF_SELECT_STEP;
  f.config.select_interval = 1; /* shorter than update_interval 2: rounded up in the C API */
  EXPECT_OK(zf_engine_config_check(&f.config));
  EXPECT_ERROR(zf_engine_config_check_deepspeed(&f.config), ZF_ERROR_INVALID_VALUE, "config.select_interval");
  f.config.select_interval = 0; /* acts as auto in the C API; DeepSpeed needs an interval */
  EXPECT_OK(zf_engine_config_check(&f.config));
  EXPECT_ERROR(zf_engine_config_check_deepspeed(&f.config), ZF_ERROR_INVALID_VALUE, "config.select_interval");
  f.config.select_interval = 2;
  EXPECT_OK(zf_engine_config_check_deepspeed(&f.config));
  EXPECT_ERROR(zf_engine_config_check_deepspeed(NULL), ZF_ERROR_INVALID_VALUE, "config");
}

int main(void) {
  check_runtime_calls();
  check_column_ops();
  check_optimizer_ops();
  check_exchange();
  check_engine_create();
  check_engine_config_table();
  check_engine_calls();
  check_engine_lifetime();
  check_thread_local_errors();
  if (failures == 0) printf("c_abi: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
