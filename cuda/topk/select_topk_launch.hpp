// Host-side entry of the CUDA segmented top-k (cuda/topk/). Plain C++; arguments are
// validated by the caller.
#pragma once

#include <cstddef>

#include "zenflow/zenflow.h"

namespace zf {
namespace cuda {

size_t select_topk_workspace_bytes(const zf_tensor* scores, const zf_tensor* out_indices, size_t count);

void select_topk_columns(const zf_tensor* scores, const zf_tensor* out_indices, size_t count, void* workspace,
                         size_t workspace_bytes, zf_stream stream);

}  // namespace cuda
}  // namespace zf
