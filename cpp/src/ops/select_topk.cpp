// zf_select_topk_columns: validation and the host implementation.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/column_checks.hpp"
#include "common/device_ops.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "ops/select_topk_plan.hpp"
#include "zenflow/topk.h"

namespace zf {
namespace {

zf_device validate(const zf_tensor* scores, const zf_tensor* out_indices, size_t count) {
  require(count == 0 || (scores != nullptr && out_indices != nullptr), ZF_ERROR_INVALID_VALUE,
          "col_sq/out_indices: NULL array with count=", count);
  if (count == 0) return zf_device{ZF_DEVICE_CPU, 0};
  const ArgName device_source("col_sq", 0);
  check_descriptor(&scores[0], device_source);
  const zf_device device = scores[0].device;
  check_device_compiled(device, device_source);
  OverlapCheck overlap;
  overlap.reserve(2 * count);
  for (size_t i = 0; i < count; ++i) {
    const ArgName score_name("col_sq", i), out_name("out_indices", i);
    check_descriptor(&scores[i], score_name);
    check_dtype(scores[i], score_name, {ZF_DTYPE_F32});
    check_ndim(scores[i], score_name, 1);
    check_contiguous(scores[i], score_name);
    check_same_device(scores[i], score_name, device, device_source);
    check_descriptor(&out_indices[i], out_name);
    check_dtype(out_indices[i], out_name, {ZF_DTYPE_I32});
    check_ndim(out_indices[i], out_name, 1);
    check_contiguous(out_indices[i], out_name);
    check_same_device(out_indices[i], out_name, device, device_source);
    require(out_indices[i].shape[0] <= scores[i].shape[0], ZF_ERROR_INVALID_VALUE, out_name,
            ": k=", out_indices[i].shape[0], " is larger than the ", scores[i].shape[0], " columns of ", score_name);
    require(scores[i].shape[0] <= INT32_MAX, ZF_ERROR_INVALID_VALUE, score_name,
            ": more columns than int32 indices can address");
    overlap.add(scores[i], score_name, false);
    overlap.add(out_indices[i], out_name, true);
  }
  overlap.check();
  return device;
}

// The k best columns under the strict total order (score descending, index ascending),
// returned ascending. The order is total, so the set is unique whatever the algorithm.
void select_one(const float* score, int64_t n, int64_t k, int32_t* out, std::vector<int32_t>& order) {
  if (k == 0) return;
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (k < n) {
    const auto better = [score](int32_t a, int32_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    };
    std::nth_element(order.begin(), order.begin() + k, order.end(), better);
    std::sort(order.begin(), order.begin() + k);
  }
  std::copy(order.begin(), order.begin() + k, out);
}

}  // namespace

void SelectTopkPlan::run(ThreadPool& pool, const float* const* scores, int32_t* const* out_indices) const {
  // Every score is checked before any index is written: a NaN fails the whole call.
  for (size_t i = 0; i < vectors_.size(); ++i) {
    const float* values = scores[i];
    for (int64_t j = 0; j < vectors_[i].n; ++j) {
      if (std::isnan(values[j])) {
        fail(ZF_ERROR_INVALID_VALUE, ArgName("col_sq", i), ": NaN score at column ", j, " (non-finite gradient?)");
      }
    }
  }
  pool.run([&](int thread, int threads) {
    std::vector<int32_t> order;
    for (size_t i = static_cast<size_t>(thread); i < vectors_.size(); i += static_cast<size_t>(threads)) {
      select_one(scores[i], vectors_[i].n, vectors_[i].k, out_indices[i], order);
    }
  });
}

}  // namespace zf

extern "C" ZF_API zf_status zf_select_topk_columns(const zf_tensor* scores, const zf_tensor* out_indices, size_t count,
                                                   void* workspace, size_t* workspace_bytes, zf_stream stream) {
  return zf::api_call([&] {
    const zf_device device = zf::validate(scores, out_indices, count);
    if (device.type == ZF_DEVICE_CUDA) {
      const zf::CudaOps& cuda = zf::cuda_ops();
      const size_t required = cuda.select_topk_workspace_bytes(scores, out_indices, count);
      if (zf::workspace_query(workspace, workspace_bytes, required)) return;
      cuda.select_topk_columns(scores, out_indices, count, workspace, required, stream);
      return;
    }
    if (zf::workspace_query(workspace, workspace_bytes, 0)) return;
    std::vector<zf::TopkVector> vectors(count);
    std::vector<const float*> score_data(count);
    std::vector<int32_t*> out_data(count);
    for (size_t i = 0; i < count; ++i) {
      vectors[i] = {scores[i].shape[0], out_indices[i].shape[0]};
      score_data[i] = static_cast<const float*>(scores[i].data);
      out_data[i] = static_cast<int32_t*>(out_indices[i].data);
    }
    zf::SelectTopkPlan(std::move(vectors)).run(*zf::global_thread_pool(), score_data.data(), out_data.data());
  });
}
