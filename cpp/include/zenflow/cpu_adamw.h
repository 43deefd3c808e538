/*
 * Host (CPU) optimizer: Adam/AdamW steps, the deferral accumulator, and the moves of column
 * state between the host and the compact device layout (docs/design.md section 2, steps 4
 * to 6, and section 3).
 *
 * Layout. Every tensor is a CPU tensor, contiguous (row-major), with data aligned to its
 * element size; nothing else is required of the alignment (the kernels load unaligned).
 * The host state of a weight W [m, n] is column-major: a contiguous [n, m] tensor, column j
 * being the run of m elements at j * m (zf_column_state, "host layout", in optim.h).
 * "Selected" columns are those updated on the device; the host skips them. Gradients of the
 * unselected columns arrive in the packed buffer of zf_pack_columns (pack.h): one 1-D
 * buffer, matrix after matrix, each matrix's unselected columns in ascending order and
 * column-major; zf_packed_layout gives its offsets. The same buffer layout carries the
 * updated columns back (zf_scatter_columns). Arguments read in a layout that another one
 * fixes must have its shape when they have two or more dimensions (zf_column_state, optim.h):
 * W's own row-major gradient [m, n] where the host layout [n, m] is expected is refused,
 * unless W is square, where the shapes agree and the layout is the caller's to honour. The
 * whole-tensor steps read their tensors elementwise: 2-D (or more) tensors must have the
 * shape of params[i] (grads[i] in the flat step); 1-D tensors are flat and read as they are.
 *
 * Arithmetic. The element update is torch.optim.AdamW's (or Adam's) on the CPU, with the
 * step-dependent scalars computed in double from double hyper-parameters as torch does
 * with Python floats (cpp/src/common/adam_math.hpp is the definition). The gradient is
 * read in its dtype, widened to fp32 and multiplied by `grad_scale` first. Narrowing
 * stores (bf16, fp16) round to nearest even.
 *
 * Threads and determinism. Every call runs on zenflow's process-wide host pool
 * (zf_set_num_threads) and returns when done. The work is elementwise, so results are
 * bitwise identical for any thread count and for every SIMD level.
 *
 * Errors. Everything is validated before anything is written: hyper-parameters (finite,
 * in range), dtypes, shapes, contiguity, alignment, overlap between any two buffers of the
 * call that one of them writes, selected indices (strictly increasing, in range) and step
 * counts. A failed call leaves every buffer untouched.
 */
#ifndef ZENFLOW_CPU_ADAMW_H_
#define ZENFLOW_CPU_ADAMW_H_

#include "zenflow/optim.h"
#include "zenflow/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Flags of the step calls. */
/* Write zero into every gradient element the step consumed (the window's accumulator). */
#define ZF_CPU_ADAMW_ZERO_GRAD 1u
/* zf_cpu_adamw_step_skip_columns: add 1 to the count of every updated (unselected) column
 * first, and use the new count, as torch increments `step` before using it; those counts
 * must then be in [0, INT32_MAX). Without it, the counts are used as they are and must be
 * >= 1. */
#define ZF_CPU_ADAMW_INCREMENT_STEPS 2u

/*
 * One Adam/AdamW step on each of `count` whole tensors (a plain optimizer step).
 *
 *   params[i]       f32, any shape: the fp32 master weights; updated in place.
 *   exp_avgs[i]     f32, same number of elements: m, updated in place.
 *   exp_avg_sqs[i]  f32, same number of elements: v, updated in place.
 *   grads[i]        f32, bf16 or f16, same number of elements. Zeroed with ZF_CPU_ADAMW_ZERO_GRAD.
 *   out_params      NULL, or `count` tensors (f32, bf16 or f16, same number of elements)
 *                   that receive the updated parameter: the bf16 model weights themselves
 *                   when params holds their fp32 master.
 *   steps[i]        the bias-correction step of tensor i, >= 1 (torch's `step` after its
 *                   increment).
 *   lr[i], weight_decay[i]  per tensor.
 *   grad_scale      finite factor applied to every gradient (the clip coefficient, 1/S
 *                   for a window's mean; -1 for torch's maximize).
 *   flags           0 or ZF_CPU_ADAMW_ZERO_GRAD.
 */
ZF_API zf_status zf_cpu_adamw_step(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs,
                                   const zf_tensor* grads, const zf_tensor* out_params, size_t count,
                                   const int64_t* steps, const double* lr, const double* weight_decay,
                                   const zf_adam_hparams* hparams, float grad_scale, uint32_t flags);

/*
 * The same step on `count` tensors whose fp32 state lives in flat buffers: one buffer per
 * field for all the tensors (CPUAdamW keeps one per kernel batch), tensor i's state being
 * the run of elements [offsets[i], offsets[i] + sizes[i]) of each. The
 * pool walks the state buffers contiguously (one stream per field, not one per tensor),
 * and a call converts 2 to 3 descriptors per tensor instead of 4 to 5.
 *
 *   params        NULL, or `count` f32 tensors with n_i elements, updated in place: the
 *                 weights are their own master (fp32 models). Exactly one of params and
 *                 master is given (with count 0, either or neither).
 *   master        NULL, or one f32 tensor (any shape, read as its elements in order): the
 *                 fp32 master weights, updated in place (bf16 / fp16 models, whose
 *                 rounded weights are out_params).
 *   exp_avg, exp_avg_sq  one f32 tensor each, m and v, updated in place. master (when
 *                 given), exp_avg and exp_avg_sq have the same number of elements.
 *   offsets[i], sizes[i]  element offset and element count of tensor i's state in those
 *                 buffers: ascending, each run inside the buffers and not overlapping the
 *                 next (offsets[i] + sizes[i] <= offsets[i + 1]); gaps are allowed and left
 *                 untouched (a tensor without a gradient this step).
 *   grads[i]      f32, bf16 or f16 with sizes[i] elements; params[i] and out_params[i]
 *                 too. Zeroed with ZF_CPU_ADAMW_ZERO_GRAD.
 *   out_params, steps, lr, weight_decay, grad_scale, flags: as zf_cpu_adamw_step.
 *
 * Ownership: the caller owns every buffer; nothing is kept after the call returns.
 * Results are bitwise identical to zf_cpu_adamw_step on the same values (any thread
 * count, every SIMD level).
 */
