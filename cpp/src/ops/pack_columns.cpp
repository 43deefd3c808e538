// zf_pack_columns, zf_scatter_columns and zf_exchange_selected_columns: validation, the
// host twins, and dispatch to CUDA.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/column_index.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "ops/column_ops.hpp"
#include "ops/device_dispatch.hpp"
#include "zenflow/pack.h"

#if defined(ZENFLOW_WITH_CUDA)
#include "cuda/pack/pack_columns_launch.hpp"
#endif

namespace zf {
namespace {

// ---- pack and scatter ---------------------------------------------------------------------

zf_device validate_pack(const zf_tensor* matrices, const char* matrix_label, const zf_tensor* selected, size_t count,
                        const zf_tensor* packed, const zf_tensor* scale) {
  require(count == 0 || matrices != nullptr, ZF_ERROR_INVALID_VALUE, matrix_label, ": NULL array with count=", count);
  check_descriptor(packed, "packed");
  const zf_device device = packed->device;
  check_device_compiled(device, "packed");
  check_dtype(*packed, "packed", {ZF_DTYPE_F32, ZF_DTYPE_F16, ZF_DTYPE_BF16});
  check_ndim(*packed, "packed", 1);
  check_contiguous(*packed, "packed");
  if (scale != nullptr) check_state_tensor(*scale, "scale", ZF_DTYPE_F32, 1, device, "packed");
  int64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    const MatrixView view = check_float_matrix(&matrices[i], arg_name(matrix_label, i), device, "packed");
    const int64_t k = selected ? check_selected(&selected[i], arg_name("selected", i), view.cols, device, "packed") : 0;
    total += view.rows * (view.cols - k);
  }
  require(packed->shape[0] == total, ZF_ERROR_INVALID_VALUE, "packed: has ", packed->shape[0],
          " elements, but the unselected columns hold ", total);
  return device;
}

// Blocks of unselected columns, each written (pack) or read (scatter) as whole contiguous
// packed columns while the matrix is walked row by row.
constexpr int64_t kHostColumnBlock = 64;

void pack_or_scatter_host(const zf_tensor* matrices, const zf_tensor* selected, size_t count, const zf_tensor& packed,
                          const float* scale_ptr, bool to_packed) {
  struct Block {
    size_t matrix;
    int64_t first, last;  // unselected-column range
  };
  std::vector<int64_t> offsets(count, 0);
  std::vector<Block> blocks;
  int64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    const MatrixView view = matrix_view(matrices[i]);
    const int64_t k = selected ? selected[i].shape[0] : 0;
    const int64_t unselected = view.cols - k;
    offsets[i] = offset;
    offset += view.rows * unselected;
    if (view.rows == 0) continue;
    for (int64_t j = 0; j < unselected; j += kHostColumnBlock) {
      blocks.push_back({i, j, std::min(unselected, j + kHostColumnBlock)});
    }
  }
  const float scale = scale_ptr ? *scale_ptr : 1.0f;
  global_thread_pool()->run([&](int thread, int threads) {
    int64_t begin, end;
    split_range(0, static_cast<int64_t>(blocks.size()), thread, threads, &begin, &end);
    int64_t columns[kHostColumnBlock];
    for (int64_t b = begin; b < end; ++b) {
      const Block& block = blocks[static_cast<size_t>(b)];
      const zf_tensor& matrix = matrices[block.matrix];
      const MatrixView view = matrix_view(matrix);
      const int32_t* sel = selected ? static_cast<const int32_t*>(selected[block.matrix].data) : nullptr;
      const int32_t k = selected ? static_cast<int32_t>(selected[block.matrix].shape[0]) : 0;
      const int64_t width = block.last - block.first;
      for (int64_t j = 0; j < width; ++j) columns[j] = unselected_column(sel, k, block.first + j);
      for (int64_t r = 0; r < view.rows; ++r) {
        for (int64_t j = 0; j < width; ++j) {
          const int64_t element = row_major_index(view.cols, r, columns[j]);
          const int64_t slot = packed_index(offsets[block.matrix], view.rows, block.first + j, r);
          if (to_packed) {
            store_from_float(packed.data, packed.dtype, slot,
                             load_as_float(matrix.data, matrix.dtype, element) * scale);
          } else {
            store_from_float(matrix.data, matrix.dtype, element, load_as_float(packed.data, packed.dtype, slot));
          }
        }
      }
    }
  });
}

