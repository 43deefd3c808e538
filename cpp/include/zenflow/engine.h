/*
 * The zenflow engine (docs/design.md sections 2, 3 and 7): the whole stall-free pipeline as
 * one object. Each step, the top-k gradient columns of every matrix are updated in place
 * with AdamW (the "device" side), the other columns' gradients are packed, copied to the
 * host and accumulated there, and every update_interval steps a host AdamW updates those
 * columns in the background; the result is uploaded one window later (overlap on) or at
 * once (overlap off).
 *
 * Backends. The parameters' device chooses it: all parameters are CPU tensors, or all are
 * CUDA tensors (on one device, or on several: see "Several devices" below).
 *  - Host backend (CPU tensors): the "device" ops run on the calling thread (on a compute
 *    pool of the engine's), copies are memcpy, every call is complete when it returns.
 *  - CUDA backend (CUDA tensors, in a build with CUDA): the device ops run on the compute
 *    stream (zf_engine_set_stream; the caller's), copies down and up on two streams of the
 *    engine's, ordered by CUDA events; the host lane waits for a slot's copy with an event.
 *    The staging ring, the upload copies U and the scalar records are page-locked; the fp32
 *    host state and the accumulators are ordinary memory. The calls return without waiting
 *    for the device, except: a window close whose host update is still running, a staging
 *    slot the host has not consumed (back-pressure), flush / selection / save / load, and,
 *    with dynamic loss scaling, update_interval "auto" or selection_score "window", the
 *    step's statistics (stats().stall_seconds_readback). Without loss scaling, a non-finite
 *    gradient is found after its step, when its scalars reach the host: the step wrote
 *    nothing, and the first call that finds its scalars copied fails with a sticky error.
 *    That is the next call when the device has finished the step by then, and at the
 *    latest the 8th step call after it (the ring of scalar records is then full and the
 *    call waits), or any flush, selection, save or load (they wait). Steps in between run
 *    as usual. A failed CUDA call is a sticky error with the CUDA error text. Calls on a
 *    stream that is capturing a CUDA graph fail with ZF_ERROR_NOT_SUPPORTED and change
 *    nothing (capture the forward and backward passes, not the step). The host lane's
 *    thread selects the engine's device once and uses the thread-local capture mode, so its
 *    waits never disturb a graph captured on another thread; no call creates a CUDA
 *    context on a device other than the engine's.
 *    Results are bitwise those of the host backend for the same inputs.
 *
 * Parameters. Each parameter is a contiguous tensor (f32, bf16 or f16) updated in place;
 * the caller keeps it alive, at the same address, until zf_engine_destroy. A parameter
 * with ndim >= 2 whose group is not dense is a "matrix", viewed as [m, n] (m = shape[0],
 * n = the product of the rest); everything else is "dense" (plain AdamW every step).
 * k = 0 if topk_ratio == 0, else min(n, max(1, floor(topk_ratio * n))) per matrix.
 *
 * Threads. An engine is driven by one thread at a time (the training thread); calls on one
 * engine from several threads at once are not supported. It owns two pools: the compute
 * lane (the host twins of the device ops, on the calling thread plus workers) and the
 * host lane (one driver thread and a pool for accumulates and window updates), sized by
 * pt_reserved_cores_perc unless given. The lanes share no lock on the hot path.
 *
 * Determinism. For fixed inputs and configuration, results are bitwise identical across
 * runs, across pool sizes, and between zf_engine_step and the split form.
 *
 * Errors. Every function returns a zf_status; zf_last_error() explains a failure. Bad
 * input (a gradient of the wrong shape or dtype, say) changes nothing. A failure on the
 * host lane is raised by the next call with its original message and is sticky: steps and
 * flushes then fail until the engine loads a state or is destroyed. A non-finite gradient
 * with loss_scaling NONE skips the step everywhere and fails with INVALID_VALUE naming the
 * parameter index; that error is not sticky.
 */
#ifndef ZENFLOW_ENGINE_H_
#define ZENFLOW_ENGINE_H_

#include "zenflow/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zf_engine zf_engine; /* opaque */

typedef enum zf_select_strategy {
  ZF_SELECT_AUTO = 0, /* once per epoch (steps_per_epoch > 0), else once at window 1; select_interval
                       * must be 0 (since 0.1.0: an interval was ignored; DeepSpeed refuses it) */
  ZF_SELECT_STEP = 1, /* every select_interval steps, rounded up to whole windows */
  ZF_SELECT_EPOCH = 2 /* every select_interval * steps_per_epoch steps */
} zf_select_strategy;

typedef enum zf_selection_score {
  ZF_SCORE_STEP = 0,  /* column sums of squares of the selection step's raw gradient */
  ZF_SCORE_WINDOW = 1 /* the same summed over the previous window */
} zf_selection_score;

typedef enum zf_master_weights {
  ZF_MASTER_FP32 = 0, /* bf16/fp16 parameters keep an fp32 master of their selected columns */
  ZF_MASTER_NONE = 1  /* the parameter is its own master on the device */
} zf_master_weights;

typedef enum zf_loss_scaling {
  ZF_LOSS_SCALING_NONE = 0,   /* loss scale 1; a non-finite gradient is an error */
  ZF_LOSS_SCALING_DYNAMIC = 1 /* torch.amp.GradScaler's rule; overflow steps are skipped */
} zf_loss_scaling;

/* How a window's host update steps its deferred columns (since 0.1.0, 2026-12-06). A window
 * of S steps gives each deferred column one Adam update with the mean of its S gradients,
 * where AdamW would have taken S steps. */
