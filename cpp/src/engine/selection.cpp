// Selection (docs/design.md sections 2 and 3): top-k of the column scores, then the lossless
// exchange -- only the columns whose status changes move, with their fp32 master, moments
// and step count -- and the plans of the new selection.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "engine/engine.hpp"
#include "ops/select_topk_plan.hpp"
#include "zenflow/cpu_adamw.h"

namespace zf {
namespace {

zf_tensor host_tensor(const void* data, zf_dtype dtype, std::initializer_list<int64_t> shape) {
  return contiguous_descriptor(data, dtype, zf_device{ZF_DEVICE_CPU, 0}, shape);
}

void check_call(zf_status status, const char* what) {
  if (status != ZF_SUCCESS) fail(status, what, ": ", zf_last_error());
}

// Columns of `a` not in `b` (both ascending).
std::vector<int32_t> difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::vector<int32_t> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// A column list in the packed host layout [count, rows], with its own storage.
struct ColumnList {
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<int32_t> steps;
  ColumnList(int64_t count, int64_t rows)
      : master(static_cast<size_t>(count * rows)),
        exp_avg(master.size()),
        exp_avg_sq(master.size()),
        steps(static_cast<size_t>(count)) {}
  zf_column_state state(int64_t count, int64_t rows, bool with_master) { return state_at(0, count, rows, with_master); }
  // Columns [first, first + count) of the list.
  zf_column_state state_at(int64_t first, int64_t count, int64_t rows, bool with_master) {
    const size_t at = static_cast<size_t>(first * rows);
    return zf_column_state{with_master ? host_tensor(master.data() + at, ZF_DTYPE_F32, {count, rows})
                                       : host_tensor(nullptr, ZF_DTYPE_F32, {0}),
                           host_tensor(exp_avg.data() + at, ZF_DTYPE_F32, {count, rows}),
                           host_tensor(exp_avg_sq.data() + at, ZF_DTYPE_F32, {count, rows}),
                           host_tensor(steps.data() + first, ZF_DTYPE_I32, {count})};
  }
};

// The entries of an ascending column list that fall in [lo, lo + count): a contiguous run of
// the list, from `first`, and where those columns are in the deferred host layout of a
// selection whose own columns (minus lo) are `own_selected`: their local index minus the
// selected columns before them. None of them may be in own_selected.
struct OwnedRun {
  int64_t first = 0, count = 0;
  std::vector<int32_t> positions;
};

OwnedRun owned_run(const std::vector<int32_t>& columns, int64_t lo, int64_t count,
                   const std::vector<int32_t>& own_selected) {
  OwnedRun run;
  const auto begin = std::lower_bound(columns.begin(), columns.end(), lo);
  const auto end = std::lower_bound(begin, columns.end(), lo + count);
  run.first = begin - columns.begin();
  run.count = end - begin;
  auto selected_before = own_selected.begin();
  for (auto it = begin; it != end; ++it) {
    const auto local = static_cast<int32_t>(*it - lo);
    selected_before = std::lower_bound(selected_before, own_selected.end(), local);
    run.positions.push_back(local - static_cast<int32_t>(selected_before - own_selected.begin()));
  }
  return run;
}

// A stretch of consecutive columns that stay deferred across a selection: `count` columns
// from position `from` of the old deferred layout to position `to` of the new one.
struct DeferredMove {
  int64_t from, to, count;
};

// The moves of the columns of [0, cols) in neither list (both ascending), in maximal stretches
// of one shift: left moves (to < from) in ascending order, then right moves in descending
// order. No move then overwrites a column not yet moved: the old occupant of a left move's
// destination is an entering column or an earlier column moving left; of a right move's, an
// entering column, a place already vacated, or a later column moving right. Columns that stay
// in place are left out.
std::vector<DeferredMove> deferred_moves(int64_t cols, const std::vector<int32_t>& old_selected,
                                         const std::vector<int32_t>& new_selected) {
  std::vector<DeferredMove> left, right;
  size_t in_old = 0, in_new = 0;
  int64_t from = 0, to = 0;
  DeferredMove run{0, 0, 0};
  auto flush = [&] {
    if (run.count > 0 && run.from != run.to) (run.to < run.from ? left : right).push_back(run);
    run.count = 0;
  };
  for (int64_t j = 0; j < cols; ++j) {
    const bool was_selected = in_old < old_selected.size() && old_selected[in_old] == j;
    const bool is_selected = in_new < new_selected.size() && new_selected[in_new] == j;
    in_old += was_selected;
    in_new += is_selected;
    if (!was_selected && !is_selected) {
      if (run.count > 0 && run.from + run.count == from && run.to + run.count == to) {
        ++run.count;
      } else {
        flush();
        run = DeferredMove{from, to, 1};
      }
    }
    from += !was_selected;
    to += !is_selected;
  }
  flush();
  left.insert(left.end(), right.rbegin(), right.rend());
  return left;
}

}  // namespace

void Engine::select_columns() {
  flush_internal();  // the hand-over is exact only with nothing in flight
  std::vector<std::vector<int32_t>> next(matrices_.size());
  std::vector<TopkVector> vectors;
  std::vector<const float*> scores;
  std::vector<int32_t*> outputs;
  const bool window_score = config_.selection_score == ZF_SCORE_WINDOW && schedule_.has_previous_window();
  // The top-k runs on the host on both backends: the host needs the indices anyway (its
  // accumulate and update plans), and this is the once-per-period wait the flush already
  // paid for. It is the same function as the kernel (ties to the lower index).
  const float* col_sq = window_score ? nullptr : col_sq_on_host(nullptr);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    Matrix& m = matrices_[i];
    if (m.k == m.cols) {
      next[i].resize(static_cast<size_t>(m.cols));
      std::iota(next[i].begin(), next[i].end(), 0);
    } else if (m.k > 0) {
      next[i].resize(static_cast<size_t>(m.k));
      vectors.push_back(TopkVector{m.cols, m.k});
      scores.push_back(window_score ? m.window_score.data() : col_sq + m.col_offset);
      outputs.push_back(next[i].data());
    }
  }
  if (!vectors.empty()) SelectTopkPlan(vectors).run(backend_->host_pool(), scores.data(), outputs.data());
  if (schedule_.selections() > 1) add_saturating(reselections_, 1);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    if (next[i] != matrices_[i].selected) exchange_columns(matrices_[i], next[i]);
  }
  rebuild_plans();
}

