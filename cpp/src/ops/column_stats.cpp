// zf_column_stats: validation, the host plan, and dispatch to CUDA.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/column_checks.hpp"
#include "common/device_ops.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "ops/column_stats_plan.hpp"
#include "simd/kernels.hpp"
#include "zenflow/norms.h"

namespace zf {
namespace {

// True when some element of a row-major [rows, cols] matrix is Inf or NaN (its exponent
// bits all set), read from the bits: no arithmetic that could overflow.
bool has_nonfinite_element(const void* data, const ColumnStatsMatrix& m) {
  const int64_t count = m.rows * m.cols;
  if (m.dtype == ZF_DTYPE_F32) {
    const auto* bits = static_cast<const uint32_t*>(data);
    for (int64_t i = 0; i < count; ++i) {
      if ((bits[i] & 0x7f800000u) == 0x7f800000u) return true;
    }
    return false;
  }
  const uint16_t exponent = m.dtype == ZF_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
  const auto* bits = static_cast<const uint16_t*>(data);
  for (int64_t i = 0; i < count; ++i) {
    if ((bits[i] & exponent) == exponent) return true;
  }
  return false;
}

}  // namespace

ColumnStatsPlan::ColumnStatsPlan(std::vector<ColumnStatsMatrix> matrices) : matrices_(std::move(matrices)) {
  sum_offsets_.assign(matrices_.size() + 1, 0);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    sum_offsets_[i + 1] = sum_offsets_[i] + static_cast<size_t>(matrices_[i].cols);
  }
  sums_.resize(sum_offsets_.back());
}

// Splits every matrix into column pieces so both a few large and many small matrices
// spread over the pool; each piece goes to the thread whose share of the total work holds
// the piece's middle. The split never changes a column's summation order.
void ColumnStatsPlan::split_for(int threads) {
  constexpr int64_t kMinPieceColumns = 256;
  constexpr int64_t kColumnAlignment = 16;  // whole 64-byte lines of fp32 accumulators
  pieces_.clear();
  int64_t total_work = 0;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const int64_t rows = matrices_[i].rows, cols = matrices_[i].cols;
    if (rows == 0 || cols == 0) continue;
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, cols / kMinPieceColumns));
    int64_t width = (cols + parts - 1) / parts;
    width = (width + kColumnAlignment - 1) / kColumnAlignment * kColumnAlignment;
    for (int64_t begin = 0; begin < cols; begin += width) {
      const int64_t end = std::min(cols, begin + width);
      pieces_.push_back({i, begin, end, rows * (end - begin), 0});
      total_work += rows * (end - begin);
    }
  }
  int64_t work_before = 0;
  for (Piece& piece : pieces_) {
    const int64_t middle = work_before + piece.work / 2;
    piece.owner = static_cast<int>(std::min<int64_t>(threads - 1, middle * threads / std::max<int64_t>(1, total_work)));
    work_before += piece.work;
  }
  pieces_threads_ = threads;
}