// ---- selection exchange -------------------------------------------------------------------

struct ExchangeShape {
  int64_t rows, k_old, k_new, entering, leaving;
  bool master;
};

void check_state_layout(const zf_column_state& s, const std::string& name, int64_t first, int64_t second,
                        bool master_expected, const zf_device& device) {
  const std::string shape_hint = "expected [" + std::to_string(first) + ", " + std::to_string(second) + "]";
  const bool has_master = check_master(s.master, name + ".master", first * second, device, "old_selected[0]");
  require(has_master == master_expected || first * second == 0, ZF_ERROR_INVALID_VALUE, name,
          ".master: present in some states of this matrix and absent in others");
  for (const auto& [tensor, label] : {std::pair<const zf_tensor*, const char*>{&s.exp_avg, ".exp_avg"},
                                      std::pair<const zf_tensor*, const char*>{&s.exp_avg_sq, ".exp_avg_sq"}}) {
    check_state_tensor(*tensor, name + label, ZF_DTYPE_F32, first * second, device, "old_selected[0]");
    require(tensor->ndim == 2 && tensor->shape[0] == first && tensor->shape[1] == second, ZF_ERROR_INVALID_VALUE, name,
            label, ": ", shape_hint);
  }
  if (has_master) {
    require(s.master.ndim == 2 && s.master.shape[0] == first && s.master.shape[1] == second, ZF_ERROR_INVALID_VALUE,
            name, ".master: ", shape_hint);
  }
}

// Staying/entering/leaving sets of one matrix from its two ascending lists (host tensors).
void count_moves(const int32_t* old_sel, int64_t k_old, const int32_t* new_sel, int64_t k_new, int64_t* entering,
                 int64_t* leaving) {
  int64_t staying = 0;
  for (int64_t a = 0, b = 0; a < k_old && b < k_new;) {
    if (old_sel[a] == new_sel[b]) {
      ++staying, ++a, ++b;
    } else if (old_sel[a] < new_sel[b]) {
      ++a;
    } else {
      ++b;
    }
  }
  *entering = k_new - staying;
  *leaving = k_old - staying;
}

