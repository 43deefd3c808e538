/*
 * zf_set_parallel_runtime with a real OpenMP runtime, written as the header suggests: the
 * process-wide pool's regions run on the caller's OpenMP team. Checks that the team's
 * threads do the work, that the results are the bits of zenflow's own threads, and that an
 * op called from inside an OpenMP parallel region (a nested, one-thread team) works.
 * Plain C99 with OpenMP.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_test_util.h"
#include "zenflow/zenflow.h"

enum { kElements = 1 << 20, kSteps = 3 };

static int largest_team = 0;

static void run_on_openmp(void* context, zf_parallel_body body, void* body_context, int num_threads) {
  (void)context;
#pragma omp parallel num_threads(num_threads)
  {
#pragma omp single
    {
      if (omp_get_num_threads() > largest_team) largest_team = omp_get_num_threads();
    }
    body(body_context, omp_get_thread_num(), omp_get_num_threads());
  }
}

/* kSteps AdamW steps on kElements fp32 weights from a fixed pseudo-random start. */
static void adamw_steps(float* p, float* m, float* v, float* g) {
  const double lr = 1e-3, weight_decay = 1e-2;
  const zf_adam_hparams hparams = ZF_ADAM_HPARAMS_DEFAULT;
  zf_tensor p_t = tensor_1d(p, ZF_DTYPE_F32, kElements), m_t = tensor_1d(m, ZF_DTYPE_F32, kElements),
            v_t = tensor_1d(v, ZF_DTYPE_F32, kElements), g_t = tensor_1d(g, ZF_DTYPE_F32, kElements);
  uint32_t state = 12345u;
  int64_t step;
  int i;
  for (i = 0; i < kElements; ++i) {
    state = state * 1664525u + 1013904223u;
    p[i] = (float)(state >> 8) / 16777216.0f - 0.5f;
    m[i] = 0.0f;
    v[i] = 0.0f;
  }
  for (step = 1; step <= kSteps; ++step) {
    for (i = 0; i < kElements; ++i) {
      state = state * 1664525u + 1013904223u;
      g[i] = (float)(state >> 8) / 16777216.0f - 0.5f;
    }
    EXPECT_OK(zf_cpu_adamw_step(&p_t, &m_t, &v_t, &g_t, NULL, 1, &step, &lr, &weight_decay, &hparams, 1.0f, 0));
  }
}

int main(void) {
  float* own = malloc(sizeof(float) * kElements * 4);
  float* team = malloc(sizeof(float) * kElements * 4);
  int nested_ok = 1;
  if (own == NULL || team == NULL) return 2;
  omp_set_num_threads(2); /* a team of 2 even on one core: the threads must exist */
  EXPECT_OK(zf_set_num_threads(2, NULL, 0));
  adamw_steps(own, own + kElements, own + 2 * kElements, own + 3 * kElements);

  EXPECT_OK(zf_set_parallel_runtime(&run_on_openmp, NULL));
  EXPECT(zf_parallel_runtime_is_set() == 1);
  adamw_steps(team, team + kElements, team + 2 * kElements, team + 3 * kElements);
  EXPECT(largest_team == 2); /* the OpenMP team ran the regions */
  EXPECT(memcmp(own, team, sizeof(float) * kElements * 3) == 0);

  /* From inside an OpenMP region the nested team has one thread: the op still completes. */
#pragma omp parallel num_threads(2)
  {
#pragma omp master
    {
      static float p[4096], m[4096], v[4096], g[4096];
      const int64_t step = 1;
      const double lr = 0.1, weight_decay = 0.0;
      const zf_adam_hparams hparams = ZF_ADAM_HPARAMS_DEFAULT;
      zf_tensor p_t = tensor_1d(p, ZF_DTYPE_F32, 4096), m_t = tensor_1d(m, ZF_DTYPE_F32, 4096),
                v_t = tensor_1d(v, ZF_DTYPE_F32, 4096), g_t = tensor_1d(g, ZF_DTYPE_F32, 4096);
      int i;
      for (i = 0; i < 4096; ++i) {
        p[i] = 1.0f;
        g[i] = 1.0f;
      }
      if (zf_cpu_adamw_step(&p_t, &m_t, &v_t, &g_t, NULL, 1, &step, &lr, &weight_decay, &hparams, 1.0f, 0) !=
              ZF_SUCCESS ||
          fabsf(p[4095] - 0.9f) > 1e-6f) {
        nested_ok = 0;
      }
    }
  }
  EXPECT(nested_ok);
  EXPECT_OK(zf_set_parallel_runtime(NULL, NULL));
  free(own);
  free(team);
  if (failures != 0) {
    fprintf(stderr, "c_openmp_runtime: %d check(s) failed\n", failures);
    return 1;
  }
  printf("c_openmp_runtime: all checks passed\n");
  return 0;
}