typedef enum zf_window_scaling {
  ZF_WINDOW_SCALING_NONE = 0,  /* one plain Adam step: the closing step's lr, betas and weight
                                * decay, the step count + 1 (DeepSpeed's ZenFlow) */
  ZF_WINDOW_SCALING_SQRT = 1,  /* the update stands for the window's S steps: lr * sqrt(S), the
                                * moments decay by beta^S, the step count + S (the bias
                                * corrections count steps), AdamW's decay of S steps (lr * wd * S
                                * in all) -- Adam's square-root rule for a batch S times larger */
  ZF_WINDOW_SCALING_LINEAR = 2 /* the same with lr * S */
} zf_window_scaling;

/*
 * Configuration. Start from zf_engine_config_default() and change fields.
 */
typedef struct zf_engine_config {
  double topk_ratio;                  /* 0.1, in [0, 1] */
  zf_select_strategy select_strategy; /* AUTO */
  int64_t select_interval;            /* 0 = "auto" (strategy step then acts as auto); else > 0 */
  int64_t steps_per_epoch;            /* 0 = unknown; >= 0 (required > 0 for EPOCH) */
  int64_t update_interval;            /* 4; 0 = "auto" (adaptive window, see below) */
  int64_t full_warm_up_rounds;        /* 0, >= 0 */
  int32_t overlap_step;               /* 1: window w's host update is applied at the close of w+1 */
  double auto_ratio;                  /* 0.99, in (0, 1]: share of due matrices that closes an auto window */
  double pt_reserved_cores_perc;      /* 0.5, in [0, 1]: share of cores left to the framework */
  int64_t max_update_interval;        /* 16, >= 1: the longest auto window */
  zf_master_weights master_weights;   /* FP32 */
  zf_selection_score selection_score; /* STEP */
  double max_grad_norm;               /* 0 = no clipping (default); else > 0 (negative: refused since 0.1.0) */
  double beta1, beta2, eps;           /* 0.9, 0.999, 1e-8 */
  zf_loss_scaling loss_scaling;       /* NONE */
  double initial_scale;               /* 65536, > 0 */
  double growth_factor;               /* 2, > 1 */
  double backoff_factor;              /* 0.5, in (0, 1) */
  int64_t growth_interval;            /* 2000, >= 1 */
  size_t bucket_bytes;                /* 64 MiB, >= 1: packed gradient bytes per staging bucket */
  int32_t staging_slots;              /* 4, >= 1: slots in the staging ring */
  int32_t compute_threads;            /* 0 = auto: the cores pt_reserved_cores_perc leaves to the framework */
  int32_t host_threads;               /* 0 = auto: the other cores (at least 1) */
  /* Both autos take every core when the configuration is synchronous (overlap_step 0 with
   * update_interval 1, or topk_ratio 1): then no host work runs beside the caller's compute. */
  int32_t ranks_per_host; /* 1, >= 1 (since 0.1.0, 2026-12-05): processes of this job on this host
                           * (data parallel: the local world size); see zf_engine_thread_plan_for */
  /* Dynamic loss scaling, DeepSpeed's fp16 rules (since 0.1.0, 2026-12-05). An overflow step
   * backs the scale off only when it is the hysteresis-th overflow since the scale last grew
   * (consecutive_hysteresis 0) or in a row (1); before that it is skipped at the same scale.
   * The scale never backs off below min_loss_scale (overflows there are skipped at it). */
  int64_t hysteresis;             /* 1, >= 1 (1: every overflow backs off, as torch's GradScaler) */
  int32_t consecutive_hysteresis; /* 0: a good step does not refill the hysteresis; 1: it does */
  double min_loss_scale;          /* 0 = none (fp32's smallest normal number); else > 0 */
  /* overlap_step 1 (since 0.1.0, 2026-12-05): the step of the next window after which window
   * w's host update lands in the weights. L >= 1 (default 1) = after the L-th step of window
   * w+1 (or at its close, if it closes first): S + L steps stale at most, and the training
   * thread waits for the host if the update has not finished by then (stats: window-close
   * stall); 0 = at the next window's close (2S steps stale, DeepSpeed's landing). The landing
   * step follows from the step count alone, so runs are reproducible whatever the host's
   * speed. */
  int64_t update_lag;
  /* 1 (since 0.1.0, 2026-12-05): in a split step (zf_engine_begin_step), each matrix's
   * gradient is consumed as soon as its bucket is complete: its column sums taken, its
   * deferred columns packed and on their way to the host, its selected columns copied into a
   * compact buffer of the engine's (k/n of the gradient's bytes, device memory). From then on
   * the engine never reads it again, and zf_engine_take_released reports it, so the caller
   * can free it during backward. Results are bit for bit those of 0. Held until end_step: the
   * dense parameters' gradients, and every gradient at a selection step (the choice needs
   * every column sum first). A gradient marked ready again after its submit (reentrant
   * activation checkpointing with a shared parameter), in a step that released any, fails
   * zf_engine_end_step_with instead of being retaken (ZF_ERROR_INVALID_VALUE; the step is
   * not taken). The host staging ring has a slot per bucket (pinned memory on CUDA), so that
   * every bucket of a step is consumed during backward; the device keeps staging_slots. 0
   * (default): the caller's gradients stay valid and are read until end_step. */
  int32_t release_gradients;
  /* SQRT (since 0.1.0, 2026-12-06): see zf_window_scaling. Measured on the demo's fine-tuning
   * and from scratch (benchmarks/results/2026-12-06-window-scaling.md). NONE is the arithmetic
   * before it. With SQRT or LINEAR and a fixed update_interval S > 1, the first window after
   * steps that updated every column (warm-up, or a loaded state of plain AdamW's) turns each
   * deferred column's second moment into that of a mean of S steps' gradients: v_hat <-
   * m_hat^2 + max(0, v_hat - m_hat^2) / S (docs/design.md section 3). */
  zf_window_scaling window_scaling;
  /* 200, >= 0 (since 0.1.0, 2026-12-06): a synchronous start for a model trained from scratch,
   * decided from the first steps. The first min(8, auto_warm_up_rounds) steps run as warm-up
   * steps (synchronous offload, as full_warm_up_rounds'); after the last of them the engine
   * reads the Adam moments of every matrix and decides: when the consistent share of the
   * gradient, (R - f) / (1 - f) with R = sum(m_hat^2) / sum(v_hat) over the matrices' elements
   * and f = (1 - b1) / (1 + b1) * (1 + b1^t) / (1 - b1^t) the R of pure noise at step t, is at
   * least 0.25, as in the first steps of a randomly initialised model, warm-up goes on up to
   * step auto_warm_up_rounds; else it ends there (a pretrained model's gradients are mostly
   * noise from the first steps; docs/design.md section 3).
   * 0: no detection, full_warm_up_rounds alone decides. Warm-up lasts max(full_warm_up_rounds,
   * the decided end) steps. The decision reads only the moments' bits, so it is reproducible
   * and follows a checkpoint (ZF_COUNTER_WARM_UP_END); data parallel: the ranks' sums are
   * all-reduced (float32) before the one decision. stats: synchronous_start_steps. */
  int64_t auto_warm_up_rounds;
} zf_engine_config;

