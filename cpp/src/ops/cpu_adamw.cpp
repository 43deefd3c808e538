// The host optimizer's C entry points: validation, the split of the work into contiguous
// pieces (one per tensor, or one per run of unselected columns sharing a step count), and
// the parallel run of the SIMD kernels over those pieces.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/adam_math.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"
#include "simd/kernels.hpp"
#include "zenflow/cpu_adam.h"

namespace zf {
namespace {

// Below this many elements the pool's wake-up costs more than the second thread saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;
// Threads split the work at multiples of a cache line of fp32 elements.
constexpr int64_t kSplitGranule = 16;
// From this many elements on, a bf16/f16 output copy is written with non-temporal stores:
// it no longer fits in cache, and is next read by the upload, not by this core.
constexpr int64_t kStreamOutMinElements = int64_t{1} << 22;

void check_hparams(const zf_adam_hparams* h) {
  require(h != nullptr, ZF_ERROR_INVALID_VALUE, "hparams: is NULL");
  require(std::isfinite(h->lr) && h->lr >= 0.0, ZF_ERROR_INVALID_VALUE, "hparams.lr: must be finite and >= 0, got ",
          h->lr);
  require(std::isfinite(h->beta1) && h->beta1 >= 0.0 && h->beta1 < 1.0, ZF_ERROR_INVALID_VALUE,
          "hparams.beta1: must be in [0, 1), got ", h->beta1);
  require(std::isfinite(h->beta2) && h->beta2 >= 0.0 && h->beta2 < 1.0, ZF_ERROR_INVALID_VALUE,
          "hparams.beta2: must be in [0, 1), got ", h->beta2);
  require(std::isfinite(h->eps) && h->eps >= 0.0, ZF_ERROR_INVALID_VALUE, "hparams.eps: must be finite and >= 0, got ",
          h->eps);
  require(std::isfinite(h->weight_decay) && h->weight_decay >= 0.0, ZF_ERROR_INVALID_VALUE,
          "hparams.weight_decay: must be finite and >= 0, got ", h->weight_decay);
  require(h->mode == ZF_ADAM_MODE_ADAMW || h->mode == ZF_ADAM_MODE_ADAM, ZF_ERROR_INVALID_VALUE,
          "hparams.mode: unknown mode ", static_cast<int>(h->mode));
}

AdamHyperParams to_hyper(const zf_adam_hparams& h) {
  return AdamHyperParams{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.mode == ZF_ADAM_MODE_ADAMW};
}

void check_cpu(const zf_tensor& t, const std::string& name) {
  require(t.device.type == ZF_DEVICE_CPU, ZF_ERROR_INVALID_TYPE, name, ": must be a CPU tensor, is on ",
          describe_device(t.device));
}

// A CPU, contiguous tensor of one of `dtypes`.
void check_host_tensor(const zf_tensor* t, const std::string& name, std::initializer_list<zf_dtype> dtypes) {
  check_descriptor(t, name);
  check_cpu(*t, name);
  check_dtype(*t, name, dtypes);
  check_contiguous(*t, name);
}

void check_disjoint(const zf_tensor& a, const std::string& a_name, const zf_tensor& b, const std::string& b_name) {
  const auto a_begin = reinterpret_cast<uintptr_t>(a.data);
  const auto b_begin = reinterpret_cast<uintptr_t>(b.data);
  const uintptr_t a_end = a_begin + static_cast<uintptr_t>(numel(a)) * zf_dtype_size(a.dtype);
  const uintptr_t b_end = b_begin + static_cast<uintptr_t>(numel(b)) * zf_dtype_size(b.dtype);
  if (a_begin == a_end || b_begin == b_end) return;
  require(a_end <= b_begin || b_end <= a_begin, ZF_ERROR_INVALID_VALUE, a_name, ": overlaps ", b_name,
          " in memory (each buffer must be distinct)");
}

// Selected columns as int64, checked strictly increasing and inside [0, n).
std::vector<int64_t> read_selected(const zf_tensor* selected, const std::string& name, int64_t n) {
  check_host_tensor(selected, name, {ZF_DTYPE_I32, ZF_DTYPE_I64});
  check_ndim(*selected, name, 1);
  const int64_t k = selected->shape[0];
  require(k <= n, ZF_ERROR_INVALID_VALUE, name, ": has ", k, " indices for ", n, " columns");
  std::vector<int64_t> indices(static_cast<size_t>(k));
  for (int64_t c = 0; c < k; ++c) {
    indices[static_cast<size_t>(c)] = selected->dtype == ZF_DTYPE_I32 ? static_cast<const int32_t*>(selected->data)[c]
                                                                      : static_cast<const int64_t*>(selected->data)[c];
  }
  for (int64_t c = 0; c < k; ++c) {
    const int64_t index = indices[static_cast<size_t>(c)];
    require(index >= 0 && index < n, ZF_ERROR_INVALID_VALUE, name, "[", c, "]: column ", index, " is out of range for ",
            n, " columns");
    require(c == 0 || indices[static_cast<size_t>(c - 1)] < index, ZF_ERROR_INVALID_VALUE, name,
            ": indices must be strictly increasing (sorted, no duplicates); ", name, "[", c - 1,
            "] = ", indices[static_cast<size_t>(c - 1)], " then ", name, "[", c, "] = ", index);
  }
  return indices;
}

// One contiguous stretch of work: `length` elements at the given offsets of tensor `tensor`.
struct Piece {
  int64_t work_begin;  // position in the call's concatenated work
  int64_t length;
  size_t tensor;
  int64_t state_offset;  // into param / exp_avg / exp_avg_sq (or the accumulator)
  int64_t grad_offset;   // into grad (or the block)
  int64_t out_offset;
  int32_t scalars;  // index into the call's table of step scalars
};

class PieceList {
 public:
  void add(size_t tensor, int64_t state_offset, int64_t grad_offset, int64_t out_offset, int64_t length,
           int32_t scalars) {
    if (length == 0) return;
    pieces_.push_back(Piece{total_, length, tensor, state_offset, grad_offset, out_offset, scalars});
    total_ += length;
  }
  int64_t total() const { return total_; }