ZF_API zf_status zf_cpu_adamw_step_flat(const zf_tensor* params, const zf_tensor* master, const zf_tensor* exp_avg,
                                        const zf_tensor* exp_avg_sq, const int64_t* offsets, const int64_t* sizes,
                                        const zf_tensor* grads, const zf_tensor* out_params, size_t count,
                                        const int64_t* steps, const double* lr, const double* weight_decay,
                                        const zf_adam_hparams* hparams, float grad_scale, uint32_t flags);

/*
 * The window's host step: one Adam/AdamW step on the unselected columns of `count`
 * matrices held in the host layout; selected columns are neither read nor written in any
 * buffer (their counts included).
 *
 *   state[i]        host layout: exp_avg f32 2-D [n_i, m_i] (it gives the shape), master
 *                   and exp_avg_sq f32 with n_i * m_i elements (master required unless
 *                   that is 0), steps i32 [n_i] (per column).
 *   selected        NULL (nothing selected), or `count` tensors i32 [k_i], strictly
 *                   increasing, in [0, n_i).
 *   grads           the gradient, in exactly one of two forms:
 *     grads         `count` tensors f32, bf16 or f16 [n_i, m_i] in the host layout (the
 *                   window's accumulators; selected columns ignored). Consumed columns are
 *                   zeroed with ZF_CPU_ADAMW_ZERO_GRAD. Or NULL.
 *     packed_grads  a 1-D packed buffer (f32, bf16 or f16) of the unselected columns, in
 *                   the layout of zf_pack_columns (all of it is consumed, and zeroed with
 *                   ZF_CPU_ADAMW_ZERO_GRAD). Or NULL.
 *   packed_out      NULL, or a 1-D packed buffer (f32, bf16 or f16) that receives the
 *                   updated unselected columns, in the layout zf_scatter_columns reads:
 *                   the upload copy.
 *   lr[i], weight_decay[i]  per matrix.
 *   flags           ZF_CPU_ADAMW_ZERO_GRAD and/or ZF_CPU_ADAMW_INCREMENT_STEPS.
 *
 * The unselected columns form contiguous runs; each run is one vectorised stretch, and the
 * runs of all matrices are split evenly over the pool.
 */
ZF_API zf_status zf_cpu_adamw_step_skip_columns(const zf_column_state* state, const zf_tensor* selected, size_t count,
                                                const zf_tensor* grads, const zf_tensor* packed_grads,
                                                const zf_tensor* packed_out, const double* lr,
                                                const double* weight_decay, const zf_adam_hparams* hparams,
                                                float grad_scale, uint32_t flags);

/*
 * The per-step host work of deferral: the unselected columns of a packed buffer (as
 * zf_pack_columns writes it) added into the window's accumulators, in fp32 with one
 * rounding per element (torch: A.add_(G, alpha=scale)).
 *
 *   accumulators[i] f32. With `selected`: host layout [n_i, m_i], and the c-th packed
 *                   column of matrix i is added into its c-th unselected column. Without
 *                   it (every column unselected): any shape; matrix i's region of the
 *                   packed buffer is its numel elements, in order.
 *   selected        NULL, or `count` tensors i32 [k_i], strictly increasing, in [0, n_i).
 *   packed          1-D f32, bf16 or f16, exactly the packed size of the matrices.
 *   scale           finite (the clip coefficient; 1 without clipping).
 */
ZF_API zf_status zf_cpu_accumulate(const zf_tensor* accumulators, const zf_tensor* selected, size_t count,
                                   const zf_tensor* packed, float scale);

/*
 * Moves of column state between the host layout [n_i, m_i] and a packed host list of
 * columns [L_i, m_i] (optim.h), for a lossless change of the selection: together with
 * zf_exchange_selected_columns they move a column's fp32 master, moments and step count
 * between the host and the compact device state without rounding or resetting anything.
 *
 *   host[i]       host layout (exp_avg 2-D [n_i, m_i] gives the shape); master may be
 *                 empty (then the lists' masters must be empty too: nothing to move).
 *                 The counts that move must be >= 0.
 *   columns[i]    i32 [L_i], strictly increasing, in [0, n_i): which columns move.
 *   gather:  out[i] (packed host [L_i, m_i], steps [L_i]) <- those columns of host[i].
 *   scatter: those columns of host[i] <- in[i].
 */
ZF_API zf_status zf_cpu_gather_columns(const zf_column_state* host, const zf_tensor* columns, size_t count,
                                       const zf_column_state* out);
ZF_API zf_status zf_cpu_scatter_columns(const zf_column_state* in, const zf_tensor* columns, size_t count,
                                        const zf_column_state* host);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_CPU_ADAMW_H_ */