void ColumnStatsPlan::run(ThreadPool& pool, const void* const* grads, float* const* col_sq, float* total_sq,
                          int32_t* nonfinite, bool accumulate) {
  const int threads = in_parallel_region() ? 1 : pool.size();
  if (threads != pieces_threads_) split_for(threads);
  std::fill(sums_.begin(), sums_.end(), 0.0);
  const simd::KernelTable& kernels = simd::active_kernels();
  const auto sum_piece = [&](const Piece& piece) {
    const ColumnStatsMatrix& m = matrices_[piece.matrix];
    double* acc = sums_.data() + sum_offsets_[piece.matrix] + piece.col_begin;
    const int64_t cols = piece.col_end - piece.col_begin;
    if (m.dtype == ZF_DTYPE_F32) {
      kernels.column_sq_accumulate_f32(static_cast<const float*>(grads[piece.matrix]) + piece.col_begin, m.rows, cols,
                                       m.cols, acc);
    } else {
      const auto* base = static_cast<const uint16_t*>(grads[piece.matrix]) + piece.col_begin;
      (m.dtype == ZF_DTYPE_BF16 ? kernels.column_sq_accumulate_bf16 : kernels.column_sq_accumulate_f16)(
          base, m.rows, cols, m.cols, acc);
    }
  };
  if (threads == 1) {
    for (const Piece& piece : pieces_) sum_piece(piece);
  } else {
    pool.run([&](int thread, int) {
      for (const Piece& piece : pieces_) {
        if (piece.owner == thread) sum_piece(piece);
      }
    });
  }
  // Serial, fixed-order epilogue: the total never depends on the thread count.
  double total = 0.0;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    float* out = col_sq[i];
    const double* matrix_sums = sums_.data() + sum_offsets_[i];
    for (int64_t j = 0; j < matrices_[i].cols; ++j) {
      total += matrix_sums[j];
      const double value = accumulate ? matrix_sums[j] + static_cast<double>(out[j]) : matrix_sums[j];
      out[j] = static_cast<float>(value);
    }
  }
  // The flag means "some input element is Inf or NaN", on the host and on the device. A
  // finite total proves there is none. A non-finite one usually means there is one, but
  // squares are summed in fp32 within blocks of rows here, so large finite values (above
  // about 1e18) can overflow a block: then the inputs themselves decide (a second read,
  // only on this rare path).
  bool any_nonfinite = !std::isfinite(total);
  if (any_nonfinite) {
    any_nonfinite = false;
    for (size_t i = 0; i < matrices_.size() && !any_nonfinite; ++i) {
      any_nonfinite = has_nonfinite_element(grads[i], matrices_[i]);
    }
  }
  *nonfinite = any_nonfinite ? 1 : 0;
  *total_sq = static_cast<float>(total);
}

namespace {

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
  if (count > 0) check_descriptor(&grads[0], ArgName("grads", 0));
  const zf_device device = count > 0 ? grads[0].device : total_sq->device;
  const ArgName device_source = count > 0 ? ArgName("grads", 0) : ArgName("total_sq");
  check_device_compiled(device, device_source);
  check_same_device(*total_sq, "total_sq", device, device_source);
  check_same_device(*nonfinite, "nonfinite", device, device_source);
  OverlapCheck overlap;
  overlap.reserve(2 * count + 2);
  overlap.add(*total_sq, "total_sq", true);
  overlap.add(*nonfinite, "nonfinite", true);
  for (size_t i = 0; i < count; ++i) {
    const ArgName grad_name("grads", i), out_name("out_col_sq", i);
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
    overlap.add(grads[i], grad_name, false);
    overlap.add(col_sq[i], out_name, true);
  }
  overlap.check();
  return device;
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
      const zf::CudaOps& cuda = zf::cuda_ops();
      const size_t required = cuda.column_stats_workspace_bytes(grads, count);
      if (zf::workspace_query(workspace, workspace_bytes, required)) return;
      cuda.column_stats(grads, col_sq, count, static_cast<float*>(total_sq->data),
                        static_cast<int32_t*>(nonfinite->data), device.index, accumulate, workspace, required, stream);
      return;
    }
    if (zf::workspace_query(workspace, workspace_bytes, 0)) return;
    std::vector<zf::ColumnStatsMatrix> matrices(count);
    std::vector<const void*> grad_data(count);
    std::vector<float*> out_data(count);
    for (size_t i = 0; i < count; ++i) {
      matrices[i] = {grads[i].shape[0], grads[i].shape[1], grads[i].dtype};
      grad_data[i] = grads[i].data;
      out_data[i] = static_cast<float*>(col_sq[i].data);
    }
    zf::ColumnStatsPlan plan(std::move(matrices));
    plan.run(*zf::global_thread_pool(), grad_data.data(), out_data.data(), static_cast<float*>(total_sq->data),
             static_cast<int32_t*>(nonfinite->data), accumulate);
  });
}
