/*
 * The optimizer state layout and hyper-parameters that every Adam call of zenflow shares
 * (host and device), and the device update of the selected columns (docs/design.md
 * section 2, step 3): AdamW in place on W[:, sel], with compact fp32 state and per-column
 * step counts.
 */
#ifndef ZENFLOW_OPTIM_H_
#define ZENFLOW_OPTIM_H_

#include "zenflow/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Optimizer state of a set of columns of one [m, n] matrix. The same struct describes the
 * places a column's state can live:
 *
 *   device ("compact") layout, the k selected columns: master, exp_avg, exp_avg_sq are
 *       fp32 [m, k] row-major (element (r, c) at r * k + c; column c of the state belongs
 *       to column selected[c] of the matrix), steps i32 [k].
 *   host layout, all n columns: fp32 [n, m], column-major (the transpose of W: column j is
 *       the contiguous run of m values starting at j * m), steps i32 [n].
 *   packed host layout, a list of L columns: fp32 [L, m] (each column's m values
 *       contiguous), steps i32 [L]: the entering/leaving buffers of
 *       zf_exchange_selected_columns, zf_cpu_gather_columns and zf_cpu_scatter_columns.
 *
 * Layout checks: a state tensor of two or more dimensions must have its layout's shape
 * (size-1 dimensions aside), so a [k, m] state where [m, k] is expected is refused; a 1-D
 * tensor is a flat buffer in the layout. A square state ([m, m]) cannot be told from its
 * transpose: its layout is the caller's to honour.
 *
 *   master      fp32 master copy of the columns, or an empty tensor (numel 0): none.
 *   exp_avg     fp32, Adam's first moment m.
 *   exp_avg_sq  fp32, Adam's second moment v.
 *   steps       i32: the Adam steps each column's moments have received (its bias
 *               correction); it moves with the column when the selection changes. Calls
 *               that read counts on the host reject a count below 0, or one that the step
 *               would take past INT32_MAX.
 */
typedef struct zf_column_state {
  zf_tensor master;
  zf_tensor exp_avg;
  zf_tensor exp_avg_sq;
  zf_tensor steps;
} zf_column_state;

typedef enum zf_adam_mode {
  ZF_ADAM_MODE_ADAMW = 0, /* decoupled weight decay: p *= 1 - lr * wd (torch.optim.AdamW) */
  ZF_ADAM_MODE_ADAM = 1   /* L2 penalty: g += wd * p (torch.optim.Adam) */
} zf_adam_mode;

/*
 * The hyper-parameters every Adam call of zenflow shares, on the host and the device alike.
 * Learning rate and weight decay are not here: every call takes them per matrix (arrays of
 * `count` doubles), so one call covers all param groups. Doubles, as torch keeps Python
 * floats: 1 - beta and 1 - lr * wd are formed in fp64 and rounded once, so the fp32
 * coefficients equal torch's (cpp/src/common/adam_math.hpp is the definition).
 * Ranges: 0 <= beta1 < 1, 0 <= beta2 < 1, eps >= 0, all finite; every lr and
 * weight_decay finite and >= 0.
 */
typedef struct zf_adam_hparams {
  double beta1;
  double beta2;
  double eps;
  zf_adam_mode mode;
} zf_adam_hparams;

/* torch.optim.AdamW's defaults, as an initializer: zf_adam_hparams h = ZF_ADAM_HPARAMS_DEFAULT; */
#define ZF_ADAM_HPARAMS_DEFAULT \
  { 0.9, 0.999, 1e-8, ZF_ADAM_MODE_ADAMW }

/*
 * In-place Adam/AdamW on the selected columns of a list of matrices: on CUDA two launches
 * per batch of up to 160 matrices (the update, then the step counts).
 *
 *   params[i]    W: [m_i, n_i] row-major, contiguous, f32, f16 or bf16; updated in place.
 *                1-D [n_i] reads as [1, n_i]; more dimensions as [shape[0], rest].
 *   grads[i]     G: same shape as params[i], contiguous, f32, f16 or bf16 (any mix). Read
 *                straight from the full gradient (no gather copy).
 *   selected     NULL: every column of every matrix (dense AdamW, k_i = n_i). Otherwise
 *                selected[i] is i32 [k_i], ascending, distinct, in [0, n_i).
 *   state[i]     device layout (above): master (optional), exp_avg, exp_avg_sq with
 *                m_i * k_i elements in [m_i, k_i] order (any shape with that many
 *                elements); steps: i32, k_i elements.
 *   lr, weight_decay  host arrays of `count` doubles: per matrix. lr may be NULL when
 *                lr_tensor is given.
 *   lr_tensor    NULL, or f32 [count] on the device of params: the learning rates, read
 *                on the device when the work runs (it replaces `lr`), so that a captured
 *                CUDA graph follows an lr schedule; the decoupled decay 1 - lr * wd is
 *                formed from it on the device too. weight_decay itself stays by value
 *                (baked into a captured graph, as in torch's capturable AdamW).
 *   grad_scale   NULL, or a 1-element f32 tensor on the device of params: every gradient
 *                is multiplied by it (clip coefficient times 1 / loss scale), read on the
 *                device.
 *   noop         NULL, or a 1-element i32 tensor on the device: when non-zero (an overflow
 *                found by zf_column_stats), the call changes nothing, not even steps.
 *
 * Per column c: step = steps[c] + 1 (written back), bias corrections 1 - beta^step
 * computed in fp64 (beta^step by square-and-multiply in double-double, not libm pow, so host
 * and device agree bit for bit) and rounded to fp32 as torch does; then for every row r, with p the
 * master (if present) or W[r, sel[c]] as fp32 (AdamW mode):
 *   p <- p * (1 - lr * wd);  m <- m + (1 - beta1) * (g - m);  v <- beta2 * v + (1 - beta2) * g^2
 *   p <- p - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
 * and W[r, sel[c]] <- p rounded to nearest even in W's dtype.
 *
 * All tensors on one device. No two written buffers of the call may overlap (and none may
 * overlap a read one): checked on the host for every pair, params against grads and
 * selected included. Each element is updated by one thread with no reduction: bitwise
 * identical run to run. Host and CUDA round every operation alike (FMA only where
 * adam_math.hpp writes one). On the host, bad indices and bad step counts (below 0, or
 * INT32_MAX, which the step cannot increment) fail the call before anything is written.
 * On CUDA the host reads neither: columns outside [0, n_i) are skipped (nothing written,
 * steps unchanged), a negative count is treated as 0 and a count at INT32_MAX stays there
 * (the update uses step INT32_MAX); unsorted or repeated indices are the caller's error.
 * CUDA calls are asynchronous on `stream`; no workspace.
 */
ZF_API zf_status zf_adamw_selected_columns(const zf_tensor* params, const zf_tensor* grads, const zf_tensor* selected,
                                           const zf_column_state* state, size_t count, const double* lr,
                                           const double* weight_decay, const zf_tensor* lr_tensor,
                                           const zf_adam_hparams* hparams, const zf_tensor* grad_scale,
                                           const zf_tensor* noop, zf_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_OPTIM_H_ */
