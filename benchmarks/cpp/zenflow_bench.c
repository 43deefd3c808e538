/*
 * zenflow_bench: the host ops of libzenflow against plain C loops doing the same work, in the
 * same process, interleaved round by round, beside the machine's memcpy bandwidth measured in
 * the same run. Installed with the C package (bin/zenflow_bench): it uses the public C ABI
 * only, so it measures the library a C, C++ or FFI user links.
 *
 *   zenflow_bench [--quick] [--json] [--elements N] [--rounds R] [--threads T]
 *
 * Cases: column_stats (bf16 and fp32 gradients) against a two-loop sum of squares per
 * column; the fp32 AdamW step (zf_cpu_adamw_step) against a scalar loop of torch's
 * arithmetic; pack_columns (bf16, 10% of columns selected) against a gather loop. The peers
 * are single-threaded, as a plain C loop is: the ratio says what the library's SIMD and
 * threads buy. Each row reports the median and the mean of the rounds, the ratio to the peer
 * (peer time / zenflow time, on the median), GB/s of the bytes the op must move, and the
 * fraction of memcpy's GB/s (read + write, as STREAM counts a copy).
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zenflow/zenflow.h"

#define MAX_ROUNDS 1000

typedef struct {
  const char* name;
  double seconds[MAX_ROUNDS];
  int count;
  double bytes; /* per call */
} candidate;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare_doubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median_of(const candidate* c) {
  double sorted[MAX_ROUNDS];
  memcpy(sorted, c->seconds, sizeof(double) * (size_t)c->count);
  qsort(sorted, (size_t)c->count, sizeof(double), compare_doubles);
  return c->count % 2 ? sorted[c->count / 2] : 0.5 * (sorted[c->count / 2 - 1] + sorted[c->count / 2]);
}

static double mean_of(const candidate* c) {
  double sum = 0.0;
  for (int i = 0; i < c->count; ++i) sum += c->seconds[i];
  return sum / c->count;
}

static void fail_on(zf_status status, const char* what) {
  if (status == ZF_SUCCESS) return;
  fprintf(stderr, "zenflow_bench: %s failed: %s\n", what, zf_last_error());
  exit(1);
}