/*
 * The configuration's table (since 0.1.0, 2026-12-05): one entry per field of
 * zf_engine_config, in field order (beta1, beta2 and eps are one entry each). It is where every
 * rule of a field lives: zf_engine_config_default() takes its defaults from it and
 * zf_engine_create / zf_engine_thread_plan_for check each field against it (messages
 * "config.<name>: ..."); bindings read it to parse their own config objects and to document
 * them. Every string is static storage, valid for the life of the process, never NULL
 * ("" where a column does not apply), and must not be freed.
 */
typedef enum zf_config_type {
  ZF_CONFIG_FLOAT = 0, /* a double */
  ZF_CONFIG_INT = 1,   /* an integer (int32_t, int64_t or size_t: see size) */
  ZF_CONFIG_BOOL = 2,  /* an int32_t, 0 or 1 */
  ZF_CONFIG_CHOICE = 3 /* an enum: the value is the index of its name in `choices` */
} zf_config_type;

typedef struct zf_engine_config_key {
  const char* name;              /* the field's name ("topk_ratio") */
  zf_config_type type;           /* how the field is read and written */
  size_t offset, size;           /* where the field lies in zf_engine_config, and its bytes */
  double minimum, maximum;       /* FLOAT and INT: the valid range (+-HUGE_VAL: unbounded) ... */
  int32_t minimum_open;          /* ... 1: minimum itself is excluded */
  int32_t maximum_open;          /* ... 1: maximum itself is excluded */
  const char* zero_means;        /* FLOAT, INT: what 0 stands for, outside the range ("auto", "none"); "" if nothing */
  const char* choices;           /* CHOICE: the names, comma separated, in enum order ("auto,step,epoch") */
  const char* default_text;      /* the default as a person writes it ("0.1", "auto", "none", "64 MiB") */
  const char* range_text;        /* the valid values as a person writes them ("[0, 1]", "auto or >= 1") */
  const char* meaning;           /* one line: what the field does */
  const char* deepspeed_key;     /* the DeepSpeed config key it comes from ("zero_optimization.zenflow.topk_ratio",
                                    "fp16.hysteresis"); "" when DeepSpeed has none */
  const char* deepspeed_default; /* DeepSpeed's default as a JSON literal ("\"auto\"", "false", "2"); "" when
                                    DeepSpeed has no default or it equals zenflow's */
  const char* deepspeed_difference; /* "" when zenflow follows DeepSpeed; else what differs and why */
} zf_engine_config_key;

/* The number of entries of the table. Since 0.1.0. */
ZF_API size_t zf_engine_config_key_count(void);
/* *out <- entry `index` (< zf_engine_config_key_count()); INVALID_VALUE for a bad index or NULL
 * out, and *out is untouched. Since 0.1.0. */
ZF_API zf_status zf_engine_config_key_at(size_t index, zf_engine_config_key* out);
/* Checks `config` as zf_engine_create does, without creating anything: ZF_SUCCESS, or
 * INVALID_VALUE with zf_last_error() naming the first bad field ("config.topk_ratio: must be in
 * [0, 1], got 1.5"). Since 0.1.0. */
ZF_API zf_status zf_engine_config_check(const zf_engine_config* config);
/* zf_engine_config_check plus the rules DeepSpeed's zenflow config adds, which the C API's own
 * meanings do not need: select_strategy STEP or EPOCH needs select_interval >= 1 (in the C API
 * 0 acts as auto), and a selection period (select_interval steps, or select_interval *
 * steps_per_epoch) no shorter than update_interval (in the C API it is rounded up to whole
 * windows). ZenFlowAdamW and its from_config check with it. Since 0.1.0. */
ZF_API zf_status zf_engine_config_check_deepspeed(const zf_engine_config* config);

/*
 * The engine's thread plan: how many threads each of its lanes and the framework beside it
 * (torch's intra-op pool) get. "This rank's cores" are the process's CPU affinity when it is
 * narrower than the host (a launcher that pins each rank already split the cores), else the
 * host's cores / ranks_per_host (at least 1). A configuration with host work beside the
 * framework's compute reserves ceil(cores * pt_reserved_cores_perc) cores for the framework
 * (DeepSpeed's rounding), gives the host lane the rest (at least 1) and the framework and the
 * compute lane cores - host lane (at least 1); a synchronous one (see
 * above) gives both lanes and the framework every core of the rank. Given thread counts
 * (compute_threads, host_threads > 0) win. The engine uses this plan; a layer above applies
 * framework_threads to its framework.
 */