void Engine::exchange_columns(Matrix& m, const std::vector<int32_t>& next) {
  const std::vector<int32_t>& old = m.selected;
  const std::vector<int32_t> entering = difference(next, old), leaving = difference(old, next);
  const auto rows = m.rows, k_old = static_cast<int64_t>(old.size()), k_new = static_cast<int64_t>(next.size());
  const auto n_enter = static_cast<int64_t>(entering.size()), n_leave = static_cast<int64_t>(leaving.size());
  // The host lane is idle (select_columns flushed) and no window is open: the accumulators
  // hold nothing, so only the master, moments and counts move.
  require(window_.steps() == 0, ZF_ERROR_INTERNAL, "selection: a window is open");
  // Entering columns: their host state, gathered into a list. Each rank holds the host state
  // of its own columns, a contiguous run of the list; data parallel, the list is then summed
  // over the ranks (every entry comes from one rank, zeros from the others).
  ColumnList enter_list(n_enter, rows), leave_list(n_leave, rows);
  zf_column_state enter_state = enter_list.state(n_enter, rows, m.has_master);
  const OwnedRun enter_run = owned_run(entering, m.own_lo, m.own_cols, m.own_selected);
  if (enter_run.count > 0) {
    const zf_column_state host = host_state(m, m.has_master);
    const zf_tensor local_t = host_tensor(enter_run.positions.data(), ZF_DTYPE_I32, {enter_run.count});
    zf_column_state run_state = enter_list.state_at(enter_run.first, enter_run.count, rows, m.has_master);
    check_call(zf_cpu_gather_columns(&host, &local_t, 1, &run_state), "selection: gather of entering columns");
  }
  if (parallel() && n_enter > 0) {
    float* arrays[3] = {enter_list.exp_avg.data(), enter_list.exp_avg_sq.data(), enter_list.master.data()};
    share_entering_columns(arrays, m.has_master ? 3 : 2, static_cast<size_t>(n_enter * rows), enter_list.steps.data(),
                           static_cast<size_t>(n_enter));
  }
  // The device side: the compact state comes to the host, the exchange runs on the host (out
  // of place: the old and new compact layouts differ), and the new state goes back. It is
  // one matrix's state each way, once per selection period, right after a flush.
  const size_t floats = align256(static_cast<size_t>(rows * m.k) * 4);
  const size_t region = m.has_master ? m.dev_master : m.dev_exp_avg;
  std::vector<uint8_t> old_region(m.compact_bytes), new_region(m.compact_bytes);
  download(old_region.data(), arena_.base() + region, m.compact_bytes);
  auto compact = [&](uint8_t* at, int64_t k) {
    const size_t first = m.has_master ? floats : 0;
    return zf_column_state{
        m.has_master ? host_tensor(at, ZF_DTYPE_F32, {rows, k}) : host_tensor(nullptr, ZF_DTYPE_F32, {0}),
        host_tensor(at + first, ZF_DTYPE_F32, {rows, k}), host_tensor(at + first + floats, ZF_DTYPE_F32, {rows, k}),
        host_tensor(at + first + 2 * floats, ZF_DTYPE_I32, {k})};
  };
  const zf_column_state old_state = compact(old_region.data(), k_old), new_state = compact(new_region.data(), k_new);
  const zf_column_state leave_state = leave_list.state(n_leave, rows, m.has_master);
  const zf_tensor old_t = host_tensor(old.data(), ZF_DTYPE_I32, {k_old}),
                  new_t = host_tensor(next.data(), ZF_DTYPE_I32, {k_new});
  check_call(zf_exchange_selected_columns(&old_t, &new_t, &old_state, &new_state, &enter_state, &leave_state, 1,
                                          nullptr, nullptr, nullptr),
             "selection exchange");
  upload(arena_.base() + region, new_region.data(), m.compact_bytes);
  // Leaving columns: their state goes to the host. Without a device master the weights are
  // the master: W[:, leaving] in fp32 (a pack of everything but the leaving columns).
  if (n_leave > 0 && !m.has_master) {
    std::vector<int32_t> all(static_cast<size_t>(m.cols));
    std::iota(all.begin(), all.end(), 0);
    const std::vector<int32_t> others = difference(all, leaving);
    PackedLayout layout;
    layout.add(rows, m.cols, static_cast<int64_t>(others.size()));
    PackPlan plan(layout, {params_[m.param].tensor.dtype}, ZF_DTYPE_F32);
    std::vector<uint8_t> weights = download_param(m.param);
    void* param = weights.empty() ? params_[m.param].tensor.data : weights.data();
    const int32_t* selected = others.data();
    plan.run(backend_->host_pool(), &param, &selected, leave_list.master.data(), 1.0f, true);
  }
  // The host's deferred layout follows the selection: the columns staying deferred move to
  // their new places, then the leaving ones go into theirs.
  const std::vector<int32_t> old_own_selected = m.own_selected;
  m.selected = next;
  upload_selection(m);
  relayout_deferred(m, old_own_selected);
  // Every rank has the leaving columns (the device state is the same on all); each keeps
  // its own.
  const OwnedRun leave_run = owned_run(leaving, m.own_lo, m.own_cols, m.own_selected);
  if (leave_run.count > 0) {
    const zf_column_state leave_part = leave_list.state_at(leave_run.first, leave_run.count, rows, true);
    const zf_column_state host = host_state(m, true);
    const zf_tensor local_t = host_tensor(leave_run.positions.data(), ZF_DTYPE_I32, {leave_run.count});
    check_call(zf_cpu_scatter_columns(&leave_part, &local_t, 1, &host), "selection: scatter of leaving columns");
  }
}

