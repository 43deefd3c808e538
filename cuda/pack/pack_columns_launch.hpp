// Host-side entry of the CUDA pack, scatter and selection-exchange kernels (cuda/pack/).
// Plain C++; arguments are validated by the caller (cpp/src/ops/pack_columns.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zenflow/pack.h"

namespace zf {
namespace cuda {

// to_packed: pack (matrices -> packed, times *scale when scale != nullptr); else scatter.
void pack_or_scatter_columns(const zf_tensor* matrices, const zf_tensor* selected, size_t count,
                             const zf_tensor& packed, const float* scale, bool to_packed, zf_stream stream);

size_t exchange_workspace_bytes(const zf_tensor* old_selected, const zf_tensor* new_selected, size_t count);

void exchange_selected_columns(const zf_tensor* old_selected, const zf_tensor* new_selected,
                               const zf_column_state* old_state, const zf_column_state* new_state,
                               const zf_column_state* entering, const zf_column_state* leaving, size_t count,
                               void* workspace, size_t workspace_bytes, zf_stream stream);

}  // namespace cuda
}  // namespace zf