typedef struct zf_engine_thread_plan {
  int32_t cores;             /* this rank's cores */
  int32_t compute_threads;   /* the compute lane (the host backend's device work) */
  int32_t host_threads;      /* the host lane (accumulates, window updates) */
  int32_t framework_threads; /* the framework's intra-op threads beside them */
} zf_engine_thread_plan;

/* The plan of `config` on this process (validated as zf_engine_create does). Since 0.1.0. */
ZF_API zf_status zf_engine_thread_plan_for(const zf_engine_config* config, zf_engine_thread_plan* plan);

/*
 * update_interval 0 ("auto"): per matrix with 0 < k < n, over the steps of the current window
 * so far, E_sel = sum of sqrt(c) over the selected columns / (k * steps) and E_def = sum of
 * sqrt(c) over the deferred columns / (n - k), c the column sums of squares of the raw
 * gradients (so sqrt(c) is a column's gradient norm); the matrix is due when E_def >= E_sel.
 * After each step the window closes when (due matrices / counted matrices) >= auto_ratio, or
 * when it has max_update_interval steps (always, when no matrix is counted).
 */
ZF_API zf_engine_config zf_engine_config_default(void);

/* A parameter group: its learning rate, decoupled weight decay, and whether its parameters
 * are all dense (updated in full every step, never offloaded). */
typedef struct zf_engine_group {
  double lr;
  double weight_decay;
  int32_t dense;
} zf_engine_group;

/*
 * Creates an engine over `param_count` parameters: params[i] belongs to group
 * param_groups[i] (an index into groups). Validates everything first; on failure *out is
 * untouched. The parameters' values are first read by the first step (or replaced by a
 * loaded state), so they may still be set between create and the first step.
 */
ZF_API zf_status zf_engine_create(const zf_tensor* params, const int32_t* param_groups, size_t param_count,
                                  const zf_engine_group* groups, size_t group_count, const zf_engine_config* config,
                                  zf_engine** out);
/* Joins the host lane, dropping queued work that has not started, and frees the engine's
 * memory (not the attached device memory, which the caller owns). Never waits for work that
 * cannot complete. NULL is accepted. In a process forked after the engine was created, the
 * engine cannot be used (every call fails with INVALID_VALUE; create a new engine in the
 * child) and destroying it there releases nothing: its threads exist only in the parent. */
ZF_API zf_status zf_engine_destroy(zf_engine* engine);

/*
 * Device memory, query then run: *bytes receives the size of the device-side memory (the
 * compact selected state, the dense parameters' state, one matrix's exchange scratch, the
 * staging ring and the upload bucket). The caller allocates it (256-byte aligned) on the
 * parameters' device and attaches it before the first step or load; it must outlive the
 * engine. On the host backend (CPU parameters) the memory is host memory, and attaching is
 * optional: without it the engine allocates its own at the first step or load.
 */
ZF_API zf_status zf_engine_device_memory_size(const zf_engine* engine, size_t* bytes);
ZF_API zf_status zf_engine_attach_device_memory(zf_engine* engine, void* memory, size_t bytes);

/*
 * The compute stream (CUDA backend): every later call enqueues its device work on `stream`
 * (a cudaStream_t; NULL = the legacy default stream) until the next zf_engine_set_stream.
 * The engine's copies run on two streams of its own and are ordered against this one by
 * events; the training thread is never synchronised with it except where stats() counts a
 * stall. The host backend accepts only NULL.
 */
ZF_API zf_status zf_engine_set_stream(zf_engine* engine, zf_stream stream);

/*
 * Several devices (docs/design.md section 7). Parameters on several CUDA devices of one
 * process are driven as one optimizer: the engine runs one pipeline per device (its own
 * copy streams, events, device memory, pinned buffers and host lane, of about 1/N of the
 * host threads each) and keeps them in lock step. The gradient norm and the skip flag are
 * over every parameter: each device's sums are copied to the others on their compute
 * streams (a 16-byte peer copy, ordered by events, no host round trip) and combined in
 * device order, so every device has the same bits. The schedule, the selection, the windows
 * and the loss scale are therefore identical on every device; the auto update interval
 * counts the matrices of all devices. Arguments are checked on every device before any
 * device changes anything. A step that fails on one device after others began it leaves a
 * sticky error until a state is loaded. Indices in messages, in the state layout and in
 * the split form's `first` are the caller's parameter indices. Data parallel with several
 * devices in one process is not supported (one process per device).
 *
 * The devices are numbered 0..count-1 in increasing CUDA device index. With more than one,
 * the calls above that name no device (zf_engine_device_memory_size,
 * zf_engine_attach_device_memory, zf_engine_set_stream) fail with INVALID_VALUE: use the
 * _at forms, which take the device's number. With one device the _at forms take 0 and act
 * as the plain calls. Every call leaves the caller's current CUDA device as it was.
 */
/* *count <- the number of devices the parameters are on (1 for CPU parameters). */
ZF_API zf_status zf_engine_device_count(const zf_engine* engine, size_t* count);
/* Device `index`: where it is and the bytes of device memory it needs (as
 * zf_engine_device_memory_size, for that device's parameters). */
ZF_API zf_status zf_engine_device_at(const zf_engine* engine, size_t index, zf_device* device, size_t* memory_bytes);
/* As zf_engine_attach_device_memory, for device `index` (memory on that device). */
ZF_API zf_status zf_engine_attach_device_memory_at(zf_engine* engine, size_t index, void* memory, size_t bytes);
/* As zf_engine_set_stream, for device `index` (a stream of that device). */
ZF_API zf_status zf_engine_set_stream_at(zf_engine* engine, size_t index, zf_stream stream);

