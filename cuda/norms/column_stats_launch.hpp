// Host-side entry of the CUDA column statistics (cuda/norms/column_stats.cu). Plain C++:
// the core includes it without CUDA headers. Arguments are validated by the caller.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zenflow/zenflow.h"

namespace zf {
namespace cuda {

size_t column_stats_workspace_bytes(const zf_tensor* grads, size_t count);

// `device`: the CUDA ordinal every tensor of the call lives on (validated by the caller).
void column_stats(const zf_tensor* grads, const zf_tensor* col_sq, size_t count, float* total_sq, int32_t* nonfinite,
                  int device, bool accumulate, void* workspace, size_t workspace_bytes, zf_stream stream);

}  // namespace cuda
}  // namespace zf