void Engine::relayout_deferred(Matrix& m, const std::vector<int32_t>& old_own_selected) {
  const std::vector<DeferredMove> moves = deferred_moves(m.own_cols, old_own_selected, m.own_selected);
  if (moves.empty()) return;
  // One array per thread (the moves of one array depend on their order; the arrays do not on
  // each other). The count of a column moves with it.
  const auto rows = static_cast<size_t>(m.rows);
  StreamedVector<float>* arrays[3] = {&m.master, &m.exp_avg, &m.exp_avg_sq};
  backend_->host_pool().run([&](int index, int count) {
    for (int a = index; a < 3; a += count) {
      float* data = arrays[a]->data();
      for (const DeferredMove& move : moves)
        std::memmove(data + static_cast<size_t>(move.to) * rows, data + static_cast<size_t>(move.from) * rows,
                     static_cast<size_t>(move.count) * rows * sizeof(float));
    }
  });
  for (const DeferredMove& move : moves)
    std::memmove(m.steps.data() + move.to, m.steps.data() + move.from,
                 static_cast<size_t>(move.count) * sizeof(int32_t));
}

void Engine::rebuild_plans() {
  // The host lane is idle here (a flush before a selection, or a load): which accumulator
  // holds the open window is the counters' to say; the other holds nothing.
  for (Matrix& m : matrices_) {
    m.acc_fresh[window_.filling()] = window_.steps() == 0 ? 1 : 0;
    m.acc_fresh[window_.filling() ^ 1] = 1;
  }
  std::vector<AdamwSelectedMatrix> device;
  device_plan_params_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    if (p.matrix) {
      const Matrix& m = matrices_[p.index];
      if (m.selected.empty()) continue;
      device.push_back(AdamwSelectedMatrix{m.rows, m.cols, static_cast<int64_t>(m.selected.size()), p.tensor.dtype,
                                           p.tensor.dtype, m.has_master});
    } else {
      // A dense parameter as one column [numel, 1]: all its elements share one step count,
      // so the step's scalars are computed once, not once per column.
      device.push_back(AdamwSelectedMatrix{p.numel, 1, 1, p.tensor.dtype, p.tensor.dtype, dense_[p.index].has_master});
    }
    device_plan_params_.push_back(i);
  }
  device_plan_ = std::make_unique<AdamwSelectedPlan>(std::move(device), hparams_);
  host_deferred_elements_ = 0;
  for (const Matrix& m : matrices_) host_deferred_elements_ += m.rows * m.own_deferred();
  for (Bucket& b : buckets_) {
    // The host side sees this rank's columns as the matrix (all of them on one engine): the
    // accumulators, the host update and the staging slot's layout.
    PackedLayout layout, device_layout;
    std::vector<zf_dtype> dtypes;
    const size_t count = b.last - b.first;
    b.selected_ptrs.clear();
    b.acc_tensors[0].clear();
    b.acc_tensors[1].clear();
    for (size_t i = b.first; i < b.last; ++i) {
      Matrix& m = matrices_[i];
      const auto own_k = static_cast<int64_t>(m.own_selected.size());
      layout.add(m.rows, m.own_cols, own_k);
      dtypes.push_back(b.dtype);
      for (int a = 0; a < 2; ++a)
        b.acc_tensors[a].push_back(host_tensor(m.acc[a].data(), ZF_DTYPE_F32, {m.own_deferred(), m.rows}));
      // The device pack of this rank's deferred columns skips the selected ones (one engine)
      // or every column outside this rank's chunk (data parallel): the same packed layout.
      if (parallel()) {
        const int64_t skip = m.rank_skip_count[static_cast<size_t>(rank_)];
        device_layout.add(m.rows, m.cols, skip);
        b.selected_ptrs.push_back(skip > 0 ? device_int(m.dev_rank_skip) + static_cast<size_t>(rank_ * m.cols)
                                           : nullptr);
      } else {
        const auto k = static_cast<int64_t>(m.selected.size());
        device_layout.add(m.rows, m.cols, k);
        b.selected_ptrs.push_back(k > 0 ? device_int(m.dev_selected) : nullptr);
      }
    }
    const size_t element = zf_dtype_size(b.dtype);
    b.packed_bytes = static_cast<size_t>(layout.total()) * element;
    b.update_groups.clear();
    int64_t group_elements = 0;
    for (size_t i = b.first; i < b.last; ++i) {
      Matrix& m = matrices_[i];
      const PackedMatrix& placed = layout[i - b.first];
      m.upload_offset = b.upload_offset + static_cast<size_t>(placed.offset) * element;
      if (placed.unselected() == 0) continue;
      if (b.update_groups.empty() || group_elements >= kUpdateChunkElements) {
        b.update_groups.emplace_back();
        b.update_groups.back().upload_offset = m.upload_offset;
        group_elements = 0;
      }
      UpdateGroup& group = b.update_groups.back();
      group.matrices.push_back(i);
      group.states.push_back(host_state(m, true));
      group_elements += placed.elements();
    }
    for (UpdateGroup& group : b.update_groups) {
      // The deferred host layout is the packed layout's: no column to skip, and the group's
      // matrices are consecutive in U.
      std::vector<zf_tensor> grads;
      int64_t elements = 0;
      for (size_t g = 0; g < group.matrices.size(); ++g) {
        zf_tensor grad = group.states[g].exp_avg;
        grad.data = matrices_[group.matrices[g]].acc[0].data();
        grads.push_back(grad);
        elements += numel(grad);
      }
      const zf_tensor out = host_tensor(upload_.data() + group.upload_offset, b.dtype, {elements});
      const size_t count = group.matrices.size();
      group.update_plan.build(group.states.data(), nullptr, count, grads.data(), nullptr, &out);
      group.fused_update_plan.build(group.states.data(), nullptr, count, nullptr, &out, &out);
    }
    const zf_tensor packed = host_tensor(ring_.host_slot(0) + kSlotHeaderBytes, b.dtype, {layout.total()});
    b.accumulate.build(b.acc_tensors[0].data(), nullptr, count, &packed);
    b.pack = std::make_unique<PackPlan>(std::move(device_layout), dtypes, b.dtype);
    b.matrix_tensors.assign(count, zf_tensor{});
    if (parallel() || releasing()) rebuild_selected_pack(b, dtypes);
    if (parallel()) rebuild_parallel_plans(b, dtypes);
  }
}

}  // namespace zf
