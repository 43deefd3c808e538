/*
 * zenflow C ABI, the common part: version, status codes, error text, tensor descriptors and
 * runtime control. Every op-family header includes it; include "zenflow/zenflow.h" to get
 * everything.
 *
 * Pure C (C99 and later) so that any runtime can link libzenflow without C++, Python or
 * torch. Every function returns a zf_status; on failure, zf_last_error() holds a message
 * for the calling thread that names the offending argument. A failed call writes nothing
 * to its outputs. No function calls exit() or abort(), and no C++ exception escapes.
 *
 */
#ifndef ZENFLOW_TYPES_H_
#define ZENFLOW_TYPES_H_

#include <stddef.h>
#include <stdint.h>

#define ZENFLOW_VERSION_MAJOR 0
#define ZENFLOW_VERSION_MINOR 1
#define ZENFLOW_VERSION_PATCH 0
#define ZENFLOW_VERSION_STRING "0.1.0"
/* Encoded as MAJOR * 10000 + MINOR * 100 + PATCH, for preprocessor comparisons. */
#define ZENFLOW_VERSION (ZENFLOW_VERSION_MAJOR * 10000 + ZENFLOW_VERSION_MINOR * 100 + ZENFLOW_VERSION_PATCH)

#if defined(_WIN32)
#if defined(ZENFLOW_BUILDING_LIBRARY)
#define ZF_API __declspec(dllexport)
#else
#define ZF_API __declspec(dllimport)
#endif
#else
#define ZF_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status of every call. The Python layer maps INVALID_VALUE to ValueError and
 * INVALID_TYPE to TypeError. */
typedef enum zf_status {
  ZF_SUCCESS = 0,
  ZF_ERROR_INVALID_VALUE = 1, /* bad shape, stride, size, k, NaN, hyper-parameter */
  ZF_ERROR_INVALID_TYPE = 2,  /* wrong dtype or device */
  ZF_ERROR_NOT_SUPPORTED = 3, /* e.g. a CUDA tensor given to a build without CUDA */
  ZF_ERROR_CUDA = 4,          /* a CUDA runtime call failed */
  ZF_ERROR_OUT_OF_MEMORY = 5,
  ZF_ERROR_INTERNAL = 6
} zf_status;

typedef enum zf_dtype {
  ZF_DTYPE_F32 = 0,
  ZF_DTYPE_F16 = 1,
  ZF_DTYPE_BF16 = 2,
  ZF_DTYPE_I32 = 3,
  ZF_DTYPE_I64 = 4
} zf_dtype;

typedef enum zf_device_type { ZF_DEVICE_CPU = 0, ZF_DEVICE_CUDA = 1 } zf_device_type;

typedef struct zf_device {
  zf_device_type type;
  int32_t index; /* CUDA ordinal; 0 for the CPU */
} zf_device;

#define ZF_MAX_DIMS 8

/*
 * Non-owning view of a strided tensor. `data` points at element [0, ..., 0]; strides are
 * counted in elements, not bytes. The caller owns the memory and keeps it alive for the
 * duration of the call (and, for CUDA calls, until the work queued on the stream is done).
 * A tensor with zero elements may have data == NULL.
 */
typedef struct zf_tensor {
  void* data;
  zf_dtype dtype;
  zf_device device;
  int32_t ndim;
  int64_t shape[ZF_MAX_DIMS];
  int64_t strides[ZF_MAX_DIMS];
} zf_tensor;

/* A cudaStream_t for calls on CUDA tensors (NULL is the legacy default stream); ignored for
 * CPU tensors. */
typedef void* zf_stream;

/* ---- version and errors ---- */
ZF_API const char* zf_version(void);
/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
ZF_API const char* zf_last_error(void);
ZF_API const char* zf_status_string(zf_status status);
ZF_API const char* zf_dtype_name(zf_dtype dtype);
/* Size of one element in bytes, 0 for an unknown dtype. */
ZF_API size_t zf_dtype_size(zf_dtype dtype);