/*
 * Data parallel (docs/design.md section 9). With collectives set, the engine is one of
 * world_size ranks that train one model on different data; every rank calls the same
 * functions in the same order, and the engine calls the collectives below (each rank the same
 * ones, in the same order, with the same sizes).
 *
 *  - Gradients: the engine reduces them itself, in place in the caller's gradient tensors
 *    (as DDP does): the selected columns and the dense parameters are all-reduced, the
 *    deferred columns reduce-scattered, so that each rank holds the reduced columns it owns.
 *    Do not reduce them before (no DDP gradient hooks). A selection step all-reduces the
 *    whole gradient (which columns are deferred is what that step decides). The step then
 *    follows the sum of the ranks' gradients divided by world_size: give each rank the
 *    gradient of its share of the global batch, as for DDP.
 *  - Ownership: rank r owns the contiguous columns [r*n/N, (r+1)*n/N) of each matrix
 *    (integer division). It keeps the host state (fp32 master, moments, accumulators) of those
 *    columns only, copies only its deferred ones down and updates them on its host, and the
 *    updated columns are all-gathered at upload. Host memory, bytes down and up, and host
 *    update time per rank are about 1/N of one engine's. The selected columns and the dense
 *    parameters' state are replicated on every rank's device.
 *  - Selection: each rank sums the squares of the reduced gradient's columns it owns; the
 *    column sums are all-reduced (one float per column), so every rank runs the same top-k,
 *    the same global norm and the same window schedule. Nothing else is exchanged.
 *  - Failures: at the start of every step, split step (begin_step), flush, save and load
 *    the ranks all-reduce one flag each, which also names the call the rank is in; a rank
 *    whose host lane failed, or whose call was refused (a bad gradient, a state it cannot
 *    load), raises its own error and every other rank raises ZF_ERROR_INVALID_VALUE naming
 *    it; ranks in different calls (one flushing while another steps) all raise
 *    ZF_ERROR_INVALID_VALUE, and nothing runs on any of them. A failed collective is a
 *    sticky error. A rank that stops calling leaves the others in a collective until the
 *    communicator's own timeout.
 *  - Split steps (since 0.1.0, 2026-12-05): each bucket of matrices (config.bucket_bytes)
 *    is reduced as soon as all its matrices are submitted, in one order on every rank (the
 *    last bucket first, backward's order; a bucket that fills early waits for those before
 *    it), on the CUDA backend on a stream of the engine's (after the caller's stream's work
 *    so far; the collectives are given that stream), then its statistics are taken and (but
 *    at a selection step) its deferred columns copied down; the gradient is read then, not
 *    at submit. end_step reduces the rest and the dense gradients, and the ranks' agreement
 *    on how the step ends rides on the all-reduce of the non-finite flags. A refusal of
 *    submit (a bad gradient) or at end_step (a parameter not submitted) is returned by
 *    end_step on every rank; the refusing rank still joins the step's collectives, with
 *    zeros, and the step changes nothing on any rank but the gradients already reduced.
 *    zf_engine_abort_step and zf_engine_refuse(ZF_ENGINE_CALL_STEP) of an open split step
 *    join them the same way, as refused. A rank that calls zf_engine_step while the others
 *    are in a split step (its backward had no gradient to hand over) takes the split form
 *    inside that call: the same collectives, the same result.
 *  - A layer above that refuses a call before it reaches the engine (its own checks of a
 *    checkpoint, say) joins that call's agreement with zf_engine_refuse, so that every rank
 *    fails it too.
 *
 * Every buffer the engine passes lies in its device memory (as attached); on the CUDA
 * backend the collective runs on `stream` (the compute stream, or during backward the
 * engine's reduction stream), ordered after the work enqueued there before the call and
 * before the work enqueued after it; on the host backend it completes before it returns. Sums must give every rank the
 * same bits (ring and tree all-reduces do). Each function returns ZF_SUCCESS, or an error status (last_error, if not
 * NULL, may then describe it).
 */
typedef struct zf_engine_collectives {
  void* user; /* passed back to every function */
  int32_t rank, world_size;
  /* data[0, count) <- its sum over the ranks. */
  zf_status (*all_reduce_sum)(void* user, void* data, size_t count, zf_dtype dtype, zf_stream stream);
  /* out[0, count) <- the sum over the ranks of in[rank * count, (rank + 1) * count). */
  zf_status (*reduce_scatter_sum)(void* user, const void* in, void* out, size_t count, zf_dtype dtype,
                                  zf_stream stream);
  /* out[q * count, (q + 1) * count) <- rank q's in[0, count), for every rank q. */
  zf_status (*all_gather)(void* user, const void* in, void* out, size_t count, zf_dtype dtype, zf_stream stream);
  const char* (*last_error)(void* user); /* may be NULL */
} zf_engine_collectives;

/* Makes the engine rank `rank` of `world_size` (NULL, or world_size 1: a single engine).
 * Before the device memory is attached and before the first step or load: it changes the
 * size zf_engine_device_memory_size reports (query it afterwards). The functions must stay
 * callable until zf_engine_destroy. */
ZF_API zf_status zf_engine_set_collectives(zf_engine* engine, const zf_engine_collectives* collectives);

/*
 * One optimizer step. grads: param_count tensors (grads[i] of params[i]'s shape and dtype,
 * contiguous, on its device), read during the call only. lrs: NULL (each group's lr), or
 * lr_count == group_count learning rates for this step. Gradients are "raw": multiplied by
 * zf_engine_loss_scale() when loss scaling is on; the engine unscales and clips them.
 * With dynamic loss scaling, an overflow step returns ZF_SUCCESS having changed nothing but
 * the loss scale (stats.skipped_steps counts it).
 */
ZF_API zf_status zf_engine_step(zf_engine* engine, const zf_tensor* grads, size_t count, const double* lrs,
                                size_t lr_count);
