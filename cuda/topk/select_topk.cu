// Host launcher of the CUDA segmented top-k (kernel in select_topk_kernel.cuh).
#include <algorithm>
#include <vector>

#include "cuda/common/cuda_check.cuh"
#include "cuda/topk/select_topk_kernel.cuh"
#include "cuda/topk/select_topk_launch.hpp"

namespace zf {
namespace cuda {

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
  for (size_t begin = 0; begin < segments.size(); begin += kTopkMaxSegmentsPerLaunch) {
    const size_t end = std::min(segments.size(), begin + kTopkMaxSegmentsPerLaunch);
    TopkLaunchTable table{};
    std::copy(segments.begin() + begin, segments.begin() + end, table.segments);
    select_topk_kernel<<<static_cast<unsigned>(end - begin), kTopkThreads, 0, cuda_stream>>>(table);
    check_launch("select_topk_kernel");
  }
}

}  // namespace cuda
}  // namespace zf