/* ---- CPU SIMD dispatch ---- */
typedef enum zf_simd_level {
  ZF_SIMD_SCALAR = 0, /* portable C++, any CPU */
  ZF_SIMD_AVX2 = 1,   /* x86-64 AVX2 + FMA + F16C */
  ZF_SIMD_AVX512 = 2  /* x86-64 AVX-512 F/BW/VL/DQ */
} zf_simd_level;

/* Highest level this CPU and OS support. */
ZF_API zf_simd_level zf_simd_level_supported(void);
/* Level in use. Chosen at load time: the supported level, lowered by the environment
 * variable ZENFLOW_SIMD=avx512|avx2|scalar when set. */
ZF_API zf_simd_level zf_simd_level_active(void);
/* "" when ZENFLOW_SIMD is unset or honoured as written; otherwise why it was not (an
 * unknown value, or a level above the supported one) and the level used instead. The
 * message is also printed once to stderr when the level is first chosen. */
ZF_API const char* zf_simd_environment_warning(void);
/* Force a level (for tests and benchmarks); fails with INVALID_VALUE above the supported
 * level or for a value that is not a level. Not to be called while another thread runs a
 * zenflow kernel. */
ZF_API zf_status zf_set_simd_level(zf_simd_level level);
/* "scalar", "avx2", "avx512", or "unknown" for any other value. */
ZF_API const char* zf_simd_level_name(zf_simd_level level);

/* ---- host thread pool ---- */
/*
 * zenflow's host kernels run on a pool of worker threads that zenflow owns (no OpenMP),
 * separate from the framework's intra-op threads, or on the framework's own parallel
 * runtime when the caller hands it over (zf_set_parallel_runtime below). This process-wide
 * pool runs the plain ops, which are synchronous: the calling thread waits inside them, and
 * with it the framework, so by default the pool has one thread per usable core. (Work that
 * overlaps the training loop, the engine's host lane, runs on pools of its own sized by the
 * pt_reserved_cores_perc split instead.) The calling thread takes part in every parallel
 * region, so a pool of size 1 has no extra thread. Results never depend on the thread count.
 */
/* Size of the pool, creating the default one on first use; if that fails (the OS refusing
 * a thread), returns 1 and leaves the reason in zf_last_error(). */
ZF_API int zf_get_num_threads(void);
/* Resize the pool. num_threads must be in [1, max(64, 4 * zf_host_cpu_count())]; more
 * fails with INVALID_VALUE (it could only oversubscribe the cores). cores: optional list of
 * `num_cores` CPU ids to pin worker i to cores[i % num_cores] (NULL for no pinning). Safe
 * while kernels run on other threads: they finish on the old pool, which is then released.
 * If the OS refuses a thread, fails with OUT_OF_MEMORY and the old pool stays in place. */
ZF_API zf_status zf_set_num_threads(int num_threads, const int* cores, int num_cores);
/* Logical CPUs usable by this process. */
ZF_API int zf_host_cpu_count(void);

/*
 * The host's streaming bandwidth for a pass of a given shape (since 0.1.0, 2026-12-06): the
 * roof that a host kernel of the same streams is measured against (benchmarks/
 * bench_host_lane.py compares the CPU AdamW's window update and accumulates with it). Each
 * stream is `elements` elements of `dtype` (F32: 4 bytes; BF16 or F16: 2 bytes), read
 * (ZF_STREAM_READ), written (ZF_STREAM_WRITE) or read and written in place
 * (ZF_STREAM_READ_WRITE). A pass reads every read stream and writes every written one, with
 * one add per read stream and element: memory traffic, almost no arithmetic. The call
 * allocates the streams as the engine allocates its host state (64-byte aligned; a stream of
 * 2 MiB or more starts on a 2 MiB boundary and, on Linux, is advised for transparent huge
 * pages) and first touches them on the pass's threads, runs one untimed and `repetitions`
 * timed passes on `threads` threads of its own for each of up to eight variants (vector by
 * vector across the streams or block by block; write-only streams stored plainly or
 * non-temporally, the non-temporal variants only when a stream is write-only; read streams
 * prefetched or not) at the active SIMD level, frees everything, and stores in
 * *bytes_per_second the bytes of one pass (a read-write stream counts twice) over the time of
 * the fastest. It takes the process's memory bandwidth while it runs; it reads and writes
 * nothing of the caller's.
 * INVALID_VALUE (nothing run): streams NULL, count 0 or > 16, no stream read or none
 * written, a bad dtype or access, elements < 1 or above 2^40, threads outside [1, max(64,
 * 4 x zf_host_cpu_count())], repetitions outside [1, 1000], bytes_per_second NULL;
 * OUT_OF_MEMORY when the streams cannot be allocated.
 */
