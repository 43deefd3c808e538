/*
 * Host (CPU) optimizer: Adam/AdamW steps and the deferral accumulator (DESIGN.md section 2,
 * steps 4 to 6).
 *
 * Layout. Every tensor is a CPU tensor, contiguous (row-major), with data aligned to its
 * element size; nothing else is required of the alignment (the kernels load unaligned).
 * A "column-major matrix [n columns x m rows]" is the host copy of a weight W [m, n]: a
 * contiguous tensor of shape [n, m], so column j is the contiguous run of m elements
 * starting at j * m. "Selected" columns are those updated on the device; the host skips
 * them. A packed block holds only the unselected columns, in ascending column order:
 * shape [n - k, m].
 *
 * Arithmetic. The element update is torch.optim.AdamW's (or Adam's) on the CPU, with the
 * step-dependent scalars computed in double from double hyper-parameters as torch does
 * with Python floats (cpp/src/common/adam_math.hpp is the definition). The gradient is
 * read in its dtype, widened to fp32 and multiplied by `grad_scale` first. Narrowing
 * stores (bf16, fp16) round to nearest even.
 *
 * Threads and determinism. Every call runs on zenflow's host pool (zf_set_num_threads)
 * and returns when done. The work is elementwise, so results are bitwise identical for
 * any thread count and for every SIMD level.
 *
 * Errors. Everything is validated before anything is written: hyper-parameters (finite,
 * in range), dtypes, shapes, contiguity, alignment, overlap of the buffers of one tensor,
 * selected indices (strictly increasing, in range) and step counts. A failed call leaves
 * every buffer untouched.
 */
#ifndef ZENFLOW_CPU_ADAM_H_
#define ZENFLOW_CPU_ADAM_H_

#include "zenflow/zenflow.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zf_adam_mode {
  ZF_ADAM_MODE_ADAMW = 0, /* decoupled weight decay: p *= 1 - lr * wd (torch.optim.AdamW) */
  ZF_ADAM_MODE_ADAM = 1   /* L2 penalty: g += wd * p (torch.optim.Adam) */
} zf_adam_mode;

/* Hyper-parameters, in double as torch keeps them. Ranges: lr >= 0, 0 <= beta1 < 1,
 * 0 <= beta2 < 1, eps >= 0, weight_decay >= 0, all finite. */
typedef struct zf_adam_hparams {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  zf_adam_mode mode;
} zf_adam_hparams;

/* Flags of the step calls. */
/* Write zero into every gradient element the step consumed (the window's accumulator). */
#define ZF_CPU_ADAM_ZERO_GRAD 1u
/* zf_cpu_adamw_step_skip_columns with column_steps: add 1 to the count of every updated
 * (unselected) column, and use the new count, as torch increments `step` before using it. */
#define ZF_CPU_ADAM_INCREMENT_STEPS 2u

/*
 * One Adam/AdamW step on each of `count` tensors.
 *
 *   params[i]       f32, any shape: the fp32 master weights; updated in place.
 *   exp_avgs[i]     f32, same number of elements: m, updated in place.
 *   exp_avg_sqs[i]  f32, same number of elements: v, updated in place.
 *   grads[i]        f32, bf16 or f16, same number of elements. Zeroed with ZF_CPU_ADAM_ZERO_GRAD.
 *   out_params      NULL, or `count` tensors (f32, bf16 or f16, same number of elements)
 *                   that receive the updated parameter: the upload copy, or the bf16 model
 *                   weights themselves when params holds their fp32 master.
 *   steps[i]        the bias-correction step of tensor i, >= 1 (torch's `step` after its
 *                   increment).
 *   grad_scale      finite factor applied to every gradient (1/S for a window's mean, times
 *                   the clip coefficient; -1 for torch's maximize).
 *   flags           0 or ZF_CPU_ADAM_ZERO_GRAD.
 */
ZF_API zf_status zf_cpu_adamw_step(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs,
                                   const zf_tensor* grads, const zf_tensor* out_params, const int64_t* steps,
                                   size_t count, const zf_adam_hparams* hparams, float grad_scale, uint32_t flags);

/*
 * One step on the unselected columns of `count` column-major matrices; selected columns
 * are skipped: neither read nor written in any buffer (their counts included).
 *
 *   params[i], exp_avgs[i], exp_avg_sqs[i]
 *                   f32 [n_i, m_i]: master, m and v, column-major (see the layout above).
 *   grads[i]        f32, bf16 or f16: [n_i, m_i] (same layout, selected columns ignored) or
 *                   packed [n_i - k_i, m_i]. Zeroed (consumed columns) with ZF_CPU_ADAM_ZERO_GRAD.
 *   out_params      NULL, or `count` tensors f32, bf16 or f16, [n_i, m_i] or packed
 *                   [n_i - k_i, m_i]: receive the updated columns.
 *   selected        NULL (nothing selected), or `count` tensors i32 or i64 [k_i]: the
 *                   selected columns, strictly increasing, in [0, n_i).
 *   column_steps    NULL, or `count` tensors i32 or i64 [n_i]: the bias-correction step of
 *                   every column (columns carry their own counts). With
 *                   ZF_CPU_ADAM_INCREMENT_STEPS the updated columns' counts are incremented
 *                   first (and must then be >= 0), else they must be >= 1.
 *   steps           used when column_steps is NULL: one step (>= 1) per matrix.
 *   flags           ZF_CPU_ADAM_ZERO_GRAD and/or ZF_CPU_ADAM_INCREMENT_STEPS.
 *
 * The unselected columns form contiguous runs; each run is processed as one vectorised
 * stretch, and the runs of all matrices are split evenly over the pool.
 */
ZF_API zf_status zf_cpu_adamw_step_skip_columns(const zf_tensor* params, const zf_tensor* exp_avgs,
                                                const zf_tensor* exp_avg_sqs, const zf_tensor* grads,
                                                const zf_tensor* out_params, const zf_tensor* selected,
                                                const zf_tensor* column_steps, const int64_t* steps, size_t count,
                                                const zf_adam_hparams* hparams, float grad_scale, uint32_t flags);

/*
 * The per-step host work of deferral: accumulators[i] += scale * blocks[i], in fp32 with
 * one rounding per element (torch: A.add_(G, alpha=scale)).
 *
 *   accumulators[i] f32: without `selected`, any shape; with it, column-major [n_i, m_i].
 *   blocks[i]       f32, bf16 or f16. Without `selected`: as many elements as the
 *                   accumulator. With it: packed [n_i - k_i, m_i], whose column c is added
 *                   into the c-th unselected column of the accumulator.
 *   selected        NULL, or `count` tensors i32 or i64 [k_i], strictly increasing, in [0, n_i).
 *   scale           finite (the clip coefficient; 1 without clipping).
 */
ZF_API zf_status zf_cpu_accumulate(const zf_tensor* accumulators, const zf_tensor* blocks, const zf_tensor* selected,
                                   size_t count, float scale);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_CPU_ADAM_H_ */