static void* checked_malloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (p == NULL) {
    fprintf(stderr, "zenflow_bench: out of memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

static zf_tensor host_tensor(void* data, zf_dtype dtype, int ndim, const int64_t* shape) {
  zf_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.device.type = ZF_DEVICE_CPU;
  t.ndim = ndim;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}

/* bf16 <-> fp32 (round to nearest even; the inputs here are finite). */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

static uint32_t rng_state = 12345u;
static float next_uniform(void) { /* xorshift32, in [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

/* ---- the report ---- */

typedef struct {
  int json;
  int first_case;
  double copy_gbs;
} report;

static void report_case(report* r, const char* title, candidate* cands, int count) {
  const double peer = median_of(&cands[count - 1]);
  if (r->json) {
    printf("%s\n    {\"title\": \"%s\", \"rows\": [", r->first_case ? "" : ",", title);
    for (int i = 0; i < count; ++i) {
      const double med = median_of(&cands[i]), mean = mean_of(&cands[i]);
      const double gbs = cands[i].bytes / med / 1e9;
      printf(
          "%s\n      {\"name\": \"%s\", \"median_ms\": %.6f, \"mean_ms\": %.6f, \"speedup_vs_peer\": %.4f, "
          "\"gbs\": %.3f, \"fraction_of_copy\": %.4f}",
          i ? "," : "", cands[i].name, med * 1e3, mean * 1e3, peer / med, gbs, gbs / r->copy_gbs);
    }
    printf("]}");
  } else {
    printf("\n## %s\n\n| implementation | median ms | mean ms | vs peer | GB/s | %% of memcpy |\n", title);
    printf("|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < count; ++i) {
      const double med = median_of(&cands[i]), mean = mean_of(&cands[i]);
      const double gbs = cands[i].bytes / med / 1e9;
      printf("| %s | %.3f | %.3f | %.2fx | %.1f | %.0f%% |\n", cands[i].name, med * 1e3, mean * 1e3, peer / med, gbs,
             100.0 * gbs / r->copy_gbs);
    }
  }
  r->first_case = 0;
}

/* ---- the cases: each runs its candidates in turns, `rounds` times after one warm-up ---- */

typedef void (*runner)(void* context);

static void interleave(candidate* cands, runner* runs, void** contexts, int count, int rounds) {
  for (int round = 0; round <= rounds; ++round) {
    for (int i = 0; i < count; ++i) {
      const double start = now();
      runs[i](contexts[i]);
      const double elapsed = now() - start;
      if (round > 0) cands[i].seconds[cands[i].count++] = elapsed;
    }
  }
}

typedef struct {
  float *src, *dst;
  size_t n;
} copy_args;
static void run_memcpy(void* p) {
  copy_args* a = (copy_args*)p;
  memcpy(a->dst, a->src, a->n * sizeof(float));
}

static double measure_copy_gbs(size_t n, int rounds) {
  copy_args a = {checked_malloc(n * sizeof(float)), checked_malloc(n * sizeof(float)), n};
  for (size_t i = 0; i < n; ++i) a.src[i] = (float)i;
  candidate c = {"memcpy", {0}, 0, 2.0 * (double)n * sizeof(float)};
  runner r = run_memcpy;
  void* ctx = &a;
  interleave(&c, &r, &ctx, 1, rounds);
  free(a.src);
  free(a.dst);
  return c.bytes / median_of(&c) / 1e9;
}

/* column_stats: sums of squares per column of G [m, n] (row-major), their total, a flag. */
typedef struct {
  void* grad;
  zf_dtype dtype;
  int64_t m, n;
  float* col_sq;
  float total;
  int32_t flag;
} stats_args;

static void run_zf_column_stats(void* p) {
  stats_args* a = (stats_args*)p;
  const int64_t shape[2] = {a->m, a->n}, out_shape[1] = {a->n};
  const zf_tensor g = host_tensor(a->grad, a->dtype, 2, shape),
                  out = host_tensor(a->col_sq, ZF_DTYPE_F32, 1, out_shape);
  const zf_tensor total = host_tensor(&a->total, ZF_DTYPE_F32, 0, NULL);
  const zf_tensor flag = host_tensor(&a->flag, ZF_DTYPE_I32, 0, NULL);
  fail_on(zf_column_stats(&g, &out, 1, &total, &flag, 0, NULL, NULL, NULL), "zf_column_stats");
}

static void run_loop_column_stats(void* p) {
  stats_args* a = (stats_args*)p;
  for (int64_t j = 0; j < a->n; ++j) a->col_sq[j] = 0.0f;
  int nonfinite = 0;
  for (int64_t i = 0; i < a->m; ++i) {
    for (int64_t j = 0; j < a->n; ++j) {
      const float v = a->dtype == ZF_DTYPE_BF16 ? from_bf16(((const uint16_t*)a->grad)[i * a->n + j])
                                                : ((const float*)a->grad)[i * a->n + j];
      nonfinite |= !isfinite(v);
      a->col_sq[j] += v * v;
    }
  }
  float total = 0.0f;
  for (int64_t j = 0; j < a->n; ++j) total += a->col_sq[j];
  a->total = total;
  a->flag = nonfinite;
}

static void case_column_stats(report* r, size_t elements, int rounds, zf_dtype dtype) {
  const int64_t n = 4096, m = (int64_t)(elements / (size_t)n) > 0 ? (int64_t)(elements / (size_t)n) : 1;
  const size_t count = (size_t)(m * n), element = zf_dtype_size(dtype);
  void* grad = checked_malloc(count * element);
  for (size_t i = 0; i < count; ++i) {
    const float v = next_uniform();
    if (dtype == ZF_DTYPE_BF16) {
      ((uint16_t*)grad)[i] = to_bf16(v);
    } else {
      ((float*)grad)[i] = v;
    }
  }
  stats_args zf = {grad, dtype, m, n, checked_malloc((size_t)n * sizeof(float)), 0.0f, 0};
  stats_args peer = zf;
  peer.col_sq = checked_malloc((size_t)n * sizeof(float));
  candidate cands[2] = {{"zenflow zf_column_stats", {0}, 0, (double)(count * element)},
                        {"plain C loop (1 thread)", {0}, 0, (double)(count * element)}};
  runner runs[2] = {run_zf_column_stats, run_loop_column_stats};
  void* contexts[2] = {&zf, &peer};
  interleave(cands, runs, contexts, 2, rounds);
  char title[160];
  snprintf(title, sizeof(title), "column_stats, %s [%lld, %lld]", zf_dtype_name(dtype), (long long)m, (long long)n);
  report_case(r, title, cands, 2);
  free(grad);
  free(zf.col_sq);
  free(peer.col_sq);
}

/* The fp32 AdamW step: p, m, v updated in place from g (torch.optim.AdamW's arithmetic). */
typedef struct {
  float *p, *m, *v, *g;
  int64_t n, step;
} adamw_args;

static const double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWeightDecay = 1e-2;

static void run_zf_adamw(void* ptr) {
  adamw_args* a = (adamw_args*)ptr;
  const int64_t shape[1] = {a->n};
  const zf_tensor p = host_tensor(a->p, ZF_DTYPE_F32, 1, shape), m = host_tensor(a->m, ZF_DTYPE_F32, 1, shape);
  const zf_tensor v = host_tensor(a->v, ZF_DTYPE_F32, 1, shape), g = host_tensor(a->g, ZF_DTYPE_F32, 1, shape);
  const zf_adam_hparams hparams = ZF_ADAM_HPARAMS_DEFAULT;
  const int64_t step = ++a->step;
  fail_on(zf_cpu_adamw_step(&p, &m, &v, &g, NULL, 1, &step, &kLr, &kWeightDecay, &hparams, 1.0f, 0),
          "zf_cpu_adamw_step");
}

static void run_loop_adamw(void* ptr) {
  adamw_args* a = (adamw_args*)ptr;
  const int64_t step = ++a->step;
  const float bias1 = (float)(1.0 - pow(kBeta1, (double)step)), bias2 = (float)sqrt(1.0 - pow(kBeta2, (double)step));
  const float step_size = (float)kLr / bias1, decay = (float)(1.0 - kLr * kWeightDecay);
  for (int64_t i = 0; i < a->n; ++i) {
    const float g = a->g[i];
    a->p[i] *= decay;
    a->m[i] += (1.0f - (float)kBeta1) * (g - a->m[i]);
    a->v[i] = (float)kBeta2 * a->v[i] + (1.0f - (float)kBeta2) * g * g;
    a->p[i] -= step_size * a->m[i] / (sqrtf(a->v[i]) / bias2 + (float)kEps);
  }
}

static void case_adamw(report* r, size_t elements, int rounds) {
  adamw_args args[2];
  for (int c = 0; c < 2; ++c) {
    args[c].n = (int64_t)elements;
    args[c].step = 0;
    args[c].p = checked_malloc(elements * sizeof(float));
    args[c].m = checked_malloc(elements * sizeof(float));
    args[c].v = checked_malloc(elements * sizeof(float));
    args[c].g = checked_malloc(elements * sizeof(float));
    for (size_t i = 0; i < elements; ++i) {
      args[c].p[i] = next_uniform();
      args[c].m[i] = args[c].v[i] = 0.0f;
      args[c].g[i] = 1e-3f * next_uniform();
    }
  }
  const double bytes = 28.0 * (double)elements; /* read p, m, v, g; write p, m, v */
  candidate cands[2] = {{"zenflow zf_cpu_adamw_step", {0}, 0, bytes}, {"plain C loop (1 thread)", {0}, 0, bytes}};
  runner runs[2] = {run_zf_adamw, run_loop_adamw};
  void* contexts[2] = {&args[0], &args[1]};
  interleave(cands, runs, contexts, 2, rounds);
  char title[160];
  snprintf(title, sizeof(title), "AdamW step, fp32, %zu elements", elements);
  report_case(r, title, cands, 2);
  for (int c = 0; c < 2; ++c) {
    free(args[c].p);
    free(args[c].m);
    free(args[c].v);
    free(args[c].g);
  }
}

/* pack_columns: G[:, unselected] of a bf16 [m, n] matrix into a column-major buffer. */
typedef struct {
  uint16_t *grad, *packed;
  int32_t* selected;
  int64_t m, n, k;
} pack_args;

static void run_zf_pack(void* ptr) {
  pack_args* a = (pack_args*)ptr;
  const int64_t shape[2] = {a->m, a->n}, k_shape[1] = {a->k}, packed_shape[1] = {a->m * (a->n - a->k)};
  const zf_tensor g = host_tensor(a->grad, ZF_DTYPE_BF16, 2, shape),
                  s = host_tensor(a->selected, ZF_DTYPE_I32, 1, k_shape);
  const zf_tensor out = host_tensor(a->packed, ZF_DTYPE_BF16, 1, packed_shape);
  fail_on(zf_pack_columns(&g, &s, 1, &out, NULL, NULL), "zf_pack_columns");
}

static void run_loop_pack(void* ptr) {
  pack_args* a = (pack_args*)ptr;
  int64_t next = 0, column = 0;
  for (int64_t j = 0; j < a->n; ++j) {
    if (next < a->k && a->selected[next] == j) {
      ++next;
      continue;
    }
    for (int64_t i = 0; i < a->m; ++i) a->packed[column * a->m + i] = a->grad[i * a->n + j];
    ++column;
  }
}

static void case_pack(report* r, size_t elements, int rounds) {
  const int64_t n = 4096, m = (int64_t)(elements / (size_t)n) > 0 ? (int64_t)(elements / (size_t)n) : 1;
  const int64_t k = n / 10;
  pack_args a = {checked_malloc((size_t)(m * n) * 2),
                 checked_malloc((size_t)(m * (n - k)) * 2),
                 checked_malloc((size_t)k * sizeof(int32_t)),
                 m,
                 n,
                 k};
  for (int64_t i = 0; i < m * n; ++i) a.grad[i] = to_bf16(next_uniform());
  for (int64_t c = 0; c < k; ++c) a.selected[c] = (int32_t)(c * 10 + 3); /* every tenth column */
  pack_args peer = a;
  peer.packed = checked_malloc((size_t)(m * (n - k)) * 2);
  const double bytes = 4.0 * (double)(m * (n - k)); /* bf16 read + written */
  candidate cands[2] = {{"zenflow zf_pack_columns", {0}, 0, bytes}, {"plain C loop (1 thread)", {0}, 0, bytes}};
  runner runs[2] = {run_zf_pack, run_loop_pack};
  void* contexts[2] = {&a, &peer};
  interleave(cands, runs, contexts, 2, rounds);
  if (memcmp(a.packed, peer.packed, (size_t)(m * (n - k)) * 2) != 0) {
    fprintf(stderr, "zenflow_bench: zf_pack_columns and the C loop disagree\n");
    exit(1);
  }
  char title[160];
  snprintf(title, sizeof(title), "pack_columns, bf16 [%lld, %lld], %lld columns selected", (long long)m, (long long)n,
           (long long)k);
  report_case(r, title, cands, 2);
  free(a.grad);
  free(a.packed);
  free(a.selected);
  free(peer.packed);
}

static long parse_long(const char* text, const char* flag) {
  char* end = NULL;
  const double value = strtod(text, &end);
  if (end == text || *end != '\0' || value < 1 || value > 1e12) {
    fprintf(stderr, "zenflow_bench: %s: expected a positive number, got '%s'\n", flag, text);
    exit(2);
  }
  return (long)value;
}

int main(int argc, char** argv) {
  int quick = 0, json = 0, threads = 0;
  long elements = 0, rounds = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = 1;
    } else if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (i + 1 < argc && strcmp(argv[i], "--elements") == 0) {
      elements = parse_long(argv[++i], "--elements");
    } else if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0) {
      rounds = parse_long(argv[++i], "--rounds");
    } else if (i + 1 < argc && strcmp(argv[i], "--threads") == 0) {
      threads = (int)parse_long(argv[++i], "--threads");
    } else {
      fprintf(stderr, "usage: %s [--quick] [--json] [--elements N] [--rounds R] [--threads T]\n", argv[0]);
      return strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  if (elements == 0) elements = quick ? (1L << 20) : (16L << 20);
  if (rounds == 0) rounds = quick ? 5 : 15;
  if (rounds > MAX_ROUNDS - 1) rounds = MAX_ROUNDS - 1;
  if (threads > 0) fail_on(zf_set_num_threads(threads, NULL, 0), "zf_set_num_threads");

  report r = {json, 1, measure_copy_gbs((size_t)(quick ? (8L << 20) : (32L << 20)), quick ? 5 : 9)};
  if (json) {
    printf(
        "{\n  \"benchmark\": \"zenflow_bench (C ABI)\", \"zenflow\": \"%s\", \"simd\": \"%s\", \"threads\": %d, "
        "\"cpus\": %d, \"memcpy_gbs\": %.3f,\n  \"cases\": [",
        zf_version(), zf_simd_level_name(zf_simd_level_active()), zf_get_num_threads(), zf_host_cpu_count(),
        r.copy_gbs);
  } else {
    printf("# zenflow_bench: libzenflow %s against plain C loops\n\n", zf_version());
    printf(
        "SIMD %s, %d host threads of %d CPUs; memcpy %.1f GB/s in the same run (read + write). Every table is "
        "one interleaved run of %ld rounds; 'vs peer' = the loop's median / zenflow's median. memcpy is one "
        "thread; above 100%% of it, the working set fits in the caches (--elements larger).\n",
        zf_simd_level_name(zf_simd_level_active()), zf_get_num_threads(), zf_host_cpu_count(), r.copy_gbs, rounds);
  }
  case_column_stats(&r, (size_t)elements, (int)rounds, ZF_DTYPE_BF16);
  case_column_stats(&r, (size_t)elements, (int)rounds, ZF_DTYPE_F32);
  case_adamw(&r, (size_t)elements, (int)rounds);
  case_pack(&r, (size_t)elements, (int)rounds);
  if (json) printf("\n  ]\n}\n");
  return 0;
}
