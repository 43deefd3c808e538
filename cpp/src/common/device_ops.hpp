// The CUDA launchers, as a table that cuda/ fills at load time (a static registrar in each
// launcher's .cu file, as PyTorch's DispatchStub does). The op entry points in
// cpp/src/ops look the launchers up here, so they include no cuda/ header and need no
// #if: in a build without CUDA the table stays empty and a CUDA tensor gets a clear
// NOT_SUPPORTED error. Arguments reaching a launcher are validated already.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/packed_layout.hpp"
#include "common/tensor.hpp"
#include "zenflow/optim.h"

namespace zf {

class Backend;  // engine/backend.hpp

// The words of every error about a CUDA tensor in a build without CUDA, with
// zf_cuda_build_note() between them: what is missing, why, and how to get it.
constexpr const char* kNoCudaBuild = "this build of libzenflow has no CUDA";
constexpr const char* kRebuildWithCuda =
    "Rebuild with nvcc on PATH and ZENFLOW_WITH_CUDA=1 (pip install --no-cache-dir --force-reinstall . from the "
    "source tree); `python -m zenflow info` shows what the installed build has";

// Everything one zf_adamw_selected_columns call needs, validated.
struct AdamwSelectedArgs {
  const zf_tensor* params;
  const zf_tensor* grads;
  const zf_tensor* selected;  // nullptr: dense
  const zf_column_state* state;
  size_t count;
  const double* lr;
  const double* weight_decay;
  const float* lr_device;  // nullptr, or [count] learning rates read when the work runs
  zf_adam_hparams hparams;
  const float* grad_scale;  // nullptr: 1
  const int32_t* noop;      // nullptr: never skip
  int device;
  // nullptr, or per matrix 1 where grads[i] holds only its selected columns in pack.h's
  // layout ([k, rows]; the engine's compact copy under release_gradients), else 0.
  const uint8_t* grads_compact = nullptr;
};

struct CudaOps {
  size_t (*column_stats_workspace_bytes)(const zf_tensor* grads, size_t count) = nullptr;
  void (*column_stats)(const zf_tensor* grads, const zf_tensor* col_sq, size_t count, float* total_sq,
                       int32_t* nonfinite, int device, bool accumulate, void* workspace, size_t workspace_bytes,
                       zf_stream stream) = nullptr;
  size_t (*select_topk_workspace_bytes)(const zf_tensor* scores, const zf_tensor* out_indices, size_t count) = nullptr;
  void (*select_topk_columns)(const zf_tensor* scores, const zf_tensor* out_indices, size_t count, void* workspace,
                              size_t workspace_bytes, zf_stream stream) = nullptr;
  void (*adamw_selected_columns)(const AdamwSelectedArgs& args, zf_stream stream) = nullptr;
  // to_packed: pack (matrices -> packed, times *scale when scale != nullptr); else scatter.
  void (*pack_or_scatter_columns)(const zf_tensor* matrices, const zf_tensor* selected, const PackedLayout& layout,
                                  const zf_tensor& packed, const float* scale, bool to_packed,
                                  zf_stream stream) = nullptr;
  size_t (*exchange_workspace_bytes)(const zf_tensor* old_selected, const zf_tensor* new_selected,
                                     size_t count) = nullptr;
  void (*exchange_selected_columns)(const zf_tensor* old_selected, const zf_tensor* new_selected,
                                    const zf_column_state* old_state, const zf_column_state* new_state,
                                    const zf_column_state* entering, const zf_column_state* leaving, size_t count,
                                    void* workspace, size_t workspace_bytes, zf_stream stream) = nullptr;
  // The engine's CUDA backend for a device (cuda/engine/cuda_backend.cu); the caller owns it.
  Backend* (*make_engine_backend)(int device, int host_threads) = nullptr;
};

// The table; registrars write it during static initialisation, ops read it afterwards.
CudaOps& cuda_ops();

// Fails with NOT_SUPPORTED for CUDA tensors in a build without CUDA, and with
// INVALID_VALUE for a bad device index.
void check_device_compiled(const zf_device& device, const ArgName& name);

// Query-then-run: returns true when the call is only a size query (workspace == NULL and
// workspace_bytes != NULL), after storing `required` there. Otherwise checks that a
// non-zero requirement is met by the workspace given.
bool workspace_query(void* workspace, size_t* workspace_bytes, size_t required);

}  // namespace zf
