// zf_column_stats: validation, the host implementation, and dispatch to CUDA.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "ops/device_dispatch.hpp"
#include "simd/kernels.hpp"
#include "zenflow/norms.h"

#if defined(ZENFLOW_WITH_CUDA)
#include "cuda/norms/column_stats_launch.hpp"
#endif

namespace zf {
namespace {

struct ColumnPiece {
  size_t matrix;
  int64_t col_begin;
  int64_t col_end;
  int64_t work;  // elements read
};

zf_device validate(const zf_tensor* grads, const zf_tensor* col_sq, size_t count, const zf_tensor* total_sq,
                   const zf_tensor* nonfinite, uint32_t flags) {
  require(count == 0 || (grads != nullptr && col_sq != nullptr), ZF_ERROR_INVALID_VALUE,
          "grads/out_col_sq: NULL array with count=", count);
  require((flags & ~ZF_COLUMN_STATS_ACCUMULATE) == 0, ZF_ERROR_INVALID_VALUE, "flags: unknown bits ", flags);
  check_descriptor(total_sq, "total_sq");
  check_dtype(*total_sq, "total_sq", {ZF_DTYPE_F32});
  check_numel(*total_sq, "total_sq", 1);
  check_descriptor(nonfinite, "nonfinite");
  check_dtype(*nonfinite, "nonfinite", {ZF_DTYPE_I32});
  check_numel(*nonfinite, "nonfinite", 1);
  const zf_device device = count > 0 ? grads[0].device : total_sq->device;
  const std::string device_source = count > 0 ? "grads[0]" : "total_sq";
  check_device_compiled(device, device_source);
  check_same_device(*total_sq, "total_sq", device, device_source);
  check_same_device(*nonfinite, "nonfinite", device, device_source);
  for (size_t i = 0; i < count; ++i) {
    const std::string grad_name = arg_name("grads", i);
    const std::string out_name = arg_name("out_col_sq", i);
    check_descriptor(&grads[i], grad_name);
    check_dtype(grads[i], grad_name, {ZF_DTYPE_F32, ZF_DTYPE_F16, ZF_DTYPE_BF16});
    check_ndim(grads[i], grad_name, 2);
    check_contiguous(grads[i], grad_name);
    check_same_device(grads[i], grad_name, device, device_source);
    check_descriptor(&col_sq[i], out_name);
    check_dtype(col_sq[i], out_name, {ZF_DTYPE_F32});
    check_ndim(col_sq[i], out_name, 1);
    check_contiguous(col_sq[i], out_name);
    check_same_device(col_sq[i], out_name, device, device_source);
    require(col_sq[i].shape[0] == grads[i].shape[1], ZF_ERROR_INVALID_VALUE, out_name, ": has ", col_sq[i].shape[0],
            " elements but ", grad_name, " has ", grads[i].shape[1], " columns");
  }
  return device;
}

// Splits every matrix into column pieces so both a few large and many small matrices
// spread over the pool. The split never changes a column's summation order.
std::vector<ColumnPiece> make_pieces(const zf_tensor* grads, size_t count, int threads) {
  constexpr int64_t kMinPieceColumns = 256;
  constexpr int64_t kColumnAlignment = 16;  // whole 64-byte lines of fp32 accumulators
  std::vector<ColumnPiece> pieces;
  for (size_t i = 0; i < count; ++i) {
    const int64_t rows = grads[i].shape[0], cols = grads[i].shape[1];
    if (rows == 0 || cols == 0) continue;
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, cols / kMinPieceColumns));
    int64_t width = (cols + parts - 1) / parts;
    width = (width + kColumnAlignment - 1) / kColumnAlignment * kColumnAlignment;
    for (int64_t begin = 0; begin < cols; begin += width) {
      const int64_t end = std::min(cols, begin + width);
      pieces.push_back({i, begin, end, rows * (end - begin)});
    }
  }
  return pieces;
}