std::vector<ExchangeShape> validate_exchange(const zf_tensor* old_selected, const zf_tensor* new_selected,
                                             const zf_column_state* old_state, const zf_column_state* new_state,
                                             const zf_column_state* entering, const zf_column_state* leaving,
                                             size_t count, zf_device* device_out) {
  require(count == 0 || (old_selected && new_selected && old_state && new_state && entering && leaving),
          ZF_ERROR_INVALID_VALUE, "exchange: NULL array with count=", count);
  std::vector<ExchangeShape> shapes;
  zf_device device{ZF_DEVICE_CPU, 0};
  if (count > 0) {
    check_descriptor(&old_selected[0], "old_selected[0]");
    device = old_selected[0].device;
  }
  check_device_compiled(device, "old_selected[0]");
  for (size_t i = 0; i < count; ++i) {
    ExchangeShape s{};
    const std::string old_name = arg_name("old_state", i);
    check_descriptor(&old_state[i].exp_avg, old_name + ".exp_avg");
    check_ndim(old_state[i].exp_avg, old_name + ".exp_avg", 2);
    s.rows = old_state[i].exp_avg.shape[0];
    const int64_t n_limit = INT32_MAX;
    s.k_old = check_selected(&old_selected[i], arg_name("old_selected", i), n_limit, device, "old_selected[0]");
    s.k_new = check_selected(&new_selected[i], arg_name("new_selected", i), n_limit, device, "old_selected[0]");
    check_descriptor(&entering[i].steps, arg_name("entering", i) + ".steps");
    check_descriptor(&leaving[i].steps, arg_name("leaving", i) + ".steps");
    check_state_tensor(entering[i].steps, arg_name("entering", i) + ".steps", ZF_DTYPE_I32, numel(entering[i].steps),
                       device, "old_selected[0]");
    check_state_tensor(leaving[i].steps, arg_name("leaving", i) + ".steps", ZF_DTYPE_I32, numel(leaving[i].steps),
                       device, "old_selected[0]");
    s.entering = numel(entering[i].steps);
    s.leaving = numel(leaving[i].steps);
    s.master = numel(old_state[i].master) > 0 || numel(new_state[i].master) > 0;
    check_state_layout(old_state[i], old_name, s.rows, s.k_old, s.master, device);
    check_state_layout(new_state[i], arg_name("new_state", i), s.rows, s.k_new, s.master, device);
    check_state_layout(entering[i], arg_name("entering", i), s.entering, s.rows, s.master, device);
    check_state_layout(leaving[i], arg_name("leaving", i), s.leaving, s.rows, s.master, device);
    check_state_tensor(old_state[i].steps, old_name + ".steps", ZF_DTYPE_I32, s.k_old, device, "old_selected[0]");
    check_state_tensor(new_state[i].steps, arg_name("new_state", i) + ".steps", ZF_DTYPE_I32, s.k_new, device,
                       "old_selected[0]");
    if (device.type == ZF_DEVICE_CPU) {
      int64_t expected_entering, expected_leaving;
      count_moves(static_cast<const int32_t*>(old_selected[i].data), s.k_old,
                  static_cast<const int32_t*>(new_selected[i].data), s.k_new, &expected_entering, &expected_leaving);
      require(expected_entering == s.entering, ZF_ERROR_INVALID_VALUE, "entering[", i, "]: holds ", s.entering,
              " columns, but ", expected_entering, " columns enter the selection");
      require(expected_leaving == s.leaving, ZF_ERROR_INVALID_VALUE, "leaving[", i, "]: holds ", s.leaving,
              " columns, but ", expected_leaving, " columns leave the selection");
    }
    shapes.push_back(s);
  }
  *device_out = device;
  return shapes;
}

void copy_column_state(const zf_column_state& from, int64_t from_index, int64_t from_stride, const zf_column_state& to,
                       int64_t to_index, int64_t to_stride, int64_t rows, bool master) {
  // Element r of a column: device layout strides by k, packed host layout by 1.
  const float* src[3] = {static_cast<const float*>(from.master.data), static_cast<const float*>(from.exp_avg.data),
                         static_cast<const float*>(from.exp_avg_sq.data)};
  float* dst[3] = {static_cast<float*>(to.master.data), static_cast<float*>(to.exp_avg.data),
                   static_cast<float*>(to.exp_avg_sq.data)};
  for (int t = master ? 0 : 1; t < 3; ++t) {
    for (int64_t r = 0; r < rows; ++r) dst[t][to_index + r * to_stride] = src[t][from_index + r * from_stride];
  }
}