  // Runs body(piece, offset_in_piece, count) over every piece, the concatenated work split
  // into one contiguous range per thread of the pool.
  template <class Body>
  void run(const Body& body) const {
    if (total_ == 0) return;
    const std::shared_ptr<ThreadPool> pool_owner = global_thread_pool();
    ThreadPool& pool = *pool_owner;
    if (total_ < kParallelMinElements || pool.size() == 1) {
      run_range(0, total_, body);
      return;
    }
    const int64_t granules = (total_ + kSplitGranule - 1) / kSplitGranule;
    pool.run([&](int thread, int threads) {
      int64_t first, last;
      split_range(0, granules, thread, threads, &first, &last);
      run_range(first * kSplitGranule, std::min(total_, last * kSplitGranule), body);
    });
  }

 private:
  template <class Body>
  void run_range(int64_t begin, int64_t end, const Body& body) const {
    if (begin >= end) return;
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), begin,
                               [](int64_t position, const Piece& p) { return position < p.work_begin; });
    for (--it; it != pieces_.end() && it->work_begin < end; ++it) {
      const int64_t lo = std::max(begin, it->work_begin);
      const int64_t hi = std::min(end, it->work_begin + it->length);
      body(*it, lo - it->work_begin, hi - lo);
    }
  }

  std::vector<Piece> pieces_;
  int64_t total_ = 0;
};

// The distinct step counts of a call, each with its scalars computed once.
class StepScalarTable {
 public:
  explicit StepScalarTable(const AdamHyperParams& hyper) : hyper_(hyper) {}
  int32_t index_of(int64_t step) {
    if (step == last_step_) return last_index_;
    auto found = index_.find(step);
    if (found == index_.end()) {
      found = index_.emplace(step, static_cast<int32_t>(scalars_.size())).first;
      scalars_.push_back(adam_step_scalars(hyper_, step));
    }
    last_step_ = step;
    last_index_ = found->second;
    return last_index_;
  }
  const AdamStepScalars& operator[](int32_t index) const { return scalars_[static_cast<size_t>(index)]; }