/*
 * The split form: begin_step, then submit for consecutive ranges of parameters as their
 * gradients become ready (each parameter exactly once), then end_step. grads[j] belongs to
 * params[first + j]. Submitted gradients are validated at once and must stay valid and
 * unchanged until end_step returns. The result is bit for bit that of zf_engine_step.
 */
ZF_API zf_status zf_engine_begin_step(zf_engine* engine, const double* lrs, size_t lr_count);
ZF_API zf_status zf_engine_submit(zf_engine* engine, size_t first, const zf_tensor* grads, size_t count);
ZF_API zf_status zf_engine_end_step(zf_engine* engine);
/*
 * Discards an open split step (the training loop failed between begin_step and end_step):
 * the submitted gradients are forgotten and the engine is as before begin_step. With no
 * split step open it does nothing. The host backend starts a step's work at end_step, so the
 * discard is always complete there; a backend that starts work at submit undoes it or, where
 * it cannot, reports ZF_ERROR_INVALID_VALUE and keeps a sticky error until a state is loaded.
 * Data parallel: the other ranks are in the step's collectives; this rank joins them as
 * refused (zeros), so that their end_step fails instead of waiting; its own gradients may
 * already be reduced in place.
 */
ZF_API zf_status zf_engine_abort_step(zf_engine* engine);

/*
 * Readiness, for a framework's backward hooks (since 0.1.0, 2026-12-05). In an open split
 * step, zf_engine_mark_ready says that parameter `index`'s gradient is ready: the engine
 * keeps `grad` (its memory must stay valid and unchanged, but for further accumulation by
 * the caller, until the step ends) and submits contiguous runs of ready parameters once a
 * run holds config.bucket_bytes of gradient, so work starts during backward. The caller
 * keeps no bookkeeping: zf_engine_end_step_with takes every parameter's final gradient
 * (grads[i] for the count parameters), submits those not yet submitted and ends the step.
 * A gradient marked ready again before its run was submitted is simply read later; one
 * marked again after (a parameter used twice in one backward: shared weights, reentrant
 * activation checkpointing) makes end_step_with take the step again, whole, from `grads`:
 * the result is that of zf_engine_step with the gradients autograd accumulated, bit for
 * bit. Data parallel reads a gradient when its bucket is reduced: one marked again before
 * that is simply read then; one marked again after makes end_step_with fail on every rank
 * (ZF_ERROR_INVALID_VALUE naming it). A parameter never marked is submitted at
 * end_step_with (a frozen one steps with the gradient given there, zeros for instance).
 */
ZF_API zf_status zf_engine_mark_ready(zf_engine* engine, size_t index, const zf_tensor* grad);
ZF_API zf_status zf_engine_end_step_with(zf_engine* engine, const zf_tensor* grads, size_t count);

/*
 * Gradient release (config.release_gradients 1; since 0.1.0, 2026-12-05). Writes to
 * indices[0, *count) the parameters whose gradients the engine released since the last call
 * in the open split step: it holds no pointer into them and reads them no more. In parameter
 * order within a bucket, buckets in the order they were consumed; at most `capacity` (the
 * rest come with the next call). *count is 0 outside a split step or with release_gradients
 * 0. zf_engine_end_step_with does not read the entries of released parameters (their data
 * may be NULL).
 * Streams (CUDA): one engine's last reads are enqueued on the compute stream (the caller's,
 * zf_engine_set_stream) and a bucket is reported as soon as they are: free the memory to a
 * stream-ordered allocator on that stream (torch's caching allocator when the gradient was
 * allocated on it, cudaFreeAsync on it), or synchronise the stream before reusing it
 * otherwise. Data parallel reads them on a stream of the engine's: a bucket is reported once
 * those reads have completed, so the memory may be reused at once.
 */
ZF_API zf_status zf_engine_take_released(zf_engine* engine, size_t* indices, size_t capacity, size_t* count);

/*
 * Checks that every parameter's memory is where it was when the engine was created (data[i]
 * for the count parameters): the engine writes the weights there, so a parameter whose
 * storage was replaced (moved to another device, reloaded with assign=True, `param.data =
 * ...`) would be written in freed memory. ZF_ERROR_INVALID_VALUE names the first that moved;
 * nothing changes. Since 0.1.0 (2026-12-05).
 */
ZF_API zf_status zf_engine_check_params(const zf_engine* engine, const void* const* data, size_t count);

/* The hyper-parameters of every later step, until the next call: Adam's betas and eps (one
 * pair for every group) and each group's decoupled weight decay (weight_decays[g] for the
 * group_count groups, or NULL to keep them). The learning rate stays an argument of each
 * step. A step's selected columns and dense parameters take the values set at that step
 * (at end_step for a split step); a window's host update takes those of the window's last
 * step, as it takes its lr. Nothing is flushed or rebuilt, so a scheduler may change them
 * every step (OneCycleLR's momentum cycling). Everything is checked first (betas in [0, 1),
 * eps and weight decays finite and >= 0): a bad value changes nothing. Since 0.1.0
 * (2026-12-05). */
ZF_API zf_status zf_engine_set_hyperparameters(zf_engine* engine, double beta1, double beta2, double eps,
                                               const double* weight_decays, size_t group_count);

/* The calls that start with the ranks' agreement (data parallel). */
typedef enum zf_engine_call {
  ZF_ENGINE_CALL_STEP = 1, /* zf_engine_step, zf_engine_end_step */
  ZF_ENGINE_CALL_FLUSH = 2,
  ZF_ENGINE_CALL_SAVE = 3,
  ZF_ENGINE_CALL_LOAD = 4
} zf_engine_call;

