/*
 * Moving the unselected columns between the device matrices and contiguous staging
 * buffers (docs/design.md section 2, steps 4 and 5), and the device side of a selection
 * change (section 3).
 */
#ifndef ZENFLOW_PACK_H_
#define ZENFLOW_PACK_H_

#include "zenflow/optim.h"
#include "zenflow/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Packed layout shared by pack and scatter. The unselected columns of matrix i are the
 * complement of selected[i] in [0, n_i), in ascending order: u_i = n_i - k_i of them.
 * The staging buffer is one 1-D contiguous tensor of sum_i m_i * u_i elements; matrix i
 * starts at offset_i = sum_{j<i} m_j * u_j (no padding), and holds its unselected columns
 * column-major:
 *
 *   packed[offset_i + j * m_i + r] = G_i[r, j-th unselected column]     (0 <= j < u_i)
 *
 * which is the host's column-major (transposed) layout of the same columns: the host
 * consumes this buffer as it is (zf_cpu_accumulate, zf_cpu_adamw_step_skip_columns) and
 * writes its updates back in it. The j-th unselected column is computed from the selected
 * list (zf::unselected_column in cpp/src/common/column_index.hpp), so no complement list is
 * stored anywhere.
 *
 *   grads[i] / params[i]  [m_i, n_i] row-major contiguous, f32, f16 or bf16 (1-D [n]
 *                         reads as [1, n]).
 *   selected[i]           i32 [k_i], ascending, distinct, in [0, n_i) (as from
 *                         zf_select_topk_columns). NULL: nothing is selected (all columns
 *                         move).
 *   packed                f32, f16 or bf16, independent of the matrices' dtype: values are
 *                         converted through fp32, rounding to nearest even.
 *
 * A pure copy (plus an optional scale): deterministic, bitwise equal on host and CUDA.
 * CUDA calls are asynchronous on `stream` and take no workspace. On the host, bad indices
 * fail before anything is written; on CUDA they are not checked (a column index outside
 * [0, n_i) is skipped).
 */

/*
 * The packed layout of `count` matrices viewed as [rows[i], cols[i]] with selected_counts[i]
 * selected columns: offsets[i] receives where matrix i starts, and offsets[count] the total
 * number of elements (offsets holds count + 1 values). Fails, writing nothing, on a negative
 * size, a count above its matrix's columns, or a total beyond PTRDIFF_MAX bytes of fp32.
 */
ZF_API zf_status zf_packed_layout(const int64_t* rows, const int64_t* cols, const int64_t* selected_counts,
                                  size_t count, int64_t* offsets);

/* packed <- scale * G[:, unselected]. scale: NULL, or a 1-element f32 tensor on the
 * device (the clip coefficient, say); the product is rounded once to packed's dtype. */
ZF_API zf_status zf_pack_columns(const zf_tensor* grads, const zf_tensor* selected, size_t count,
                                 const zf_tensor* packed, const zf_tensor* scale, zf_stream stream);

/* W[:, unselected] <- packed: the inverse of zf_pack_columns (uploads of the host step). */
ZF_API zf_status zf_scatter_columns(const zf_tensor* packed, const zf_tensor* params, const zf_tensor* selected,
                                    size_t count, zf_stream stream);

/*
 * Device side of a selection change, for every matrix i, out of place:
 *
 *   new_state[:, p] = old_state[:, q]   when new_selected[p] == old_selected[q] (staying)
 *   new_state[:, p] = entering[e]       for the e-th entering column (in new_selected, not
 *                                       in old_selected), in ascending column order
 *   leaving[l] = old_state[:, q]        for the l-th leaving column (in old_selected, not in
 *                                       new_selected), in ascending column order
 *
 * for master, exp_avg, exp_avg_sq and steps alike: nothing is reset, nothing rounded.
 *
 *   old_selected[i], new_selected[i]  i32 [k_old_i], [k_new_i], ascending, distinct.
 *   old_state[i]   device layout: master/exp_avg/exp_avg_sq 2-D [m_i, k_old_i], steps [k_old_i].
 *   new_state[i]   device layout [m_i, k_new_i], written; must not overlap old_state.
 *   entering[i]    packed host layout 2-D [E_i, m_i] (each column's m values contiguous),
 *                  steps [E_i], with E_i = |new \ old|; read.
 *   leaving[i]     packed host layout [L_i, m_i], steps [L_i], L_i = |old \ new|; written.
 *   master is present in all four states of matrix i, or empty (numel 0) in all four.
 *
 * The host knows both lists (it downloads new_selected to know what to upload), so it
 * sizes E_i and L_i. On the host, wrong sizes or bad indices fail before anything is
 * written; on CUDA they are not read back: copies beyond the given sizes are skipped.
 * CUDA needs a workspace of *workspace_bytes (query with workspace == NULL first) and
 * runs two launches on `stream`. A copy: deterministic and bitwise equal to the host.
 */
ZF_API zf_status zf_exchange_selected_columns(const zf_tensor* old_selected, const zf_tensor* new_selected,
                                              const zf_column_state* old_state, const zf_column_state* new_state,
                                              const zf_column_state* entering, const zf_column_state* leaving,
                                              size_t count, void* workspace, size_t* workspace_bytes, zf_stream stream);

/*
 * zf_exchange_selected_columns with the entering and leaving columns of all `count` matrices
 * in one packed host-layout state each, instead of one state per matrix: 10 tensors per
 * matrix instead of 18, and the host moves the columns of a whole selection change through
 * two buffers. The move, the other arguments and the CUDA workspace are those of
 * zf_exchange_selected_columns.
 *
 *   entering_counts[i]  host int64: E_i = |new_selected[i] \ old_selected[i]| (the host
 *                       knows both lists, as above).
 *   entering            master/exp_avg/exp_avg_sq: fp32, contiguous, any shape, of
 *                       sum_i E_i * m_i elements; matrix i's E_i columns (ascending column
 *                       order, each column's m_i values contiguous) start at element
 *                       sum_{j<i} E_j * m_j, which is the packed layout of the matrices
 *                       [m_i, E_i] with nothing selected (zf_packed_layout(rows = m, cols =
 *                       E, selected_counts = 0)). steps: i32, contiguous, sum_i E_i values,
 *                       matrix i's from sum_{j<i} E_j. m_i is the rows of old_state[i].
 *   leaving_counts[i], leaving  the same for the L_i leaving columns; written.
 *   master              empty (numel 0): no master moves (a matrix that has one and moves
 *                       columns is an error); otherwise every matrix has a slot at the
 *                       offsets above, and a matrix without a master leaves its slot
 *                       untouched.
 *
 * Validation, errors and determinism as zf_exchange_selected_columns; messages about
 * matrix i's part of the packed buffers name it entering[i] / leaving[i]. A count that does
 * not match the lists fails on the host; on CUDA the lists are not read back.
 */
ZF_API zf_status zf_exchange_selected_columns_packed(const zf_tensor* old_selected, const zf_tensor* new_selected,
                                                     const zf_column_state* old_state, const zf_column_state* new_state,
                                                     const int64_t* entering_counts, const zf_column_state* entering,
                                                     const int64_t* leaving_counts, const zf_column_state* leaving,
                                                     size_t count, void* workspace, size_t* workspace_bytes,
                                                     zf_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZENFLOW_PACK_H_ */