 private:
  AdamHyperParams hyper_;
  std::vector<AdamStepScalars> scalars_;
  std::unordered_map<int64_t, int32_t> index_;
  int64_t last_step_ = -1;
  int32_t last_index_ = -1;
};

char* byte_pointer(const zf_tensor& t, int64_t element) {
  return static_cast<char*>(t.data) + element * static_cast<int64_t>(zf_dtype_size(t.dtype));
}

void run_adam_pieces(const PieceList& pieces, const StepScalarTable& table, const zf_tensor* params,
                     const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs, const zf_tensor* grads,
                     const zf_tensor* out_params, float grad_scale, bool zero_grad) {
  const simd::KernelTable& kernels = simd::active_kernels();
  pieces.run([&](const Piece& piece, int64_t offset, int64_t count) {
    const size_t i = piece.tensor;
    const int64_t state = piece.state_offset + offset;
    simd::AdamStepArgs args;
    args.param = static_cast<float*>(params[i].data) + state;
    args.exp_avg = static_cast<float*>(exp_avgs[i].data) + state;
    args.exp_avg_sq = static_cast<float*>(exp_avg_sqs[i].data) + state;
    args.grad = byte_pointer(grads[i], piece.grad_offset + offset);
    args.grad_dtype = grads[i].dtype;
    args.out = out_params ? byte_pointer(out_params[i], piece.out_offset + offset) : nullptr;
    args.out_dtype = out_params ? out_params[i].dtype : ZF_DTYPE_F32;
    args.zero_grad = zero_grad;
    args.stream_out = pieces.total() >= kStreamOutMinElements;
    args.grad_scale = grad_scale;
    args.scalars = table[piece.scalars];
    kernels.adam_step(args, count);
  });
}

void check_lists(const void* a, const void* b, const void* c, const void* d, size_t count) {
  require(count == 0 || (a != nullptr && b != nullptr && c != nullptr && d != nullptr), ZF_ERROR_INVALID_VALUE,
          "params/exp_avgs/exp_avg_sqs/grads: NULL array with count=", count);
}

void check_flags(uint32_t flags, uint32_t allowed) {
  require((flags & ~allowed) == 0, ZF_ERROR_INVALID_VALUE, "flags: unknown or unsupported bits ", flags & ~allowed);
}

// The five tensors of one matrix's Adam call (params, m, v, grads, optional out_params) with
// their argument names: the dtype, shape and overlap checks both entry points share.
struct AdamOperands {
  const zf_tensor* tensors[5];
  std::string names[5];

  AdamOperands(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs, const zf_tensor* grads,
               const zf_tensor* out_params, size_t i)
      : tensors{&params[i], &exp_avgs[i], &exp_avg_sqs[i], &grads[i], out_params ? &out_params[i] : nullptr},
        names{arg_name("params", i), arg_name("exp_avgs", i), arg_name("exp_avg_sqs", i), arg_name("grads", i),
              arg_name("out_params", i)} {}