void accumulate_piece(const zf_tensor& grad, const ColumnPiece& piece, double* acc) {
  const auto& kernels = simd::active_kernels();
  const int64_t rows = grad.shape[0], stride = grad.shape[1], cols = piece.col_end - piece.col_begin;
  switch (grad.dtype) {
    case ZF_DTYPE_F32:
      kernels.column_sq_accumulate_f32(static_cast<const float*>(grad.data) + piece.col_begin, rows, cols, stride, acc);
      break;
    case ZF_DTYPE_BF16:
      kernels.column_sq_accumulate_bf16(static_cast<const uint16_t*>(grad.data) + piece.col_begin, rows, cols, stride,
                                        acc);
      break;
    case ZF_DTYPE_F16:
      kernels.column_sq_accumulate_f16(static_cast<const uint16_t*>(grad.data) + piece.col_begin, rows, cols, stride,
                                       acc);
      break;
    default:
      fail(ZF_ERROR_INTERNAL, "column_stats: unexpected dtype");
  }
}

void column_stats_host(const zf_tensor* grads, const zf_tensor* col_sq, size_t count, const zf_tensor* total_sq,
                       const zf_tensor* nonfinite, bool accumulate) {
  std::vector<size_t> offsets(count + 1, 0);
  for (size_t i = 0; i < count; ++i) offsets[i + 1] = offsets[i] + static_cast<size_t>(grads[i].shape[1]);
  std::vector<double> sums(offsets[count], 0.0);

  const std::shared_ptr<ThreadPool> pool_owner = global_thread_pool();
  ThreadPool& pool = *pool_owner;
  const std::vector<ColumnPiece> pieces = make_pieces(grads, count, pool.size());
  int64_t total_work = 0;
  for (const auto& piece : pieces) total_work += piece.work;
  // Each piece goes to the thread whose share of the total work holds the piece's middle.
  std::vector<int> owner(pieces.size());
  int64_t work_before = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const int64_t middle = work_before + pieces[p].work / 2;
    owner[p] =
        static_cast<int>(std::min<int64_t>(pool.size() - 1, middle * pool.size() / std::max<int64_t>(1, total_work)));
    work_before += pieces[p].work;
  }
  pool.run([&](int thread, int) {
    for (size_t p = 0; p < pieces.size(); ++p) {
      if (owner[p] != thread) continue;
      const ColumnPiece& piece = pieces[p];
      accumulate_piece(grads[piece.matrix], piece, sums.data() + offsets[piece.matrix] + piece.col_begin);
    }
  });

  // Serial, fixed-order epilogue: the total never depends on the thread count.
  double total = 0.0;
  for (size_t i = 0; i < count; ++i) {
    float* out = static_cast<float*>(col_sq[i].data);
    const double* matrix_sums = sums.data() + offsets[i];
    for (int64_t j = 0; j < grads[i].shape[1]; ++j) {
      total += matrix_sums[j];
      const double value = accumulate ? matrix_sums[j] + static_cast<double>(out[j]) : matrix_sums[j];
      out[j] = static_cast<float>(value);
    }
  }
  // Squares of finite fp32 values cannot overflow fp64 in any realistic sum, so a
  // non-finite fp64 total means a non-finite input element.
  *static_cast<int32_t*>(nonfinite->data) = std::isfinite(total) ? 0 : 1;
  *static_cast<float*>(total_sq->data) = static_cast<float>(total);
}

}  // namespace
}  // namespace zf

extern "C" ZF_API zf_status zf_column_stats(const zf_tensor* grads, const zf_tensor* col_sq, size_t count,
                                            const zf_tensor* total_sq, const zf_tensor* nonfinite, uint32_t flags,
                                            void* workspace, size_t* workspace_bytes, zf_stream stream) {
  return zf::api_call([&] {
    const zf_device device = zf::validate(grads, col_sq, count, total_sq, nonfinite, flags);
    const bool accumulate = (flags & ZF_COLUMN_STATS_ACCUMULATE) != 0;
    if (device.type == ZF_DEVICE_CUDA) {
#if defined(ZENFLOW_WITH_CUDA)
      const size_t required = zf::cuda::column_stats_workspace_bytes(grads, count);
      if (zf::workspace_query(workspace, workspace_bytes, required)) return;
      zf::cuda::column_stats(grads, col_sq, count, static_cast<float*>(total_sq->data),
                             static_cast<int32_t*>(nonfinite->data), device.index, accumulate, workspace, required,
                             stream);
#endif
      return;
    }
    if (zf::workspace_query(workspace, workspace_bytes, 0)) return;
    zf::column_stats_host(grads, col_sq, count, total_sq, nonfinite, accumulate);
  });
}
