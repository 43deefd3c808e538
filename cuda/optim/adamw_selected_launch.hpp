// Host-side entry of the CUDA AdamW on selected columns (cuda/optim/). Plain C++; the
// arguments are validated by the caller (cpp/src/ops/adamw_selected.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zenflow/optim.h"

namespace zf {
namespace cuda {

void adamw_selected_columns(const zf_tensor* params, const zf_tensor* grads, const zf_tensor* selected,
                            const zf_column_state* state, const double* lr, const double* weight_decay, size_t count,
                            zf_adamw_options options, const float* grad_scale, const int32_t* noop, zf_stream stream);

}  // namespace cuda
}  // namespace zf