  // m and v are f32, grads and out_params f32/bf16/f16; check_shape(t, tensor, name) runs
  // for every present operand t >= 1; no two operands may overlap.
  template <class ShapeCheck>
  void check(const ShapeCheck& check_shape) const {
    for (int t = 1; t < 5; ++t) {
      if (tensors[t] == nullptr) continue;
      if (t <= 2) {
        check_host_tensor(tensors[t], names[t], {ZF_DTYPE_F32});
      } else {
        check_host_tensor(tensors[t], names[t], {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
      }
      check_shape(t, *tensors[t], names[t]);
    }
    for (int a = 0; a < 5; ++a) {
      for (int b = a + 1; b < 5; ++b) {
        if (tensors[a] && tensors[b]) check_disjoint(*tensors[a], names[a], *tensors[b], names[b]);
      }
    }
  }
};

// ---- zf_cpu_adamw_step ----

void adamw_step(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs,
                const zf_tensor* grads, const zf_tensor* out_params, const int64_t* steps, size_t count,
                const zf_adam_hparams* hparams, float grad_scale, uint32_t flags) {
  check_hparams(hparams);
  require(std::isfinite(grad_scale), ZF_ERROR_INVALID_VALUE, "grad_scale: must be finite, got ", grad_scale);
  check_flags(flags, ZF_CPU_ADAM_ZERO_GRAD);
  check_lists(params, exp_avgs, exp_avg_sqs, grads, count);
  require(count == 0 || steps != nullptr, ZF_ERROR_INVALID_VALUE, "steps: NULL array with count=", count);
  for (size_t i = 0; i < count; ++i) {
    const AdamOperands operands(params, exp_avgs, exp_avg_sqs, grads, out_params, i);
    check_host_tensor(&params[i], operands.names[0], {ZF_DTYPE_F32});
    const int64_t n = numel(params[i]);
    operands.check([n](int, const zf_tensor& t, const std::string& name) { check_numel(t, name, n); });
    require(steps[i] >= 1, ZF_ERROR_INVALID_VALUE, "steps[", i, "]: must be >= 1, got ", steps[i]);
  }

  StepScalarTable table(to_hyper(*hparams));
  PieceList pieces;
  for (size_t i = 0; i < count; ++i) pieces.add(i, 0, 0, 0, numel(params[i]), table.index_of(steps[i]));
  run_adam_pieces(pieces, table, params, exp_avgs, exp_avg_sqs, grads, out_params, grad_scale,
                  (flags & ZF_CPU_ADAM_ZERO_GRAD) != 0);
}

// ---- zf_cpu_adamw_step_skip_columns ----

// A column's step count, from an i32 or i64 tensor.
int64_t read_count(const zf_tensor& counts, int64_t column) {
  return counts.dtype == ZF_DTYPE_I32 ? static_cast<const int32_t*>(counts.data)[column]
                                      : static_cast<const int64_t*>(counts.data)[column];
}

void write_count(const zf_tensor& counts, int64_t column, int64_t value) {
  if (counts.dtype == ZF_DTYPE_I32) {
    static_cast<int32_t*>(counts.data)[column] = static_cast<int32_t>(value);
  } else {
    static_cast<int64_t*>(counts.data)[column] = value;
  }
}

// Calls visit(begin, end) for every maximal run [begin, end) of unselected columns, in order.
template <class Visit>
void for_each_unselected_run(const std::vector<int64_t>& selected, int64_t n, const Visit& visit) {
  int64_t begin = 0;
  for (const int64_t s : selected) {
    if (s > begin) visit(begin, s);
    begin = s + 1;
  }
  if (begin < n) visit(begin, n);
}

void adamw_step_skip_columns(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs,
                             const zf_tensor* grads, const zf_tensor* out_params, const zf_tensor* selected,
                             const zf_tensor* column_steps, const int64_t* steps, size_t count,
                             const zf_adam_hparams* hparams, float grad_scale, uint32_t flags) {
  check_hparams(hparams);
  require(std::isfinite(grad_scale), ZF_ERROR_INVALID_VALUE, "grad_scale: must be finite, got ", grad_scale);
  check_flags(flags, ZF_CPU_ADAM_ZERO_GRAD | ZF_CPU_ADAM_INCREMENT_STEPS);
  const bool increment = (flags & ZF_CPU_ADAM_INCREMENT_STEPS) != 0;
  require(!increment || column_steps != nullptr, ZF_ERROR_INVALID_VALUE,
          "flags: ZF_CPU_ADAM_INCREMENT_STEPS needs column_steps");
  check_lists(params, exp_avgs, exp_avg_sqs, grads, count);
  require(count == 0 || column_steps != nullptr || steps != nullptr, ZF_ERROR_INVALID_VALUE,
          "steps: NULL array (and no column_steps) with count=", count);

  std::vector<std::vector<int64_t>> selected_columns(count);
  std::vector<char> grad_packed(count), out_packed(count);
  for (size_t i = 0; i < count; ++i) {
    const std::string param_name = arg_name("params", i);
    check_host_tensor(&params[i], param_name, {ZF_DTYPE_F32});
    check_ndim(params[i], param_name, 2);
    const int64_t n = params[i].shape[0], m = params[i].shape[1];
    if (selected) selected_columns[i] = read_selected(&selected[i], arg_name("selected", i), n);
    const int64_t unselected = n - static_cast<int64_t>(selected_columns[i].size());

    const AdamOperands operands(params, exp_avgs, exp_avg_sqs, grads, out_params, i);
    operands.check([&](int t, const zf_tensor& tensor, const std::string& name) {
      check_ndim(tensor, name, 2);
      const int64_t rows = tensor.shape[0], cols = tensor.shape[1];
      if (t <= 2) {
        require(rows == n && cols == m, ZF_ERROR_INVALID_VALUE, name, ": has shape [", rows, ", ", cols, "] but ",
                param_name, " has [", n, ", ", m, "]");
      } else {
        require((rows == n || rows == unselected) && cols == m, ZF_ERROR_INVALID_VALUE, name, ": has shape [", rows,
                ", ", cols, "]; expected [", n, ", ", m, "] (all columns) or [", unselected, ", ", m,
                "] (the unselected columns, packed)");
        (t == 3 ? grad_packed : out_packed)[i] = rows != n;
      }
    });
    if (column_steps) {
      const std::string counts_name = arg_name("column_steps", i);
      check_host_tensor(&column_steps[i], counts_name, {ZF_DTYPE_I32, ZF_DTYPE_I64});
      check_ndim(column_steps[i], counts_name, 1);
      require(column_steps[i].shape[0] == n, ZF_ERROR_INVALID_VALUE, counts_name, ": has ", column_steps[i].shape[0],
              " counts for ", n, " columns");
      const int64_t max_count = column_steps[i].dtype == ZF_DTYPE_I32 ? std::numeric_limits<int32_t>::max()
                                                                      : std::numeric_limits<int64_t>::max();
      for (int t = 0; t < 5; ++t) {
        if (operands.tensors[t]) check_disjoint(column_steps[i], counts_name, *operands.tensors[t], operands.names[t]);
      }
      for_each_unselected_run(selected_columns[i], n, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          const int64_t value = read_count(column_steps[i], j);
          if (increment) {
            require(value >= 0 && value < max_count, ZF_ERROR_INVALID_VALUE, counts_name, "[", j, "]: step count ",
                    value, " cannot be incremented");
          } else {
            require(value >= 1, ZF_ERROR_INVALID_VALUE, counts_name, "[", j, "]: step count must be >= 1, got ", value);
          }
        }
      });
    } else {
      require(steps[i] >= 1, ZF_ERROR_INVALID_VALUE, "steps[", i, "]: must be >= 1, got ", steps[i]);
    }
  }

