// The host plan of zf_adamw_selected_columns: shapes, dtypes and the selection validated
// once (the engine builds it per selection), then run every step with fresh pointers.
#pragma once

#include <cstdint>
#include <vector>

#include "common/adam_math.hpp"
#include "common/thread_pool.hpp"
#include "zenflow/optim.h"

namespace zf {

struct AdamwSelectedMatrix {
  int64_t rows;
  int64_t cols;
  int64_t k;  // selected columns (cols when dense)
  zf_dtype param_dtype;
  zf_dtype grad_dtype;
  bool has_master;
};

// Pointers of one matrix for one run. selected == nullptr: every column (dense).
struct AdamwSelectedPointers {
  void* param;
  const void* grad;  // [rows, cols] like the parameter, or compact (grad_compact)
  const int32_t* selected;
  float* master;  // nullptr when the plan's matrix has no master
  float* exp_avg;
  float* exp_avg_sq;
  int32_t* steps;
  double lr;
  double weight_decay;
  // true: `grad` holds only the selected columns, in pack.h's layout ([k, rows]: column c's
  // rows contiguous), as the engine copies them when it releases a gradient
  // (release_gradients).
  bool grad_compact = false;
};

class AdamwSelectedPlan {
 public:
  AdamwSelectedPlan(std::vector<AdamwSelectedMatrix> matrices, const zf_adam_hparams& hparams);

  // One step on every matrix; grad_scale multiplies every gradient. Steps are incremented
  // (the caller has checked they can be). Elementwise: bitwise identical for any pool size.
  void run(ThreadPool& pool, const AdamwSelectedPointers* pointers, float grad_scale);

  size_t size() const { return matrices_.size(); }
  const std::vector<AdamwSelectedMatrix>& matrices() const { return matrices_; }
  const zf_adam_hparams& hparams() const { return hparams_; }
  // The betas and eps of later runs (the engine's per-step hyper-parameters; checked by the
  // caller with check_adam_hparams).
  void set_hparams(const zf_adam_hparams& hparams) { hparams_ = hparams; }

 private:
  std::vector<AdamwSelectedMatrix> matrices_;
  zf_adam_hparams hparams_;
  std::vector<int64_t> work_offsets_;   // matrix i's rows * k elements start here
  std::vector<size_t> scalar_offsets_;  // matrix i's k column scalars start here
  std::vector<AdamStepScalars> scalars_;
};

}  // namespace zf
