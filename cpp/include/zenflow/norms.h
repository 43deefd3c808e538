/*
 * Gradient column statistics (docs/design.md section 2, step 1).
 */
#ifndef ZENFLOW_NORMS_H_
#define ZENFLOW_NORMS_H_

#include "zenflow/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Add into out_col_sq instead of overwriting it (the "window" selection score). */
#define ZF_COLUMN_STATS_ACCUMULATE 1u

/*
 * Per-column sums of squares of a list of gradients, their total, and a non-finite flag,
 * in one read of every gradient.
 *
 *   grads[i]    2-D [m_i, n_i], row-major and contiguous (strides {n_i, 1}), f32, f16 or bf16.
 *   out_col_sq[i] 1-D [n_i] f32, contiguous. Receives c[j] = sum_r grads[i][r, j]^2.
 *   total_sq    1 element f32: sum over all i and j of c[j] (the squared global norm).
 *   nonfinite   1 element i32: 1 if any gradient element is Inf or NaN, else 0 (decided from
 *               the elements, identical on host and device for every input: large finite
 *               values whose sums overflow fp32 do not set it).
 *   flags       0, or ZF_COLUMN_STATS_ACCUMULATE to add c into out_col_sq.
 *   stream      cudaStream_t for CUDA tensors; the call is asynchronous on it.
 *
 * All tensors live on one device. Host: squares are summed in fp32 over blocks of 8 rows
 * and the block sums in fp64, then rounded once to fp32 (relative error below 5e-7 per
 * column); every column is summed in a fixed row order, so the host result is bitwise
 * identical across runs, thread counts and SIMD levels. CUDA: exact squares summed in fp64
 * (partial sums included) in an order fixed by the shapes, then rounded once to fp32
 * (deterministic run to run); sums may differ from the host's in the last fp32 bit. A sum
 * above the fp32 range is +Inf on both.
 * For CUDA tensors, `workspace` must hold `*workspace_bytes` bytes of device memory: call
 * once with workspace == NULL to learn the size (nothing else happens then), then again.
 * CPU tensors need no workspace (the size is 0).
 */
ZF_API zf_status zf_column_stats(const zf_tensor* grads, const zf_tensor* out_col_sq, size_t count,
                                 const zf_tensor* total_sq, const zf_tensor* nonfinite, uint32_t flags, void* workspace,
                                 size_t* workspace_bytes, zf_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_NORMS_H_ */