  // Everything is valid: from here on nothing fails.
  StepScalarTable table(to_hyper(*hparams));
  PieceList pieces;
  for (size_t i = 0; i < count; ++i) {
    const int64_t n = params[i].shape[0], m = params[i].shape[1];
    int64_t packed_column = 0;
    for_each_unselected_run(selected_columns[i], n, [&](int64_t begin, int64_t end) {
      // Within a run, consecutive columns with the same count form one piece.
      int64_t j = begin;
      while (j < end) {
        int64_t step = steps ? steps[i] : 0;
        int64_t stop = end;
        if (column_steps) {
          step = read_count(column_steps[i], j) + (increment ? 1 : 0);
          stop = j + 1;
          while (stop < end && read_count(column_steps[i], stop) + (increment ? 1 : 0) == step) ++stop;
        }
        const int64_t grad_column = grad_packed[i] ? packed_column : j;
        const int64_t out_column = out_packed[i] ? packed_column : j;
        pieces.add(i, j * m, grad_column * m, out_column * m, (stop - j) * m, table.index_of(step));
        packed_column += stop - j;
        j = stop;
      }
    });
    if (increment) {
      for_each_unselected_run(selected_columns[i], n, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) write_count(column_steps[i], j, read_count(column_steps[i], j) + 1);
      });
    }
  }
  run_adam_pieces(pieces, table, params, exp_avgs, exp_avg_sqs, grads, out_params, grad_scale,
                  (flags & ZF_CPU_ADAM_ZERO_GRAD) != 0);
}

// ---- zf_cpu_accumulate ----