/* Data parallel: this rank refuses `call` before making it (a check of the caller's
 * failed). It joins the call's agreement as refused, so every other rank's `call` fails with
 * ZF_ERROR_INVALID_VALUE naming this rank; returns ZF_ERROR_INVALID_VALUE here (the caller
 * raises its own error). Without collectives it does nothing and returns ZF_SUCCESS. Since
 * 0.1.0 (2026-12-05). */
ZF_API zf_status zf_engine_refuse(zf_engine* engine, zf_engine_call call);

/* Applies the in-flight host update, then runs and applies the open window's (if any step
 * was accumulated): afterwards the parameters hold the exact current weights and the host
 * lane is idle. The window grid is not reset. */
ZF_API zf_status zf_engine_flush(zf_engine* engine);

/* Counters since creation; steps and skipped_steps are part of the checkpoint and follow a
 * load. Seconds are wall-clock. */
typedef struct zf_engine_stats {
  int64_t steps;         /* steps taken (skipped steps excluded) */
  int64_t windows;       /* host updates run after warm-up (window closes and flushes) */
  int64_t reselections;  /* selections after the first */
  int64_t skipped_steps; /* overflow steps of dynamic loss scaling */
  double last_global_norm;
  double stall_seconds_window_close;  /* training thread waiting for a host update at a close */
  double stall_seconds_back_pressure; /* waiting for a free staging slot */
  double stall_seconds_flush;         /* inside flushes (explicit, selection, save) */
  double host_update_seconds;         /* host lane time in window update passes */
  double accumulate_seconds;          /* host lane time in accumulate passes */
  int64_t bytes_down;                 /* packed deferred gradient bytes (gradient dtype) */
  int64_t bytes_up;                   /* uploaded deferred weight bytes (parameter dtype) */
  double selected_fraction;           /* sum k / sum n over matrices (current selection) */
  int64_t device_state_bytes;         /* compact selected state + dense state */
  int64_t host_state_bytes;           /* master, m, v, steps, two accumulators, upload copies U, staging ring (CUDA) */
  double stall_seconds_readback;      /* waiting for the step's statistics (CUDA: dynamic loss scaling,
                                         update_interval "auto", selection_score "window") */
  int64_t device_bytes;               /* device memory the engine uses (zf_engine_device_memory_size) */
  int64_t pinned_host_bytes;          /* staging ring (CUDA), upload copies U, scalar records (page-locked on CUDA) */
  /* Data parallel: bytes of the buffers this rank gave to collectives (the all-reduced buffer,
   * the reduce-scatter's input and the all-gather's output: world_size * count elements). */
  int64_t collective_bytes_statistics; /* column sums, non-finite flags, failure flags */
  int64_t collective_bytes_gradients;  /* all-reduced and reduce-scattered gradients */
  int64_t collective_bytes_upload;     /* all-gathered updated columns, selection exchanges */
  /* The host lane's memory traffic, counted by the engine from what its jobs touch: bytes
   * read and written by the accumulates (packed gradient, accumulator) and the window
   * updates (accumulator, fp32 master and moments, step counts, the upload copy). Per
   * deferred element and window of S steps: a window's first accumulate writes the
   * accumulator without reading it, the others read and write it, the window's closing
   * step is not accumulated (the update reads its packed gradient from the upload copy and
   * writes its result over it), and the update does not zero the accumulator:
   * (g + 8) S + 16 + w bytes for gradient and weight bytes g, w (docs/design.md, "host
   * lane traffic"). Since 0.1.0 (2026-12-05). */
  int64_t host_lane_bytes_read;
  int64_t host_lane_bytes_written;
  /* The last split step: the most bytes of the caller's gradients the engine held at once,
   * each counted from its submit to its release (release_gradients) or the step's end
   * (matrices and dense parameters alike). 0 before the first. Since 0.1.0 (2026-12-05). */
  int64_t held_gradient_bytes_peak;
  /* The synchronous start's length in steps: max(full_warm_up_rounds, the end that
   * auto_warm_up_rounds decided); -1 while the decision is pending. Since 0.1.0 (2026-12-06). */
  int64_t synchronous_start_steps;
  /* The host lane's jobs waiting for the copies they read or write (a staging slot's
   * download, the upload copy's last upload), not counted in host_update_seconds or
   * accumulate_seconds, so that those time the passes over memory alone. Since 0.1.0
   * (2026-12-07). */
  double host_lane_wait_seconds;
} zf_engine_stats;

ZF_API zf_status zf_engine_get_stats(const zf_engine* engine, zf_engine_stats* stats);
/* The current loss scale (1 without loss scaling). */
ZF_API zf_status zf_engine_loss_scale(const zf_engine* engine, double* loss_scale);

/*
 * Checkpoint. The state is a list of buffers, each described by a zf_engine_state_entry,
 * plus ZF_ENGINE_STATE_COUNTERS int64 schedule counters and the loss scale. Per parameter,
 * in parameter order:
 *   MASTER, EXP_AVG, EXP_AVG_SQ  f32 in the parameter's own shape (row-major): every
 *                                column's fp32 master and moments, wherever it lives;
 *   STEPS                        i32 [n] for a matrix (per column), [1] for a dense parameter;
 *   SELECTED (matrix only)       i32 [k]: the selected columns, ascending ([0] before the
 *                                first selection);
 *   WINDOW_SCORE (matrix only)   f32 [2, n]: column scores summed over the previous and the
 *                                current window (selection_score WINDOW);
 *   WINDOW_ENERGY (matrix only)  f32 [2]: the auto interval's selected / deferred sums of
 *                                column norms over the current window;
 *   ACCUMULATOR (matrix only)    f32 in the parameter's shape: the deferred columns'
 *                                gradients summed over the open window (since 0.1.0,
 *                                2026-12-05; zeros in a state saved before).
 * With the counters STEPS_ACCUMULATED and UPDATE_PENDING it is the whole state of the
 * pipeline at a step boundary: saving closes no window and lands no host update (it waits
 * for the host lane's running work), so a run that saves equals one that does not, and a
 * run resumed from the state (with the parameters saved beside it) equals the uninterrupted
 * run, bit for bit. A pending host result (a window's update, computed, not yet applied to
 * the parameters, which lag by it) is its MASTER columns; it is applied at the next window
 * close as it would have been.
 * It does not depend on which columns sit where: it loads into an engine with another
 * topk_ratio (a selection that does not fit is redone at the next step), thread count,
 * backend or world size. The parameters' own values are not part of it (restore them as for
 * any optimizer: a bf16 parameter with an fp32 master equals its master rounded, except for
 * a pending host result's columns, which the parameters get at the next window close).
 */
