// zf_pack_columns, zf_scatter_columns and zf_exchange_selected_columns: validation, the
// host plans, and dispatch to CUDA.
#include <algorithm>
#include <utility>
#include <vector>

#include "common/column_checks.hpp"
#include "common/column_index.hpp"
#include "common/device_ops.hpp"
#include "common/error.hpp"
#include "common/packed_layout.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "ops/pack_plan.hpp"
#include "simd/kernels.hpp"
#include "zenflow/pack.h"

namespace zf {

namespace {
// Unselected columns per block: each block writes (pack) or reads (scatter) whole contiguous
// packed columns while the matrix is walked row by row.
constexpr int64_t kHostColumnBlock = 64;
}  // namespace

PackPlan::PackPlan(PackedLayout layout, std::vector<zf_dtype> dtypes, zf_dtype packed_dtype)
    : layout_(std::move(layout)), dtypes_(std::move(dtypes)), packed_dtype_(packed_dtype) {
  for (size_t i = 0; i < layout_.size(); ++i) {
    const PackedMatrix& m = layout_[i];
    if (m.rows == 0) continue;
    for (int64_t j = 0; j < m.unselected(); j += kHostColumnBlock) {
      blocks_.push_back({i, j, std::min(m.unselected(), j + kHostColumnBlock)});
    }
  }
}

void PackPlan::run(ThreadPool& pool, void* const* matrices, const int32_t* const* selected, void* packed, float scale,
                   bool to_packed) const {
  // The transposing copy of each block is the SIMD level's kernel (simd/kernels_pack_impl.hpp).
  const auto copy_block = to_packed ? simd::active_kernels().pack_block : simd::active_kernels().scatter_block;
  const auto run_blocks = [&](int64_t begin, int64_t end) {
    int64_t columns[kHostColumnBlock];
    for (int64_t b = begin; b < end; ++b) {
      const Block& block = blocks_[static_cast<size_t>(b)];
      const PackedMatrix& m = layout_[block.matrix];
      const int32_t* sel = m.selected > 0 ? selected[block.matrix] : nullptr;
      const int32_t k = static_cast<int32_t>(m.selected);
      const int64_t width = block.last - block.first;
      for (int64_t j = 0; j < width; ++j) columns[j] = unselected_column(sel, k, block.first + j);
      const size_t packed_bytes = zf_dtype_size(packed_dtype_);
      simd::PackBlockArgs args{matrices[block.matrix],
                               dtypes_[block.matrix],
                               m.rows,
                               m.cols,
                               columns,
                               width,
                               static_cast<char*>(packed) + (m.offset + block.first * m.rows) * packed_bytes,
                               packed_dtype_,
                               scale};
      copy_block(args);
    }
  };
  const int64_t block_count = static_cast<int64_t>(blocks_.size());
  if (block_count <= 1 || pool.size() == 1 || in_parallel_region()) {
    run_blocks(0, block_count);
    return;
  }
  pool.run([&](int thread, int threads) {
    int64_t begin, end;
    split_range(0, block_count, thread, threads, &begin, &end);
    run_blocks(begin, end);
  });
}

namespace {

// ---- pack and scatter ---------------------------------------------------------------------

// Validates a pack or scatter call and derives its layout. The matrices are written by a
// scatter, the packed buffer by a pack.
PackedLayout validate_pack(const zf_tensor* matrices, const char* matrix_label, const zf_tensor* selected, size_t count,
                           const zf_tensor* packed, const zf_tensor* scale, bool to_packed) {
  require(count == 0 || matrices != nullptr, ZF_ERROR_INVALID_VALUE, matrix_label, ": NULL array with count=", count);
  check_descriptor(packed, "packed");
  const zf_device device = packed->device;
  check_device_compiled(device, "packed");
  check_dtype(*packed, "packed", {ZF_DTYPE_F32, ZF_DTYPE_F16, ZF_DTYPE_BF16});
  check_ndim(*packed, "packed", 1);
  check_contiguous(*packed, "packed");
  OverlapCheck overlap;
  overlap.reserve(2 * count + 2);
  overlap.add(*packed, "packed", to_packed);
  if (scale != nullptr) {
    check_state_tensor(*scale, "scale", ZF_DTYPE_F32, 1, device, "packed");
    overlap.add(*scale, "scale", false);
  }
  PackedLayout layout;
  layout.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const ArgName matrix_name(matrix_label, i), selected_name("selected", i);
    const MatrixView view = check_float_matrix(&matrices[i], matrix_name, device, "packed");
    const int64_t k = selected ? check_selected(&selected[i], selected_name, view.cols, device, "packed") : 0;
    layout.add(view.rows, view.cols, k, matrix_label);
    overlap.add(matrices[i], matrix_name, !to_packed);
    if (selected) overlap.add(selected[i], selected_name, false);
  }
  require(packed->shape[0] == layout.total(), ZF_ERROR_INVALID_VALUE, "packed: has ", packed->shape[0],
          " elements, but the unselected columns hold ", layout.total());
  overlap.check();
  return layout;
}

void pack_or_scatter(const zf_tensor* matrices, const char* matrix_label, const zf_tensor* selected, size_t count,
                     const zf_tensor* packed, const zf_tensor* scale, bool to_packed, zf_stream stream) {
  PackedLayout layout = validate_pack(matrices, matrix_label, selected, count, packed, scale, to_packed);
  const float* scale_ptr = scale ? static_cast<const float*>(scale->data) : nullptr;
  if (packed->device.type == ZF_DEVICE_CUDA) {
    cuda_ops().pack_or_scatter_columns(matrices, selected, layout, *packed, scale_ptr, to_packed, stream);
    return;
  }
  std::vector<zf_dtype> dtypes(count);
  std::vector<void*> data(count);
  std::vector<const int32_t*> selected_data(count, nullptr);
  for (size_t i = 0; i < count; ++i) {
    dtypes[i] = matrices[i].dtype;
    data[i] = matrices[i].data;
    if (selected) selected_data[i] = static_cast<const int32_t*>(selected[i].data);
  }
  const PackPlan plan(std::move(layout), std::move(dtypes), packed->dtype);
  plan.run(*global_thread_pool(), data.data(), selected_data.data(), packed->data, scale_ptr ? *scale_ptr : 1.0f,
           to_packed);
}

// ---- selection exchange -------------------------------------------------------------------

struct ExchangeShape {
  int64_t rows, k_old, k_new, entering, leaving;
  bool master;
};

// A state of [first, second] floats (and steps, checked by the caller); `written` says
// whether the call writes it, for the overlap check.
void check_state_layout(const zf_column_state& s, const ArgName& name, int64_t first, int64_t second,
                        bool master_expected, const zf_device& device, OverlapCheck& overlap, bool written) {
  const ArgName source("old_selected", 0);
  const bool has_master = check_master(s.master, name.with_field("master"), first * second, device, source);
  require(has_master == master_expected || first * second == 0, ZF_ERROR_INVALID_VALUE, name.with_field("master"),
          ": present in some states of this matrix and absent in others");
  const std::pair<const zf_tensor*, const char*> moments[] = {{&s.exp_avg, "exp_avg"}, {&s.exp_avg_sq, "exp_avg_sq"}};
  for (const auto& [tensor, field] : moments) {
    check_state_tensor(*tensor, name.with_field(field), ZF_DTYPE_F32, first * second, device, source);
    require(tensor->ndim == 2 && tensor->shape[0] == first && tensor->shape[1] == second, ZF_ERROR_INVALID_VALUE,
            name.with_field(field), ": expected [", first, ", ", second, "]");
    overlap.add(*tensor, name.with_field(field), written);
  }
  if (has_master) {
    require(s.master.ndim == 2 && s.master.shape[0] == first && s.master.shape[1] == second, ZF_ERROR_INVALID_VALUE,
            name.with_field("master"), ": expected [", first, ", ", second, "]");
  }
  overlap.add(s.master, name.with_field("master"), written);
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
  shapes.reserve(count);
  zf_device device{ZF_DEVICE_CPU, 0};
  const ArgName source("old_selected", 0);
  if (count > 0) {
    check_descriptor(&old_selected[0], source);
    device = old_selected[0].device;
  }
  check_device_compiled(device, source);
  OverlapCheck overlap;
  overlap.reserve(18 * count);
  for (size_t i = 0; i < count; ++i) {
    ExchangeShape s{};
    const ArgName old_name("old_state", i), new_name("new_state", i), entering_name("entering", i),
        leaving_name("leaving", i), old_selected_name("old_selected", i), new_selected_name("new_selected", i);
    // Every descriptor is checked before any of its fields is read.
    const zf_column_state* states[] = {&old_state[i], &new_state[i], &entering[i], &leaving[i]};
    const ArgName state_names[] = {old_name, new_name, entering_name, leaving_name};
    for (int which = 0; which < 4; ++which) {
      check_descriptor(&states[which]->master, state_names[which].with_field("master"));
      check_descriptor(&states[which]->exp_avg, state_names[which].with_field("exp_avg"));
      check_descriptor(&states[which]->exp_avg_sq, state_names[which].with_field("exp_avg_sq"));
      check_descriptor(&states[which]->steps, state_names[which].with_field("steps"));
    }
    check_ndim(old_state[i].exp_avg, old_name.with_field("exp_avg"), 2);
    s.rows = old_state[i].exp_avg.shape[0];
    const int64_t n_limit = INT32_MAX;
    s.k_old = check_selected(&old_selected[i], old_selected_name, n_limit, device, source);
    s.k_new = check_selected(&new_selected[i], new_selected_name, n_limit, device, source);
    check_state_tensor(entering[i].steps, entering_name.with_field("steps"), ZF_DTYPE_I32, numel(entering[i].steps),
                       device, source);
    check_state_tensor(leaving[i].steps, leaving_name.with_field("steps"), ZF_DTYPE_I32, numel(leaving[i].steps),
                       device, source);
    s.entering = numel(entering[i].steps);
    s.leaving = numel(leaving[i].steps);
    s.master = numel(old_state[i].master) > 0 || numel(new_state[i].master) > 0;
    check_state_layout(old_state[i], old_name, s.rows, s.k_old, s.master, device, overlap, false);
    check_state_layout(new_state[i], new_name, s.rows, s.k_new, s.master, device, overlap, true);
    check_state_layout(entering[i], entering_name, s.entering, s.rows, s.master, device, overlap, false);
    check_state_layout(leaving[i], leaving_name, s.leaving, s.rows, s.master, device, overlap, true);
    check_state_tensor(old_state[i].steps, old_name.with_field("steps"), ZF_DTYPE_I32, s.k_old, device, source);
    check_state_tensor(new_state[i].steps, new_name.with_field("steps"), ZF_DTYPE_I32, s.k_new, device, source);
    overlap.add(old_state[i].steps, old_name.with_field("steps"), false);
    overlap.add(new_state[i].steps, new_name.with_field("steps"), true);
    overlap.add(entering[i].steps, entering_name.with_field("steps"), false);
    overlap.add(leaving[i].steps, leaving_name.with_field("steps"), true);
    overlap.add(old_selected[i], old_selected_name, false);
    overlap.add(new_selected[i], new_selected_name, false);
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
  overlap.check();
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
    // Matrices are independent: thread t takes every threads-th one.
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

// Validates and runs an exchange whose entering and leaving buffers are per-matrix states.
void run_exchange(const zf_tensor* old_selected, const zf_tensor* new_selected, const zf_column_state* old_state,
                  const zf_column_state* new_state, const zf_column_state* entering, const zf_column_state* leaving,
                  size_t count, void* workspace, size_t* workspace_bytes, zf_stream stream) {
  zf_device device{ZF_DEVICE_CPU, 0};
  const auto shapes =
      validate_exchange(old_selected, new_selected, old_state, new_state, entering, leaving, count, &device);
  if (device.type == ZF_DEVICE_CUDA) {
    const CudaOps& cuda = cuda_ops();
    const size_t required = cuda.exchange_workspace_bytes(old_selected, new_selected, count);
    if (workspace_query(workspace, workspace_bytes, required)) return;
    cuda.exchange_selected_columns(old_selected, new_selected, old_state, new_state, entering, leaving, count,
                                   workspace, required, stream);
    return;
  }
  if (workspace_query(workspace, workspace_bytes, 0)) return;
  exchange_host(old_selected, new_selected, old_state, new_state, entering, leaving, shapes);
}

// A [columns, rows] contiguous f32 (or [columns] i32) view at element `offset` of `whole`.
zf_tensor packed_part(const zf_tensor& whole, int64_t offset, int64_t columns, int64_t rows, bool steps) {
  zf_tensor part{};
  part.dtype = whole.dtype;
  part.device = whole.device;
  const int64_t elements = steps ? columns : columns * rows;
  part.data = elements == 0
                  ? nullptr
                  : static_cast<char*>(whole.data) + offset * static_cast<int64_t>(zf_dtype_size(whole.dtype));
  if (steps) {
    part.ndim = 1;
    part.shape[0] = columns;
    part.strides[0] = 1;
  } else {
    part.ndim = 2;
    part.shape[0] = columns;
    part.shape[1] = rows;
    part.strides[0] = rows;
    part.strides[1] = 1;
  }
  return part;
}

// The packed entering (or leaving) state of zf_exchange_selected_columns_packed cut into the
// per-matrix [counts[i], rows_i] states the exchange moves columns from (or to). Offsets come
// from the one packed layout: matrix i as [rows_i, counts[i]] with nothing selected.
std::vector<zf_column_state> split_packed_state(const zf_column_state* packed, const int64_t* counts,
                                                const std::vector<int64_t>& rows, const std::vector<bool>& has_master,
                                                const char* name, const char* counts_name, const zf_device& device) {
  const size_t count = rows.size();
  PackedLayout layout;
  layout.reserve(count);
  int64_t columns = 0;
  for (size_t i = 0; i < count; ++i) {
    require(counts[i] >= 0 && counts[i] <= INT32_MAX, ZF_ERROR_INVALID_VALUE, counts_name, "[", i, "]: ", counts[i],
            " is not a column count (0 to INT32_MAX)");
    layout.add(rows[i], counts[i], 0, counts_name);
    columns += counts[i];
  }
  const ArgName whole(name), source("old_selected", 0);
  check_descriptor(&packed->master, whole.with_field("master"));
  check_descriptor(&packed->exp_avg, whole.with_field("exp_avg"));
  check_descriptor(&packed->exp_avg_sq, whole.with_field("exp_avg_sq"));
  check_descriptor(&packed->steps, whole.with_field("steps"));
  check_state_tensor(packed->exp_avg, whole.with_field("exp_avg"), ZF_DTYPE_F32, layout.total(), device, source);
  check_state_tensor(packed->exp_avg_sq, whole.with_field("exp_avg_sq"), ZF_DTYPE_F32, layout.total(), device, source);
  check_state_tensor(packed->steps, whole.with_field("steps"), ZF_DTYPE_I32, columns, device, source);
  const bool master = check_master(packed->master, whole.with_field("master"), layout.total(), device, source);
  std::vector<zf_column_state> parts(count);
  int64_t first_column = 0;
  for (size_t i = 0; i < count; ++i) {
    const PackedMatrix& m = layout[i];
    zf_column_state& part = parts[i];
    part.exp_avg = packed_part(packed->exp_avg, m.offset, counts[i], m.rows, false);
    part.exp_avg_sq = packed_part(packed->exp_avg_sq, m.offset, counts[i], m.rows, false);
    part.steps = packed_part(packed->steps, first_column, counts[i], 0, true);
    // A matrix without a master leaves its slot of a present packed master untouched; with
    // no packed master, its part has none (the exchange then rejects a matrix that has one).
    part.master = (master && has_master[i]) ? packed_part(packed->master, m.offset, counts[i], m.rows, false)
                                            : packed_part(packed->exp_avg, 0, 0, 0, false);
    part.master.dtype = ZF_DTYPE_F32;
    first_column += counts[i];
  }
  return parts;
}

void run_packed_exchange(const zf_tensor* old_selected, const zf_tensor* new_selected, const zf_column_state* old_state,
                         const zf_column_state* new_state, const int64_t* entering_counts,
                         const zf_column_state* entering, const int64_t* leaving_counts, const zf_column_state* leaving,
                         size_t count, void* workspace, size_t* workspace_bytes, zf_stream stream) {
  require(count == 0 || (old_selected && new_selected && old_state && new_state && entering_counts && leaving_counts &&
                         entering && leaving),
          ZF_ERROR_INVALID_VALUE, "exchange: NULL array with count=", count);
  if (count == 0) {
    run_exchange(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, workspace, workspace_bytes, stream);
    return;
  }
  zf_device device{ZF_DEVICE_CPU, 0};
  if (count > 0) {
    check_descriptor(&old_selected[0], ArgName("old_selected", 0));
    device = old_selected[0].device;
  }
  // The rows of each matrix (from its old state) size its part of the packed buffers;
  // everything else is validated by the per-matrix exchange on the parts.
  std::vector<int64_t> rows(count);
  std::vector<bool> has_master(count);
  for (size_t i = 0; i < count; ++i) {
    const ArgName old_name("old_state", i), new_name("new_state", i);
    check_descriptor(&old_state[i].exp_avg, old_name.with_field("exp_avg"));
    check_ndim(old_state[i].exp_avg, old_name.with_field("exp_avg"), 2);
    check_descriptor(&old_state[i].master, old_name.with_field("master"));
    check_descriptor(&new_state[i].master, new_name.with_field("master"));
    rows[i] = old_state[i].exp_avg.shape[0];
    has_master[i] = numel(old_state[i].master) > 0 || numel(new_state[i].master) > 0;
  }
  const std::vector<zf_column_state> entering_parts =
      split_packed_state(entering, entering_counts, rows, has_master, "entering", "entering_counts", device);
  const std::vector<zf_column_state> leaving_parts =
      split_packed_state(leaving, leaving_counts, rows, has_master, "leaving", "leaving_counts", device);
  run_exchange(old_selected, new_selected, old_state, new_state, entering_parts.data(), leaving_parts.data(), count,
               workspace, workspace_bytes, stream);
}

}  // namespace
}  // namespace zf

extern "C" ZF_API zf_status zf_pack_columns(const zf_tensor* grads, const zf_tensor* selected, size_t count,
                                            const zf_tensor* packed, const zf_tensor* scale, zf_stream stream) {
  return zf::api_call([&] { zf::pack_or_scatter(grads, "grads", selected, count, packed, scale, true, stream); });
}

extern "C" ZF_API zf_status zf_scatter_columns(const zf_tensor* packed, const zf_tensor* params,
                                               const zf_tensor* selected, size_t count, zf_stream stream) {
  return zf::api_call([&] { zf::pack_or_scatter(params, "params", selected, count, packed, nullptr, false, stream); });
}

extern "C" ZF_API zf_status zf_exchange_selected_columns(const zf_tensor* old_selected, const zf_tensor* new_selected,
                                                         const zf_column_state* old_state,
                                                         const zf_column_state* new_state,
                                                         const zf_column_state* entering,
                                                         const zf_column_state* leaving, size_t count, void* workspace,
                                                         size_t* workspace_bytes, zf_stream stream) {
  return zf::api_call([&] {
    zf::run_exchange(old_selected, new_selected, old_state, new_state, entering, leaving, count, workspace,
                     workspace_bytes, stream);
  });
}

extern "C" ZF_API zf_status zf_exchange_selected_columns_packed(
    const zf_tensor* old_selected, const zf_tensor* new_selected, const zf_column_state* old_state,
    const zf_column_state* new_state, const int64_t* entering_counts, const zf_column_state* entering,
    const int64_t* leaving_counts, const zf_column_state* leaving, size_t count, void* workspace,
    size_t* workspace_bytes, zf_stream stream) {
  return zf::api_call([&] {
    zf::run_packed_exchange(old_selected, new_selected, old_state, new_state, entering_counts, entering, leaving_counts,
                            leaving, count, workspace, workspace_bytes, stream);
  });
}