void accumulate(const zf_tensor* accumulators, const zf_tensor* blocks, const zf_tensor* selected, size_t count,
                float scale) {
  require(std::isfinite(scale), ZF_ERROR_INVALID_VALUE, "scale: must be finite, got ", scale);
  require(count == 0 || (accumulators != nullptr && blocks != nullptr), ZF_ERROR_INVALID_VALUE,
          "accumulators/blocks: NULL array with count=", count);
  std::vector<std::vector<int64_t>> selected_columns(count);
  for (size_t i = 0; i < count; ++i) {
    const std::string acc_name = arg_name("accumulators", i), block_name = arg_name("blocks", i);
    check_host_tensor(&accumulators[i], acc_name, {ZF_DTYPE_F32});
    check_host_tensor(&blocks[i], block_name, {ZF_DTYPE_F32, ZF_DTYPE_BF16, ZF_DTYPE_F16});
    if (selected) {
      check_ndim(accumulators[i], acc_name, 2);
      check_ndim(blocks[i], block_name, 2);
      const int64_t n = accumulators[i].shape[0], m = accumulators[i].shape[1];
      selected_columns[i] = read_selected(&selected[i], arg_name("selected", i), n);
      const int64_t unselected = n - static_cast<int64_t>(selected_columns[i].size());
      require(blocks[i].shape[0] == unselected && blocks[i].shape[1] == m, ZF_ERROR_INVALID_VALUE, block_name,
              ": has shape [", blocks[i].shape[0], ", ", blocks[i].shape[1],
              "]; expected the packed unselected columns [", unselected, ", ", m, "]");
    } else {
      check_numel(blocks[i], block_name, numel(accumulators[i]));
    }
    check_disjoint(accumulators[i], acc_name, blocks[i], block_name);
  }

  PieceList pieces;
  for (size_t i = 0; i < count; ++i) {
    if (!selected) {
      pieces.add(i, 0, 0, 0, numel(accumulators[i]), 0);
      continue;
    }
    const int64_t n = accumulators[i].shape[0], m = accumulators[i].shape[1];
    int64_t packed_column = 0;
    for_each_unselected_run(selected_columns[i], n, [&](int64_t begin, int64_t end) {
      pieces.add(i, begin * m, packed_column * m, 0, (end - begin) * m, 0);
      packed_column += end - begin;
    });
  }
  const simd::KernelTable& kernels = simd::active_kernels();
  pieces.run([&](const Piece& piece, int64_t offset, int64_t count) {
    const size_t i = piece.tensor;
    kernels.accumulate(static_cast<float*>(accumulators[i].data) + piece.state_offset + offset,
                       byte_pointer(blocks[i], piece.grad_offset + offset), blocks[i].dtype, count, scale);
  });
}

}  // namespace
}  // namespace zf

extern "C" {

ZF_API zf_status zf_cpu_adamw_step(const zf_tensor* params, const zf_tensor* exp_avgs, const zf_tensor* exp_avg_sqs,
                                   const zf_tensor* grads, const zf_tensor* out_params, const int64_t* steps,
                                   size_t count, const zf_adam_hparams* hparams, float grad_scale, uint32_t flags) {
  return zf::api_call([&] {
    zf::adamw_step(params, exp_avgs, exp_avg_sqs, grads, out_params, steps, count, hparams, grad_scale, flags);
  });
}

ZF_API zf_status zf_cpu_adamw_step_skip_columns(const zf_tensor* params, const zf_tensor* exp_avgs,
                                                const zf_tensor* exp_avg_sqs, const zf_tensor* grads,
                                                const zf_tensor* out_params, const zf_tensor* selected,
                                                const zf_tensor* column_steps, const int64_t* steps, size_t count,
                                                const zf_adam_hparams* hparams, float grad_scale, uint32_t flags) {
  return zf::api_call([&] {
    zf::adamw_step_skip_columns(params, exp_avgs, exp_avg_sqs, grads, out_params, selected, column_steps, steps, count,
                                hparams, grad_scale, flags);
  });
}

ZF_API zf_status zf_cpu_accumulate(const zf_tensor* accumulators, const zf_tensor* blocks, const zf_tensor* selected,
                                   size_t count, float scale) {
  return zf::api_call([&] { zf::accumulate(accumulators, blocks, selected, count, scale); });
}

}  // extern "C"
