// Host launcher of the CUDA segmented top-k (kernel in select_topk_kernel.cuh), registered in
// the CUDA launcher table (common/device_ops.hpp).
#include <algorithm>
#include <vector>

#include "common/device_ops.hpp"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/multi_tensor.cuh"
#include "cuda/topk/select_topk_kernel.cuh"

namespace zf {
namespace cuda {
namespace {

size_t select_topk_workspace_bytes(const zf_tensor*, const zf_tensor*, size_t) { return 0; }

void select_topk_columns(const zf_tensor* scores, const zf_tensor* out_indices, size_t count, void*, size_t,
                         zf_stream stream) {
  std::vector<TopkSegment> segments;
  for (size_t i = 0; i < count; ++i) {
    const int64_t k = out_indices[i].shape[0];
    if (k == 0) continue;  // nothing to write (a NaN there goes unreported, see topk.h)
    segments.push_back(TopkSegment{static_cast<const float*>(scores[i].data),
                                   static_cast<int32_t*>(out_indices[i].data), static_cast<int32_t>(scores[i].shape[0]),
                                   static_cast<int32_t>(k)});
  }
  if (segments.empty()) return;
  const ScopedDevice device_guard(scores[0].device.index);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_launch_batch(segments.size(), kTopkMaxSegmentsPerLaunch, [&](size_t begin, size_t end) {
    TopkLaunchTable table{};
    std::copy(segments.begin() + begin, segments.begin() + end, table.segments);
    select_topk_kernel<<<static_cast<unsigned>(end - begin), kTopkThreads, 0, cuda_stream>>>(table);
    check_launch("select_topk_kernel");
  });
}

const bool registered = [] {
  cuda_ops().select_topk_workspace_bytes = &select_topk_workspace_bytes;
  cuda_ops().select_topk_columns = &select_topk_columns;
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace zf
