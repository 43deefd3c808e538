/*
 * Selection of the important columns (docs/design.md section 2, step 2).
 */
#ifndef ZENFLOW_TOPK_H_
#define ZENFLOW_TOPK_H_

#include "zenflow/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * For every matrix i, the indices of the k_i largest scores, sorted ascending.
 *
 *   col_sq[i]       1-D [n_i] f32, contiguous: column scores (e.g. from zf_column_stats).
 *   out_indices[i]  1-D [k_i] i32, contiguous; k_i = out_indices[i].shape[0], 0 <= k_i <= n_i.
 *
 * Contract: among equal scores the lower index wins (so the selected set is unique: the
 * same on every run, thread count and rank); +Inf ranks above every finite score; -0 and
 * +0 are equal. On the host, a NaN score fails the call with ZF_ERROR_INVALID_VALUE before
 * anything is written.
 *
 * CUDA tensors: one launch on `stream` covers every vector (one thread block each), and
 * the result equals the host's bit for bit. The call returns before the scores are read,
 * so a NaN cannot fail it; instead every entry of that vector's out_indices is set to -1
 * (a vector with k = 0 reports nothing). Check out_indices[i][0] >= 0 where it matters, or
 * skip the step on column_stats' nonfinite flag, which a NaN score always comes from.
 * Device consumers of indices (zf_adamw_selected_columns, ...) skip indices outside
 * [0, n), so a -1 fill never causes an out-of-bounds access. The CUDA path needs no
 * workspace today; still call with workspace == NULL to learn `*workspace_bytes`.
 */
ZF_API zf_status zf_select_topk_columns(const zf_tensor* col_sq, const zf_tensor* out_indices, size_t count,
                                        void* workspace, size_t* workspace_bytes, zf_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_TOPK_H_ */
