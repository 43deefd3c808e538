/*
 * Device update of the selected columns (DESIGN.md section 2, step 3): AdamW in place on
 * W[:, sel], with compact fp32 state and per-column step counts.
 */
#ifndef ZENFLOW_OPTIM_H_
#define ZENFLOW_OPTIM_H_

#include "zenflow/zenflow.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Optimizer state of k columns of one [m, n] matrix, "compact": column c of the state
 * belongs to column selected[c] of the matrix.
 *
 *   master      fp32 master copy of the columns, or an empty tensor (numel 0): none.
 *   exp_avg     fp32, Adam's first moment m.
 *   exp_avg_sq  fp32, Adam's second moment v.
 *   steps       i32 [k]: Adam steps each column's moments have received (its bias
 *               correction); it moves with the column when the selection changes.
 *
 * Device layout ([m, k], row-major: element (r, c) at r * k + c): master, exp_avg and
 * exp_avg_sq as used by zf_adamw_selected_columns and as old/new state of
 * zf_exchange_selected_columns. Packed host layout ([k, m]: column c's m values contiguous,
 * the transpose): the entering/leaving buffers of zf_exchange_selected_columns.
 */
typedef struct zf_column_state {
  zf_tensor master;
  zf_tensor exp_avg;
  zf_tensor exp_avg_sq;
  zf_tensor steps;
} zf_column_state;

/* Adam hyper-parameters shared by every matrix of a call (lr and weight decay are per
 * matrix). The update is AdamW, as torch.optim.AdamW (cpp/src/common/adam_math.hpp).
 * Doubles, like torch's Python floats: 1 - beta and 1 - lr * wd are formed in fp64 and
 * rounded once, so the fp32 coefficients equal torch's. */
typedef struct zf_adamw_options {
  double beta1;
  double beta2;
  double eps;
} zf_adamw_options;

/*
 * In-place AdamW on the selected columns of a list of matrices, one launch for all.
 *
 *   params[i]    W: [m_i, n_i] row-major, contiguous, f32, f16 or bf16; updated in place.
 *                1-D [n_i] reads as [1, n_i]; more dimensions as [shape[0], rest].
 *   grads[i]     G: same shape as params[i], contiguous, f32, f16 or bf16 (any mix). Read
 *                straight from the full gradient (no gather copy).
 *   selected     NULL: every column of every matrix (dense AdamW, k_i = n_i). Otherwise
 *                selected[i] is i32 [k_i], ascending, distinct, in [0, n_i).
 *   state[i]     master (optional), exp_avg, exp_avg_sq: fp32, contiguous, m_i * k_i
 *                elements in [m_i, k_i] row-major order (any shape with that many
 *                elements); steps: i32, k_i elements.
 *   lr, weight_decay  host arrays of `count` doubles: per matrix.
 *   grad_scale   NULL, or a 1-element f32 tensor on the device of params: every gradient
 *                is multiplied by it (clip coefficient times 1 / loss scale). Read on the
 *                device, so the call can be captured in a CUDA graph (lr and weight decay
 *                are captured by value).
 *   noop         NULL, or a 1-element i32 tensor on the device: when non-zero (an overflow
 *                found by zf_column_stats), the call changes nothing, not even steps.
 *
 * Per column c: step = steps[c] + 1 (written back), bias corrections
 * 1 - beta^step computed in fp64 and rounded to fp32 as torch does; then for every row r,
 * with p the master (if present) or W[r, sel[c]] as fp32:
 *   p <- p * (1 - lr * wd);  m <- m + (1 - beta1) * (g - m);  v <- beta2 * v + (1 - beta2) * g^2
 *   p <- p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
 * and W[r, sel[c]] <- p rounded to nearest even in W's dtype.
 *
 * All tensors on one device. Each element is updated by one thread with no reduction:
 * bitwise identical run to run. Host and CUDA round every operation alike (FMA only where
 * adam_math.hpp writes one), so their results agree bit for bit, barring a last-bit
 * difference of the fp64 pow() in the bias correction. On the host, bad indices fail the call before
 * anything is written; on CUDA the indices are not read by the host: columns outside
 * [0, n_i) are skipped (nothing written, steps unchanged), and unsorted or repeated
 * indices are the caller's error. CUDA calls are asynchronous on `stream`; no workspace.
 */
ZF_API zf_status zf_adamw_selected_columns(const zf_tensor* params, const zf_tensor* grads, const zf_tensor* selected,
                                           const zf_column_state* state, const double* lr, const double* weight_decay,
                                           size_t count, zf_adamw_options options, const zf_tensor* grad_scale,
                                           const zf_tensor* noop, zf_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_OPTIM_H_ */
