// Data parallel (zenflow/engine.h, docs/design.md section 9): the engine as one of N ranks.
// Ownership: rank r owns columns [r*n/N, (r+1)*n/N) of each matrix; its host state, staging
// slots and U cover those columns only. Each step:
//   1. the gradients are reduced in place: the dense parameters and the selected columns
//      all-reduced, the deferred columns reduce-scattered (rank q's chunk, then scattered back
//      into the gradient), or, at a selection step, every column all-reduced;
//   2. each rank's matrix column sums cover the columns it owns (the others are zeroed) and
//      are all-reduced with the non-finite flags: every rank sees the same sums, so the same
//      norm, top-k and window schedule;
//   3. the host update's result goes up as this rank's chunk and is all-gathered, then every
//      rank's chunk is scattered into the weights.
// On one engine (world 1) every function here is a no-op or the one-engine case.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "engine/engine.hpp"

namespace zf {
namespace {

int64_t chunk_lo(int64_t cols, int rank, int world) { return cols * rank / world; }

}  // namespace

void Engine::set_collectives(const zf_engine_collectives* c) {
  require(!initialized_ && !arena_.exists(), ZF_ERROR_INVALID_VALUE,
          "collectives: set before the device memory is attached and before the first step or load");
  if (c != nullptr && c->world_size != 1) {
    require(c->world_size >= 1, ZF_ERROR_INVALID_VALUE, "collectives.world_size: must be >= 1, got ", c->world_size);
    require(c->rank >= 0 && c->rank < c->world_size, ZF_ERROR_INVALID_VALUE, "collectives.rank: ", c->rank,
            " is not in [0, ", c->world_size, ")");
    require(c->all_reduce_sum != nullptr && c->reduce_scatter_sum != nullptr && c->all_gather != nullptr,
            ZF_ERROR_INVALID_VALUE, "collectives: all_reduce_sum, reduce_scatter_sum and all_gather must not be NULL");
  } else if (c != nullptr) {
    require(c->rank == 0, ZF_ERROR_INVALID_VALUE, "collectives.rank: ", c->rank, " is not in [0, 1)");
  }
  comm_ = c != nullptr ? *c : zf_engine_collectives{};
  world_ = c != nullptr ? c->world_size : 1;
  rank_ = c != nullptr ? c->rank : 0;
  // Re-plan the host buffers and device memory for this rank's columns; nothing uses them yet.
  const int lane_threads = lane_->threads();
  lane_.reset();
  buckets_.clear();
  set_ownership();
  setup_buckets_and_memory();
  lane_ = make_host_lane(lane_threads);
}

void Engine::set_ownership() {
  for (Matrix& m : matrices_) {
    m.own_lo = chunk_lo(m.cols, rank_, world_);
    m.own_cols = chunk_lo(m.cols, rank_ + 1, world_) - m.own_lo;
    m.own_selected.clear();
    m.rank_skip_count.assign(static_cast<size_t>(world_), 0);
  }
}

void Engine::parallel_memory() {
  reduce_offset_ = reduce_bytes_ = shard_offset_ = shard_bytes_ = health_offset_ = 0;
  exchange_offset_ = exchange_bytes_ = lists_offset_ = 0;
  if (!parallel() && !releasing()) return;
  auto take = [this](size_t bytes) { return arena_.take(bytes); };
  // Per matrix: the deferred list (n i32) and, data parallel, one skip list per rank (n i32
  // each). One engine needs the deferred list for release_gradients' compact copy.
  const size_t rank_lists = parallel() ? static_cast<size_t>(world_) : 0;
  size_t lists = 0;
  for (Matrix& m : matrices_) {
    m.dev_deferred = lists;
    m.dev_rank_skip = lists + static_cast<size_t>(m.cols) * 4;
    lists += static_cast<size_t>(m.cols) * 4 * (1 + rank_lists);
  }
  lists_offset_ = take(lists);
  for (Matrix& m : matrices_) {
    m.dev_deferred += lists_offset_;
    m.dev_rank_skip += lists_offset_;
  }
  if (!parallel()) return;
  // The reduction scratch holds a reduction group as world chunks (the largest any rank gets
  // with nothing selected, padded) or whole, or a run of dense gradients; the shard one chunk.
  plan_reduction_groups();
  size_t dense_bytes = 0;
  for (const Dense& d : dense_) {
    const Param& p = params_[d.param];
    dense_bytes += static_cast<size_t>(p.numel) * zf_dtype_size(p.tensor.dtype);
  }
  reduce_bytes_ = std::min(dense_bytes, std::max<size_t>(config_.bucket_bytes, 1 << 20));
  for (Bucket& b : buckets_) {
    const size_t element = zf_dtype_size(b.dtype);
    for (const ReductionGroup& g : b.groups) {
      size_t max_chunk = 0, whole = 0;  // the largest chunk of any rank with nothing selected
      for (int q = 0; q < world_; ++q) {
        size_t elements = 0;
        for (size_t i = g.first; i < g.last; ++i) {
          const Matrix& m = matrices_[i];
          elements += static_cast<size_t>(m.rows * (chunk_lo(m.cols, q + 1, world_) - chunk_lo(m.cols, q, world_)));
        }
        max_chunk = std::max(max_chunk, elements);
        whole += elements;
      }
      reduce_bytes_ = std::max(reduce_bytes_, std::max(whole, max_chunk * static_cast<size_t>(world_)) * element);
      shard_bytes_ = std::max(shard_bytes_, max_chunk * element);
    }
  }
  reduce_offset_ = take(reduce_bytes_);
  shard_offset_ = take(shard_bytes_);
  health_offset_ = take(static_cast<size_t>(world_) * 4);
  // The selection's exchange of entering columns, and the synchronous start's two sums.
  exchange_bytes_ = 2 * sizeof(float);
  for (const Matrix& m : matrices_) exchange_bytes_ = std::max(exchange_bytes_, m.compact_bytes);
  exchange_offset_ = take(exchange_bytes_);
}

void Engine::set_own_selected(Matrix& m) {
  m.own_selected.clear();
  for (int32_t j : m.selected)
    if (j >= m.own_lo && j < m.own_lo + m.own_cols) m.own_selected.push_back(static_cast<int32_t>(j - m.own_lo));
}

void Engine::upload_selection(Matrix& m) {
  set_own_selected(m);
  upload(arena_.base() + m.dev_selected, m.selected.data(), m.selected.size() * 4);
  if (!parallel() && !releasing()) return;
  const auto cols = static_cast<size_t>(m.cols);
  std::vector<uint8_t> is_selected(cols, 0);
  for (int32_t j : m.selected) is_selected[static_cast<size_t>(j)] = 1;
  std::vector<int32_t> lists(cols * static_cast<size_t>(parallel() ? 1 + world_ : 1), 0);
  size_t deferred = 0;
  for (size_t j = 0; j < cols; ++j)
    if (!is_selected[j]) lists[deferred++] = static_cast<int32_t>(j);
  for (int q = 0; parallel() && q < world_; ++q) {
    const int64_t lo = chunk_lo(m.cols, q, world_), hi = chunk_lo(m.cols, q + 1, world_);
    int32_t* skip = lists.data() + cols * static_cast<size_t>(1 + q);
    size_t count = 0;
    for (size_t j = 0; j < cols; ++j) {
      const auto column = static_cast<int64_t>(j);
      if (column < lo || column >= hi || is_selected[j]) skip[count++] = static_cast<int32_t>(j);
    }
    m.rank_skip_count[static_cast<size_t>(q)] = static_cast<int64_t>(count);
  }
  upload(arena_.base() + m.dev_deferred, lists.data(), lists.size() * 4);
}

void Engine::plan_reduction_groups() {
  // A bucket is cut into the fewest groups of at most the rank's share of a bucket (in
  // gradient bytes), made about even: a group closes when it reaches the even share or the
  // next matrix would take it over the budget. A matrix larger than that is a group of its own.
  const size_t budget = std::max<size_t>(1, config_.bucket_bytes / static_cast<size_t>(world_));
  for (Bucket& b : buckets_) {
    b.groups.clear();
    const size_t element = zf_dtype_size(b.dtype);
    auto bytes_of = [&](size_t i) { return static_cast<size_t>(matrices_[i].rows * matrices_[i].cols) * element; };
    size_t total = 0;
    for (size_t i = b.first; i < b.last; ++i) total += bytes_of(i);
    const size_t count = std::max<size_t>(1, (total + budget - 1) / budget);
    const size_t even = (total + count - 1) / count;
    size_t bytes = 0;
    for (size_t i = b.first; i < b.last; ++i) {
      const size_t matrix_bytes = bytes_of(i);
      if (b.groups.empty() || bytes >= even || bytes + matrix_bytes > budget) {
        b.groups.emplace_back();
        b.groups.back().first = i;
        bytes = 0;
      }
      b.groups.back().last = i + 1;
      bytes += matrix_bytes;
    }
  }
}

void Engine::rebuild_parallel_plans(Bucket& b, const std::vector<zf_dtype>& dtypes) {
  const size_t count = b.last - b.first;
  b.rank_skip_ptrs.assign(static_cast<size_t>(world_), {});
  b.no_skip_ptrs.assign(count, nullptr);
  for (int q = 0; q < world_; ++q)
    for (size_t i = b.first; i < b.last; ++i) {
      const Matrix& m = matrices_[i];
      b.rank_skip_ptrs[static_cast<size_t>(q)].push_back(m.rank_skip_count[static_cast<size_t>(q)] > 0
                                                             ? device_int(m.dev_rank_skip) +
                                                                   static_cast<size_t>(q) * static_cast<size_t>(m.cols)
                                                             : nullptr);
    }
  for (ReductionGroup& g : b.groups) {
    const std::vector<zf_dtype> group_dtypes(dtypes.begin() + static_cast<ptrdiff_t>(g.first - b.first),
                                             dtypes.begin() + static_cast<ptrdiff_t>(g.last - b.first));
    g.rank_pack.clear();
    g.chunk_elements = 0;
    for (int q = 0; q < world_; ++q) {
      PackedLayout layout;
      for (size_t i = g.first; i < g.last; ++i)
        layout.add(matrices_[i].rows, matrices_[i].cols, matrices_[i].rank_skip_count[static_cast<size_t>(q)]);
      g.chunk_elements = std::max(g.chunk_elements, static_cast<size_t>(layout.total()));
      if (q == rank_) g.own_elements = static_cast<size_t>(layout.total());
      g.rank_pack.push_back(std::make_unique<PackPlan>(std::move(layout), group_dtypes, b.dtype));
    }
    PackedLayout whole_layout, selected_layout;
    for (size_t i = g.first; i < g.last; ++i) {
      const Matrix& m = matrices_[i];
      whole_layout.add(m.rows, m.cols, 0);
      selected_layout.add(m.rows, m.cols, m.cols - static_cast<int64_t>(m.selected.size()));
    }
    g.selected_elements = static_cast<size_t>(selected_layout.total());
    g.deferred_elements = static_cast<size_t>(whole_layout.total()) - g.selected_elements;
    g.whole_pack = std::make_unique<PackPlan>(std::move(whole_layout), group_dtypes, b.dtype);
    g.selected_pack = std::make_unique<PackPlan>(std::move(selected_layout), group_dtypes, b.dtype);
  }
}

void Engine::rebuild_selected_pack(Bucket& b, const std::vector<zf_dtype>& dtypes) {
  PackedLayout selected_layout;
  b.deferred_ptrs.clear();
  for (size_t i = b.first; i < b.last; ++i) {
    const Matrix& m = matrices_[i];
    const auto deferred = m.cols - static_cast<int64_t>(m.selected.size());
    selected_layout.add(m.rows, m.cols, deferred);
    b.deferred_ptrs.push_back(deferred > 0 ? device_int(m.dev_deferred) : nullptr);
  }
  b.selected_elements = static_cast<size_t>(selected_layout.total());
  b.selected_pack = std::make_unique<PackPlan>(std::move(selected_layout), dtypes, b.dtype);
}

// ---- collectives ----

void Engine::collective_failed(const char* what, zf_status status) {
  const char* detail = comm_.last_error != nullptr ? comm_.last_error(comm_.user) : nullptr;
  fail_sticky(status == ZF_SUCCESS ? ZF_ERROR_INTERNAL : status,
              std::string("engine collective ") + what + " failed on rank " + std::to_string(rank_) + " of " +
                  std::to_string(world_) + (detail != nullptr && *detail ? std::string(": ") + detail : "") +
                  " (the engine refuses steps until it loads a state)");
}

void Engine::all_reduce(void* data, size_t count, zf_dtype dtype, int64_t* bytes) {
  if (count == 0) return;
  const zf_status status = comm_.all_reduce_sum(comm_.user, data, count, dtype, backend_->compute_stream());
  if (status != ZF_SUCCESS) collective_failed("all_reduce_sum", status);
  add_saturating(*bytes, static_cast<int64_t>(count * zf_dtype_size(dtype)));
}

namespace {

const char* agreement_name(int32_t call) {
  switch (call) {
    case 1:
      return "a step";
    case 2:
      return "a flush";
    case 3:
      return "a save";
    case 4:
      return "a load";
    case 5:
      return "a step overlapped with backward";
    default:
      return "no engine call";
  }
}

constexpr int32_t kStepCall = static_cast<int32_t>(Engine::Agreement::kStep);
constexpr int32_t kSplitCall = static_cast<int32_t>(Engine::Agreement::kSplitStep);

// A plain step meets a split step's begin as the same call: it then takes the split form.
bool same_call(int32_t a, int32_t b) {
  const auto step = [](int32_t c) { return c == kStepCall || c == kSplitCall; };
  return a == b || (step(a) && step(b));
}

}  // namespace

bool Engine::agree(Agreement call, const std::function<void()>& checks) {
  if (!parallel()) {
    checks();
    return false;
  }
  // Every rank reaches this point once per call that runs collectives. Each writes its slot:
  // the call it is in, times 4, plus 0, a refused call (1) or a sticky failure (2); the sum
  // over the ranks is every slot. So the others raise alike when one failed, every rank raises
  // when they are in different calls, and nobody waits in a collective another will not join.
  std::exception_ptr local;
  int32_t local_flag = 0;
  try {
    checks();
  } catch (...) {
    local = std::current_exception();
    local_flag = sticky_ ? 2 : 1;
  }
  ensure_device_memory();
  std::vector<int32_t> slots(static_cast<size_t>(world_), 0);
  slots[static_cast<size_t>(rank_)] = static_cast<int32_t>(call) * 4 + local_flag;
  const auto start = std::chrono::steady_clock::now();
  upload(arena_.base() + health_offset_, slots.data(), slots.size() * 4);
  all_reduce(arena_.base() + health_offset_, slots.size(), ZF_DTYPE_I32, &collective_stats_bytes_);
  download(slots.data(), arena_.base() + health_offset_, slots.size() * 4);
  if (!backend_->host_visible())
    stall_readback_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return judge_agreement(call, slots, local);
}

bool Engine::judge_agreement(Agreement call, const std::vector<int32_t>& slots, const std::exception_ptr& local) {
  if (local) std::rethrow_exception(local);
  const auto own_call = static_cast<int32_t>(call);
  std::string elsewhere;
  bool other_form = false;
  for (int q = 0; q < world_; ++q) {
    const int32_t other = slots[static_cast<size_t>(q)] / 4;
    if (other == 0) continue;  // end_step's folded agreement: every rank is in that step
    other_form = other_form || other != own_call;
    if (same_call(other, own_call)) continue;
    elsewhere +=
        (elsewhere.empty() ? "" : ", ") + std::string("rank ") + std::to_string(q) + " in " + agreement_name(other);
  }
  if (!elsewhere.empty()) {
    throw Error(ZF_ERROR_INVALID_VALUE,
                "data parallel: rank " + std::to_string(rank_) + " is in " + agreement_name(own_call) + ", " +
                    elsewhere +
                    ": every rank must make the same engine calls in the same order (a setting changed on some "
                    "ranks only, or a flush or checkpoint on some ranks only); nothing ran on any rank");
  }
  std::string failed;
  bool sticky = false;
  for (int q = 0; q < world_; ++q) {
    const int32_t flag = slots[static_cast<size_t>(q)] % 4;
    if (flag == 0) continue;
    failed += (failed.empty() ? "" : ", ") + std::to_string(q);
    sticky = sticky || flag >= 2;
  }
  if (failed.empty()) return other_form;
  const std::string message = "data parallel: rank(s) " + failed + " of " + std::to_string(world_) +
                              " failed in this call (see their error); rank " + std::to_string(rank_) +
                              " stops with them" + (sticky ? " (the engine refuses steps until it loads a state)" : "");
  if (sticky) fail_sticky(ZF_ERROR_INVALID_VALUE, message);
  throw Error(ZF_ERROR_INVALID_VALUE, message);
}

static_assert(static_cast<int>(Engine::Agreement::kStep) == ZF_ENGINE_CALL_STEP &&
                  static_cast<int>(Engine::Agreement::kFlush) == ZF_ENGINE_CALL_FLUSH &&
                  static_cast<int>(Engine::Agreement::kSave) == ZF_ENGINE_CALL_SAVE &&
                  static_cast<int>(Engine::Agreement::kLoad) == ZF_ENGINE_CALL_LOAD,
              "the agreement's calls are zf_engine_call's");

void Engine::refuse(zf_engine_call call) {
  if (!parallel()) return;
  const auto refusal = [] {
    fail(ZF_ERROR_INVALID_VALUE, "zf_engine_refuse: the caller refused this call on this rank");
  };
  if (call == ZF_ENGINE_CALL_STEP && in_split_step_) {
    // The others are in this split step's collectives (or on their way): join them as refused.
    std::exception_ptr local;
    try {
      refusal();
    } catch (...) {
      local = std::current_exception();
    }
    end_split_step_refused(local);
  }
  agree(static_cast<Agreement>(call), refusal);
}

void Engine::reduce_gradients(const zf_tensor* grads, bool whole) {
  reduce_dense(grads);
  for (Bucket& b : buckets_) reduce_bucket(b, grads, whole);
}

void Engine::reduce_dense(const zf_tensor* grads) {
  // Consecutive dense gradients of one dtype share an all-reduce through the scratch; a
  // larger one goes in pieces. Without gradients (a refused rank) the pieces are zeros.
  uint8_t* scratch = arena_.base() + reduce_offset_;
  struct Piece {
    void* grad;
    size_t at, bytes;
  };
  std::vector<Piece> run;
  size_t used = 0;
  zf_dtype run_dtype = ZF_DTYPE_F32;
  auto flush_run = [&]() {
    if (used == 0) return;
    all_reduce(scratch, used / zf_dtype_size(run_dtype), run_dtype, &collective_gradient_bytes_);
    for (const Piece& piece : run) backend_->copy_device(piece.grad, scratch + piece.at, piece.bytes);
    run.clear();
    used = 0;
  };
  for (const Dense& d : dense_) {
    const Param& p = params_[d.param];
    const zf_dtype dtype = p.tensor.dtype;
    const size_t element = zf_dtype_size(dtype);
    const size_t capacity = reduce_bytes_ / element * element;
    auto* grad = grads != nullptr ? static_cast<uint8_t*>(grads[d.param].data) : nullptr;
    size_t bytes = static_cast<size_t>(p.numel) * element;
    if (dtype != run_dtype) flush_run();
    run_dtype = dtype;
    while (bytes > 0) {
      if (used == capacity) flush_run();
      const size_t piece = std::min(bytes, capacity - used);
      if (grad != nullptr) {
        backend_->copy_device(scratch + used, grad, piece);
        run.push_back(Piece{grad, used, piece});
        grad += piece;
      } else {
        backend_->fill_device_zero(scratch + used, piece);
      }
      used += piece;
      bytes -= piece;
    }
  }
  flush_run();
}

void Engine::reduce_bucket(Bucket& b, const zf_tensor* grads, bool whole) {
  const bool zeros = grads == nullptr;
  if (!zeros) bind_gradients(b, grads);
  // The bucket's selected columns in one all-reduce when they fit the scratch (fewer calls;
  // they are about topk_ratio of the bucket), else group by group.
  const bool selected_at_once = !whole && b.selected_elements * zf_dtype_size(b.dtype) <= reduce_bytes_;
  if (selected_at_once && b.selected_elements > 0)
    all_reduce_columns(*b.selected_pack, b.matrix_tensors.data(), b.deferred_ptrs.data(), b.selected_elements, b.dtype,
                       zeros);
  for (ReductionGroup& g : b.groups) reduce_group(b, g, zeros, whole, !selected_at_once);
}

void Engine::all_reduce_columns(const PackPlan& plan, zf_tensor* tensors, const int32_t* const* skip, size_t elements,
                                zf_dtype dtype, bool zeros) {
  uint8_t* scratch = arena_.base() + reduce_offset_;
  if (zeros)
    backend_->fill_device_zero(scratch, elements * zf_dtype_size(dtype));
  else
    backend_->pack(plan, tensors, skip, scratch);
  all_reduce(scratch, elements, dtype, &collective_gradient_bytes_);
  if (!zeros) backend_->scatter(plan, tensors, skip, scratch);
}

void Engine::reduce_group(Bucket& b, ReductionGroup& g, bool zeros, bool whole, bool selected) {
  // The group's slices of the bucket's tensors and skip lists.
  const size_t at = g.first - b.first;
  zf_tensor* tensors = b.matrix_tensors.data() + at;
  uint8_t* scratch = arena_.base() + reduce_offset_;
  const size_t element = zf_dtype_size(b.dtype);
  if (whole)
    return all_reduce_columns(*g.whole_pack, tensors, b.no_skip_ptrs.data() + at,
                              g.selected_elements + g.deferred_elements, b.dtype, zeros);
  if (selected && g.selected_elements > 0)
    all_reduce_columns(*g.selected_pack, tensors, b.deferred_ptrs.data() + at, g.selected_elements, b.dtype, zeros);
  if (g.deferred_elements > 0) {
    // Rank q's chunk at q * chunk_elements, each padded to the largest (zeros when this
    // rank adds none); the pad is never scattered.
    if (zeros) backend_->fill_device_zero(scratch, static_cast<size_t>(world_) * g.chunk_elements * element);
    for (int q = 0; !zeros && q < world_; ++q)
      backend_->pack(*g.rank_pack[static_cast<size_t>(q)], tensors,
                     b.rank_skip_ptrs[static_cast<size_t>(q)].data() + at,
                     scratch + static_cast<size_t>(q) * g.chunk_elements * element);
    uint8_t* shard = arena_.base() + shard_offset_;
    const zf_status status =
        comm_.reduce_scatter_sum(comm_.user, scratch, shard, g.chunk_elements, b.dtype, backend_->compute_stream());
    if (status != ZF_SUCCESS) collective_failed("reduce_scatter_sum", status);
    add_saturating(collective_gradient_bytes_,
                   static_cast<int64_t>(g.chunk_elements * element * static_cast<size_t>(world_)));
    if (!zeros)
      backend_->scatter(*g.rank_pack[static_cast<size_t>(rank_)], tensors,
                        b.rank_skip_ptrs[static_cast<size_t>(rank_)].data() + at, shard);
  }
}

void Engine::share_statistics(bool end_of_split_step, std::exception_ptr local) {
  // Each matrix column's sum counts once: from the rank owning it (its reduced gradient is
  // there). x + 0 is exact, so the all-reduced sums are the owners' bits, on every rank. The
  // dense parameters' sums are not shared: their gradients are all-reduced, the same bits on
  // every rank, and so are their sums.
  for (const Matrix& m : matrices_) {
    float* col_sq = device_float(col_sq_offset_) + m.col_offset;
    backend_->fill_device_zero(col_sq, static_cast<size_t>(m.own_lo) * 4);
    const int64_t hi = m.own_lo + m.own_cols;
    backend_->fill_device_zero(col_sq + hi, static_cast<size_t>(m.cols - hi) * 4);
  }
  all_reduce(arena_.base() + col_sq_offset_, matrix_col_floats_, ZF_DTYPE_F32, &collective_stats_bytes_);
  if (!end_of_split_step) {
    all_reduce(arena_.base() + flags_offset_, flag_count(), ZF_DTYPE_I32, &collective_stats_bytes_);
    return;
  }
  // A split step's end: the ranks agreed at begin_step and ran the same collectives since. A
  // rank that goes on leaves its slot after the flags 0 (zeroed at begin_step: no upload, no
  // wait); one that refuses its end (`local`, end_split_step_refused) or failed during the
  // step (a host-lane job: sticky) writes 1 or 2. One all-reduce carries both, and the slots
  // come back to the host: the step's only wait for the device before its decision.
  if (!local && sticky_) local = std::make_exception_ptr(Error(sticky_status_, sticky_message_));
  if (local) {
    const int32_t failed = sticky_ ? 2 : 1;
    upload(device_int(flags_offset_) + flag_count() + rank_, &failed, 4);
  }
  all_reduce(arena_.base() + flags_offset_, flag_count() + agreement_slots(), ZF_DTYPE_I32, &collective_stats_bytes_);
  std::vector<int32_t> slots(agreement_slots(), 0);
  const auto start = std::chrono::steady_clock::now();
  download(slots.data(), device_int(flags_offset_) + flag_count(), slots.size() * 4);
  if (!backend_->host_visible())
    stall_readback_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  judge_agreement(Agreement::kSplitStep, slots, local);
}

void Engine::gather_upload(Bucket& b) {
  // Per reduction group: this rank's chunk goes up into the shard buffer (after the compute
  // lane's last use of it), is all-gathered into the scratch, and every rank's chunk is
  // scattered into the weights. The group's chunk is contiguous in U (its matrices follow
  // one another in the bucket's layout).
  const size_t element = zf_dtype_size(b.dtype);
  uint8_t* shard = arena_.base() + shard_offset_;
  uint8_t* scratch = arena_.base() + reduce_offset_;
  bind_weights(b);
  for (ReductionGroup& g : b.groups) {
    if (g.deferred_elements == 0) continue;  // on every rank: nothing to gather
    const size_t at = g.first - b.first;
    const size_t own_bytes = g.own_elements * element;
    if (own_bytes > 0) {
      backend_->wait(Lane::kUp, backend_->record(Lane::kCompute));
      backend_->copy_up(shard, upload_copy(window_.result_buffer()) + matrices_[g.first].upload_offset, own_bytes);
      backend_->wait(Lane::kCompute, backend_->record(Lane::kUp));
      add_saturating(bytes_up_, static_cast<int64_t>(own_bytes));
    }
    const zf_status status =
        comm_.all_gather(comm_.user, shard, scratch, g.chunk_elements, b.dtype, backend_->compute_stream());
    if (status != ZF_SUCCESS) collective_failed("all_gather", status);
    add_saturating(collective_upload_bytes_,
                   static_cast<int64_t>(g.chunk_elements * element * static_cast<size_t>(world_)));
    for (int q = 0; q < world_; ++q)
      backend_->scatter(*g.rank_pack[static_cast<size_t>(q)], b.matrix_tensors.data() + at,
                        b.rank_skip_ptrs[static_cast<size_t>(q)].data() + at,
                        scratch + static_cast<size_t>(q) * g.chunk_elements * element);
  }
  last_scatter_ = backend_->record(Lane::kCompute);
}

void Engine::share_entering_columns(float* const* arrays, size_t array_count, size_t floats_each, int32_t* steps,
                                    size_t steps_count) {
  // Through the exchange scratch (the collectives work on device memory): the floats, then
  // the step counts, summed in their own dtype.
  uint8_t* at = arena_.base() + exchange_offset_;
  const size_t float_bytes = array_count * floats_each * 4;
  for (size_t a = 0; a < array_count; ++a) upload(at + a * floats_each * 4, arrays[a], floats_each * 4);
  upload(at + float_bytes, steps, steps_count * 4);
  all_reduce(at, array_count * floats_each, ZF_DTYPE_F32, &collective_upload_bytes_);
  all_reduce(at + float_bytes, steps_count, ZF_DTYPE_I32, &collective_upload_bytes_);
  for (size_t a = 0; a < array_count; ++a) download(arrays[a], at + a * floats_each * 4, floats_each * 4);
  download(steps, at + float_bytes, steps_count * 4);
}

}  // namespace zf