void exchange_host(const zf_tensor* old_selected, const zf_tensor* new_selected, const zf_column_state* old_state,
                   const zf_column_state* new_state, const zf_column_state* entering, const zf_column_state* leaving,
                   const std::vector<ExchangeShape>& shapes) {
  global_thread_pool()->run([&](int thread, int threads) {
    for (size_t i = static_cast<size_t>(thread); i < shapes.size(); i += static_cast<size_t>(threads)) {
      const ExchangeShape& s = shapes[i];
      const int32_t* old_sel = static_cast<const int32_t*>(old_selected[i].data);
      const int32_t* new_sel = static_cast<const int32_t*>(new_selected[i].data);
      const int32_t* old_steps = static_cast<const int32_t*>(old_state[i].steps.data);
      int64_t entered = 0, left = 0;
      for (int64_t p = 0; p < s.k_new; ++p) {
        const int32_t q = find_in_sorted(old_sel, static_cast<int32_t>(s.k_old), new_sel[p]);
        int32_t* steps = static_cast<int32_t*>(new_state[i].steps.data);
        if (q >= 0) {
          copy_column_state(old_state[i], q, s.k_old, new_state[i], p, s.k_new, s.rows, s.master);
          steps[p] = old_steps[q];
        } else {
          copy_column_state(entering[i], packed_index(0, s.rows, entered, 0), 1, new_state[i], p, s.k_new, s.rows,
                            s.master);
          steps[p] = static_cast<const int32_t*>(entering[i].steps.data)[entered++];
        }
      }
      for (int64_t q = 0; q < s.k_old; ++q) {
        if (find_in_sorted(new_sel, static_cast<int32_t>(s.k_new), old_sel[q]) >= 0) continue;
        copy_column_state(old_state[i], q, s.k_old, leaving[i], packed_index(0, s.rows, left, 0), 1, s.rows, s.master);
        static_cast<int32_t*>(leaving[i].steps.data)[left++] = old_steps[q];
      }
    }
  });
}

}  // namespace
}  // namespace zf

extern "C" ZF_API zf_status zf_pack_columns(const zf_tensor* grads, const zf_tensor* selected, size_t count,
                                            const zf_tensor* packed, const zf_tensor* scale, zf_stream stream) {
  return zf::api_call([&] {
    const zf_device device = zf::validate_pack(grads, "grads", selected, count, packed, scale);
    const float* scale_ptr = scale ? static_cast<const float*>(scale->data) : nullptr;
    if (device.type == ZF_DEVICE_CUDA) {
#if defined(ZENFLOW_WITH_CUDA)
      zf::cuda::pack_or_scatter_columns(grads, selected, count, *packed, scale_ptr, true, stream);
#endif
      return;
    }
    zf::pack_or_scatter_host(grads, selected, count, *packed, scale_ptr, true);
  });
}

extern "C" ZF_API zf_status zf_scatter_columns(const zf_tensor* packed, const zf_tensor* params,
                                               const zf_tensor* selected, size_t count, zf_stream stream) {
  return zf::api_call([&] {
    const zf_device device = zf::validate_pack(params, "params", selected, count, packed, nullptr);
    if (device.type == ZF_DEVICE_CUDA) {
#if defined(ZENFLOW_WITH_CUDA)
      zf::cuda::pack_or_scatter_columns(params, selected, count, *packed, nullptr, false, stream);
#endif
      return;
    }
    zf::pack_or_scatter_host(params, selected, count, *packed, nullptr, false);
  });
}

extern "C" ZF_API zf_status zf_exchange_selected_columns(const zf_tensor* old_selected, const zf_tensor* new_selected,
                                                         const zf_column_state* old_state,
                                                         const zf_column_state* new_state,
                                                         const zf_column_state* entering,
                                                         const zf_column_state* leaving, size_t count, void* workspace,
                                                         size_t* workspace_bytes, zf_stream stream) {
  return zf::api_call([&] {
    zf_device device{ZF_DEVICE_CPU, 0};
    const auto shapes =
        zf::validate_exchange(old_selected, new_selected, old_state, new_state, entering, leaving, count, &device);
    if (device.type == ZF_DEVICE_CUDA) {
#if defined(ZENFLOW_WITH_CUDA)
      const size_t required = zf::cuda::exchange_workspace_bytes(old_selected, new_selected, count);
      if (zf::workspace_query(workspace, workspace_bytes, required)) return;
      zf::cuda::exchange_selected_columns(old_selected, new_selected, old_state, new_state, entering, leaving, count,
                                          workspace, required, stream);
#endif
      return;
    }
    if (zf::workspace_query(workspace, workspace_bytes, 0)) return;
    zf::exchange_host(old_selected, new_selected, old_state, new_state, entering, leaving, shapes);
  });
}