typedef enum zf_engine_state_kind {
  ZF_STATE_MASTER = 0,
  ZF_STATE_EXP_AVG = 1,
  ZF_STATE_EXP_AVG_SQ = 2,
  ZF_STATE_STEPS = 3,
  ZF_STATE_SELECTED = 4,
  ZF_STATE_WINDOW_SCORE = 5,
  ZF_STATE_WINDOW_ENERGY = 6,
  ZF_STATE_ACCUMULATOR = 7
} zf_engine_state_kind;

/* The entry's name as the Python state_dict spells it ("master", "exp_avg", ...);
 * "unknown" for a value outside the enum. A static string. */
ZF_API const char* zf_engine_state_kind_name(zf_engine_state_kind kind);

typedef struct zf_engine_state_entry {
  int32_t param; /* parameter index */
  zf_engine_state_kind kind;
  zf_dtype dtype;
  int32_t ndim;
  int64_t shape[ZF_MAX_DIMS];
  size_t bytes;
} zf_engine_state_entry;

/*
 * The state entries of one parameter, as zf_engine_state_layout lays them out for it before
 * its first selection (SELECTED [0]; `param` index 0): 4 for a dense parameter, 8 for a
 * matrix (two or more dimensions outside a dense group, dense_group 0). Only param's dtype,
 * ndim and shape are read (data may be NULL). entries NULL: *count receives the number;
 * else *count is the capacity of entries, then the number written. A layer above builds a
 * fresh state, or checks a state's schema, from this description. Since 0.1.0 (2026-12-05).
 */
ZF_API zf_status zf_engine_param_state_layout(const zf_tensor* param, int dense_group, zf_engine_state_entry* entries,
                                              size_t* count);

/* The schedule counters' positions in the counters array. */
enum {
  ZF_COUNTER_STEP = 0,            /* steps taken */
  ZF_COUNTER_WINDOW = 1,          /* windows started after warm-up */
  ZF_COUNTER_WINDOW_STEPS = 2,    /* steps of the open window so far */
  ZF_COUNTER_SINCE_SELECTION = 3, /* steps since the last selection (inclusive) */
  ZF_COUNTER_SELECTIONS = 4,      /* selections made */
  ZF_COUNTER_HAS_PREVIOUS_WINDOW = 5,
  ZF_COUNTER_GROWTH_TRACKER = 6,    /* consecutive good steps of the loss scaler */
  ZF_COUNTER_SKIPPED = 7,           /* skipped steps */
  ZF_COUNTER_STEPS_ACCUMULATED = 8, /* steps summed in the ACCUMULATOR entries (since 0.1.0) */
  ZF_COUNTER_UPDATE_PENDING = 9,    /* 1: a host result waits for the next window close */
  ZF_COUNTER_HYSTERESIS = 10,       /* overflows the loss scaler's hysteresis absorbed (since 0.1.0, 2026-12-05;
                                       in [0, hysteresis - 1]) */
  ZF_COUNTER_WARM_UP_END = 11,      /* auto_warm_up_rounds: the decided last step of the synchronous start,
                                       -1 while undecided (and always from an engine without detection)
                                       (since 0.1.0, 2026-12-06) */
  ZF_ENGINE_STATE_COUNTERS = 12
};

/* Query-then-run: with entries == NULL, *count receives the number of entries; otherwise
 * *count must hold at least that many and entries receives them. */
ZF_API zf_status zf_engine_state_layout(const zf_engine* engine, zf_engine_state_entry* entries, size_t* count);
/* Waits for the host lane's running work (it closes no window and applies no host result:
 * the run goes on as if nothing was saved), then writes the state into `count` caller
 * buffers (CPU tensors matching the layout entry by entry), the counters and the loss
 * scale. Data parallel: each rank writes
 * what it owns (its columns of every matrix; rank 0 also the dense parameters, the
 * selections and the window entries) and zeros elsewhere, so the element-wise sum of the
 * ranks' buffers is the whole state (what one engine would save). The counters and the loss
 * scale are the same on every rank. */
ZF_API zf_status zf_engine_save_state(zf_engine* engine, const zf_tensor* buffers, size_t count, int64_t* counters,
                                      double* loss_scale);
/* Validates everything first (a state of another model fails with INVALID_VALUE naming the
 * entry and changes nothing), then waits for the host lane, replaces the whole state and
 * clears a sticky error. Data parallel: every rank loads the whole state (of any world size)
 * and keeps what it owns; the ranks agree first, so a state one rank refuses is refused by
 * all. */
ZF_API zf_status zf_engine_load_state(zf_engine* engine, const zf_tensor* buffers, size_t count,
                                      const int64_t* counters, double loss_scale);

/* Testing only: the next piece of work the engine's host lane starts fails with `message`,
 * as a failure of the host work itself would (a sticky error raised by a later call; data
 * parallel: on every rank). For tests of error handling in the layers above the engine. */
ZF_API zf_status zf_engine_inject_host_lane_fault_for_testing(zf_engine* engine, const char* message);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_ENGINE_H_ */