typedef enum zf_stream_access { ZF_STREAM_READ = 0, ZF_STREAM_WRITE = 1, ZF_STREAM_READ_WRITE = 2 } zf_stream_access;
typedef struct zf_stream_spec {
  zf_dtype dtype;
  zf_stream_access access;
} zf_stream_spec;
ZF_API zf_status zf_host_stream_bandwidth(const zf_stream_spec* streams, size_t count, int64_t elements, int threads,
                                          int repetitions, double* bytes_per_second);

/*
 * Running the process-wide pool's regions on a parallel runtime the caller already has
 * (the framework's OpenMP team, say) instead of on zenflow's threads. The plain ops are
 * synchronous: while one runs, the framework's own intra-op threads have nothing to do, but
 * an OpenMP team keeps spinning for a while after each region and takes cores from a
 * second set of threads. Handing the regions to that team uses the threads that are there.
 *
 * zf_parallel_body: one thread's share of a region; never throws or jumps out.
 * zf_parallel_run: must call body(body_context, i, n) exactly once for each i in [0, n),
 * with the same n (1 <= n <= num_threads) in every call, on up to n threads, and return
 * only after every call has returned. An OpenMP runtime does this with
 *     #pragma omp parallel num_threads(num_threads)
 *     body(body_context, omp_get_thread_num(), omp_get_num_threads());
 * A team smaller than num_threads is fine: zenflow then runs several threads' shares on
 * one of its threads, and results never depend on the team size. A call that breaks the
 * contract (an index out of range, a missing or repeated index) fails the op with
 * ZF_ERROR_INTERNAL.
 *
 * zf_set_parallel_runtime(run, context): from now on the process-wide pool hands its
 * regions to run(context, ...), asking for zf_get_num_threads() threads; zenflow's own
 * workers of that pool are stopped. run = NULL goes back to zenflow's own threads, of the
 * same count. Kernels already running finish where they started. The engine's lanes are
 * not affected (they overlap the training loop and keep threads of their own). Pinning
 * (the cores of zf_set_num_threads) is the runtime's business: zf_set_num_threads with
 * cores fails with INVALID_VALUE while a runtime is set. A child process forked after this
 * call goes back to zenflow's own threads (a runtime's team is not assumed to survive a
 * fork). */
typedef void (*zf_parallel_body)(void* body_context, int thread_index, int thread_count);
typedef void (*zf_parallel_run)(void* runtime_context, zf_parallel_body body, void* body_context, int num_threads);
ZF_API zf_status zf_set_parallel_runtime(zf_parallel_run run, void* runtime_context);
/* 1 while a parallel runtime is set (in this process: 0 in a forked child), else 0. */
ZF_API int zf_parallel_runtime_is_set(void);

/* ---- CUDA ---- */
/* 1 if libzenflow was compiled with CUDA kernels. */
ZF_API int zf_cuda_compiled(void);
/* Comma-separated CUDA architectures compiled in ("" without CUDA). */
ZF_API const char* zf_cuda_architectures(void);
/* Why this build has no CUDA ("nvcc was not found when it was built", ...); "" with CUDA.
 * Static storage. Since 0.1.0 (2026-12-05). */
ZF_API const char* zf_cuda_build_note(void);
/* Number of usable CUDA devices; 0 without CUDA, without a driver, or on any error. */
ZF_API int zf_cuda_device_count(void);
/* Name of CUDA device `index` into buf (NUL-terminated, truncated to buf_size). */
ZF_API zf_status zf_cuda_device_name(int index, char* buf, size_t buf_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_TYPES_H_ */
