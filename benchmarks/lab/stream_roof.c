/*
 * The bandwidth roof for the CPU optimizer benchmark: an Adam-shaped streaming loop that
 * reads four fp32 arrays and writes three (28 bytes per element, like an fp32 AdamW step)
 * with trivial arithmetic, on `threads` threads splitting [0, n) into contiguous ranges.
 * Built at benchmark time with the system C compiler (-O3 -march=native: this is a lab
 * measurement of this machine, not library code) and called through ctypes.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>

typedef struct {
  float* p;
  float* m;
  float* v;
  const float* g;
  int64_t begin, end;
} roof_range;

static void* roof_worker(void* arg) {
  const roof_range* r = (const roof_range*)arg;
  float* restrict p = r->p;
  float* restrict m = r->m;
  float* restrict v = r->v;
  const float* restrict g = r->g;
  for (int64_t i = r->begin; i < r->end; ++i) {
    const float gi = g[i];
    m[i] = 0.9f * m[i] + gi;
    v[i] = 0.999f * v[i] + gi * gi;
    p[i] = p[i] - 1e-3f * m[i];
  }
  return 0;
}

/* Runs one pass; the calling thread takes the first range. Each worker is started pinned
 * to an allowed CPU other than the caller's, so a fresh thread does not begin its range
 * queued behind the caller on the same core (which would understate the roof). Returns 0
 * on success. */
int adam_shaped_stream(float* p, float* m, float* v, const float* g, int64_t n, int threads) {
  enum { kMaxThreads = 256 };
  pthread_t ids[kMaxThreads];
  roof_range ranges[kMaxThreads];
  if (threads < 1) threads = 1;
  if (threads > kMaxThreads) threads = kMaxThreads;
  for (int t = 0; t < threads; ++t) {
    ranges[t].p = p;
    ranges[t].m = m;
    ranges[t].v = v;
    ranges[t].g = g;
    ranges[t].begin = n * t / threads;
    ranges[t].end = n * (t + 1) / threads;
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);
  const int caller_cpu = sched_getcpu();
  int next_cpu = 0;
  for (int t = 1; t < threads; ++t) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    for (int tries = 0; tries < CPU_SETSIZE; ++tries, next_cpu = (next_cpu + 1) % CPU_SETSIZE) {
      if (CPU_ISSET(next_cpu, &allowed) && next_cpu != caller_cpu) break;
    }
    if (CPU_ISSET(next_cpu, &allowed) && next_cpu != caller_cpu) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(next_cpu, &one);
      pthread_attr_setaffinity_np(&attr, sizeof(one), &one);
      next_cpu = (next_cpu + 1) % CPU_SETSIZE;
    }
    const int failed = pthread_create(&ids[t], &attr, roof_worker, &ranges[t]);
    pthread_attr_destroy(&attr);
    if (failed) return 1;
  }
  roof_worker(&ranges[0]);
  for (int t = 1; t < threads; ++t) pthread_join(ids[t], 0);
  return 0;
}
