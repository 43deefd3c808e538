// zf_select_topk_columns: validation and the host implementation.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "ops/device_dispatch.hpp"
#include "zenflow/topk.h"

#if defined(ZENFLOW_WITH_CUDA)
#include "cuda/topk/select_topk_launch.hpp"
#endif

namespace zf {
namespace {

zf_device validate(const zf_tensor* scores, const zf_tensor* out_indices, size_t count) {
  require(count == 0 || (scores != nullptr && out_indices != nullptr), ZF_ERROR_INVALID_VALUE,
          "col_sq/out_indices: NULL array with count=", count);
  if (count == 0) return zf_device{ZF_DEVICE_CPU, 0};
  check_descriptor(&scores[0], "col_sq[0]");
  const zf_device device = scores[0].device;
  check_device_compiled(device, "col_sq[0]");
  for (size_t i = 0; i < count; ++i) {
    const std::string score_name = arg_name("col_sq", i);
    const std::string out_name = arg_name("out_indices", i);
    check_descriptor(&scores[i], score_name);
    check_dtype(scores[i], score_name, {ZF_DTYPE_F32});
    check_ndim(scores[i], score_name, 1);
    check_contiguous(scores[i], score_name);
    check_same_device(scores[i], score_name, device, "col_sq[0]");
    check_descriptor(&out_indices[i], out_name);
    check_dtype(out_indices[i], out_name, {ZF_DTYPE_I32});
    check_ndim(out_indices[i], out_name, 1);
    check_contiguous(out_indices[i], out_name);
    check_same_device(out_indices[i], out_name, device, "col_sq[0]");
    require(out_indices[i].shape[0] <= scores[i].shape[0], ZF_ERROR_INVALID_VALUE, out_name,
            ": k=", out_indices[i].shape[0], " is larger than the ", scores[i].shape[0], " columns of ", score_name);
    require(scores[i].shape[0] <= INT32_MAX, ZF_ERROR_INVALID_VALUE, score_name,
            ": more columns than int32 indices can address");
  }
  return device;
}

void check_no_nan(const zf_tensor* scores, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float* values = static_cast<const float*>(scores[i].data);
    for (int64_t j = 0; j < scores[i].shape[0]; ++j) {
      require(!std::isnan(values[j]), ZF_ERROR_INVALID_VALUE, arg_name("col_sq", i), ": NaN score at column ", j,
              " (non-finite gradient?)");
    }
  }
}

// The k best columns under the strict total order (score descending, index ascending),
// returned ascending. The order is total, so the set is unique whatever the algorithm.
void select_one(const float* score, int64_t n, int64_t k, int32_t* out) {
  if (k == 0) return;
  std::vector<int32_t> order(static_cast<size_t>(n));
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

void select_topk_host(const zf_tensor* scores, const zf_tensor* out_indices, size_t count) {
  check_no_nan(scores, count);
  global_thread_pool()->run([&](int thread, int threads) {
    for (size_t i = static_cast<size_t>(thread); i < count; i += static_cast<size_t>(threads)) {
      select_one(static_cast<const float*>(scores[i].data), scores[i].shape[0], out_indices[i].shape[0],
                 static_cast<int32_t*>(out_indices[i].data));
    }
  });
}

}  // namespace
}  // namespace zf

extern "C" ZF_API zf_status zf_select_topk_columns(const zf_tensor* scores, const zf_tensor* out_indices, size_t count,
                                                   void* workspace, size_t* workspace_bytes, zf_stream stream) {
  return zf::api_call([&] {
    const zf_device device = zf::validate(scores, out_indices, count);
    if (device.type == ZF_DEVICE_CUDA) {
#if defined(ZENFLOW_WITH_CUDA)
      const size_t required = zf::cuda::select_topk_workspace_bytes(scores, out_indices, count);
      if (zf::workspace_query(workspace, workspace_bytes, required)) return;
      zf::cuda::select_topk_columns(scores, out_indices, count, workspace, required, stream);
#endif
      return;
    }
    if (zf::workspace_query(workspace, workspace_bytes, 0)) return;
    zf::select_topk_host(scores, out_indices, count);
  });
}
