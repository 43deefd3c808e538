// libFuzzer target of the C ABI's validation (issue 14): zf_column_stats and
// zf_adamw_selected_columns with fuzzed tensor descriptors, and zf_engine_create, then
// zf_engine_load_state and steps (plain, with per-step hyper-parameters, or split through
// zf_engine_mark_ready / zf_engine_take_released / zf_engine_end_step_with), with fuzzed parameters, groups,
// configuration and checkpoint buffers. Built with -fsanitize=fuzzer,address,undefined (fuzz/CMakeLists.txt;
// tools/run_fuzz.sh runs it for a bounded time from fuzz/corpus/).
//
// The model of the caller: honest about memory, dishonest about everything else. Every
// descriptor's data points at a heap block of exactly the bytes its shape and strides
// address (so AddressSanitizer sees any access the library makes beyond them), unless the
// input asks for NULL data or a misaligned pointer; dtypes, devices, ndim, shapes, strides,
// counts, index and step values, hyper-parameters and configuration fields are the input's.
// Shapes stay small (dimensions up to 6, or values whose byte size overflows PTRDIFF_MAX,
// which must be rejected), so each input runs in microseconds.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "zenflow/zenflow.h"

namespace {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | byte();
    return v;
  }
  double real() {
    static const double kValues[] = {0.0, 1e-3, 0.1, 0.5, 0.9, 0.999, 1.0, 2.0, -1.0, 1e300, -0.0, 1e-8};
    const uint8_t b = byte();
    if (b == 0xFF) return __builtin_nan("");
    if (b == 0xFE) return __builtin_inf();
    return kValues[b % (sizeof(kValues) / sizeof(kValues[0]))];
  }
  // Fills a buffer with input bytes (values: NaNs, indices, step counts, anything).
  void fill(void* out, size_t bytes) {
    auto* p = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < bytes; ++i) p[i] = byte();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

size_t element_size(zf_dtype dtype) {
  const size_t size = zf_dtype_size(dtype);
  return size == 0 ? 8 : size;  // not a dtype: the library must reject it; size the block anyway
}

// Owns the heap blocks the descriptors of one input point at.
struct Arena {
  std::vector<std::unique_ptr<uint8_t[]>> blocks;
  void* allocate(size_t bytes) {
    blocks.emplace_back(new uint8_t[bytes == 0 ? 1 : bytes]);
    return blocks.back().get();
  }
};

// Points t.data at a block of exactly the bytes t addresses (or NULL / misaligned on request).
void place(zf_tensor& t, Input& in, Arena& arena) {
  const uint8_t how = in.byte();
  if (how % 32 == 0) {
    t.data = nullptr;
    return;
  }
  int64_t lowest = 0, highest = 0;
  bool addressable = t.ndim >= 0 && t.ndim <= ZF_MAX_DIMS;
  for (int32_t d = 0; addressable && d < t.ndim; ++d) {
    if (t.shape[d] <= 0) {  // empty or negative: nothing to address
      addressable = false;
      break;
    }
    if (t.shape[d] > 64) {  // an overflowing size the library must reject: a token block
      addressable = false;
      break;
    }
    const int64_t reach = (t.shape[d] - 1) * t.strides[d];
    (reach < 0 ? lowest : highest) += reach;
  }
  const size_t element = element_size(t.dtype);
  const size_t elements = addressable ? static_cast<size_t>(highest - lowest + 1) : 1;
  const bool misaligned = how % 32 == 1;
  auto* block = static_cast<uint8_t*>(arena.allocate(elements * element + (misaligned ? 1 : 0)));
  in.fill(block, elements * element + (misaligned ? 1 : 0));
  t.data = block + (misaligned ? 1 : 0) - lowest * static_cast<int64_t>(element);
}

zf_tensor descriptor(Input& in, Arena& arena, zf_dtype usual_dtype, int32_t usual_ndim) {
  zf_tensor t;
  std::memset(&t, 0, sizeof(t));
  const uint8_t kind = in.byte();
  t.dtype = kind % 4 == 0 ? static_cast<zf_dtype>(in.byte() % 7) : usual_dtype;  // 5, 6: not dtypes
  t.device.type = kind % 61 == 0 ? ZF_DEVICE_CUDA : (kind % 67 == 0 ? static_cast<zf_device_type>(7) : ZF_DEVICE_CPU);
  t.device.index = kind % 71 == 0 ? -1 : 0;
  const uint8_t shape_kind = in.byte();
  if (shape_kind % 16 == 0) {
    static const int32_t kOdd[] = {-1, 9, 100, 0, 3, 4};
    t.ndim = kOdd[in.byte() % 6];
  } else {
    t.ndim = usual_ndim;
  }
  const int32_t dims = t.ndim < 0 ? 0 : (t.ndim > ZF_MAX_DIMS ? ZF_MAX_DIMS : t.ndim);
  for (int32_t d = 0; d < dims; ++d) {
    const uint8_t b = in.byte();
    static const int64_t kHuge[] = {-1, int64_t{1} << 62, INT64_MAX, INT64_MIN};
    t.shape[d] = b % 29 == 28 ? kHuge[(b / 29) % 4] : b % 7;
  }
  int64_t contiguous = 1;
  for (int32_t d = dims - 1; d >= 0; --d) {
    t.strides[d] = contiguous;
    if (t.shape[d] > 0 && t.shape[d] <= 64) contiguous *= t.shape[d];
  }
  if (shape_kind % 4 == 1) {  // strides of the input's own
    static const int64_t kStrides[] = {-2, -1, 0, 1, 2, 3, 7, 40};
    for (int32_t d = 0; d < dims; ++d) t.strides[d] = kStrides[in.byte() % 8];
  }
  place(t, in, arena);
  return t;
}

zf_column_state column_state(Input& in, Arena& arena, int32_t ndim) {
  zf_column_state s;
  s.master = descriptor(in, arena, ZF_DTYPE_F32, in.byte() % 2 == 0 ? 1 : ndim);
  s.exp_avg = descriptor(in, arena, ZF_DTYPE_F32, ndim);
  s.exp_avg_sq = descriptor(in, arena, ZF_DTYPE_F32, ndim);
  s.steps = descriptor(in, arena, ZF_DTYPE_I32, 1);
  return s;
}

void fuzz_column_stats(Input& in, Arena& arena) {
  const size_t count = in.byte() % 4;
  std::vector<zf_tensor> grads, out;
  for (size_t i = 0; i < count; ++i) {
    grads.push_back(descriptor(in, arena, ZF_DTYPE_BF16, 2));
    out.push_back(descriptor(in, arena, ZF_DTYPE_F32, 1));
  }
  zf_tensor total = descriptor(in, arena, ZF_DTYPE_F32, 1);
  zf_tensor flag = descriptor(in, arena, ZF_DTYPE_I32, 1);
  const uint32_t flags = in.byte() % 3;
  size_t workspace = 0;
  zf_column_stats(count ? grads.data() : nullptr, count ? out.data() : nullptr, count, &total, &flag, flags, nullptr,
                  in.byte() % 2 ? &workspace : nullptr, nullptr);
  zf_select_topk_columns(count ? out.data() : nullptr, count ? grads.data() : nullptr, count, nullptr, nullptr,
                         nullptr);
}

void fuzz_adamw_selected(Input& in, Arena& arena) {
  const size_t count = in.byte() % 3;
  std::vector<zf_tensor> params, grads, selected;
  std::vector<zf_column_state> state;
  std::vector<double> lr, wd;
  for (size_t i = 0; i < count; ++i) {
    params.push_back(descriptor(in, arena, ZF_DTYPE_F32, 2));
    grads.push_back(descriptor(in, arena, ZF_DTYPE_BF16, 2));
    selected.push_back(descriptor(in, arena, ZF_DTYPE_I32, 1));
    state.push_back(column_state(in, arena, 2));
    lr.push_back(in.real());
    wd.push_back(in.real());
  }
  zf_adam_hparams hparams = ZF_ADAM_HPARAMS_DEFAULT;
  if (in.byte() % 4 == 0) {
    hparams.beta1 = in.real();
    hparams.beta2 = in.real();
    hparams.eps = in.real();
    hparams.mode = static_cast<zf_adam_mode>(in.byte() % 3);
  }
  zf_tensor scale = descriptor(in, arena, ZF_DTYPE_F32, 1);
  const bool with_selected = in.byte() % 4 != 0;
  zf_adamw_selected_columns(count ? params.data() : nullptr, count ? grads.data() : nullptr,
                            with_selected && count ? selected.data() : nullptr, count ? state.data() : nullptr, count,
                            count ? lr.data() : nullptr, count ? wd.data() : nullptr, nullptr, &hparams,
                            in.byte() % 2 ? &scale : nullptr, nullptr, nullptr);
}

void fuzz_engine(Input& in, Arena& arena) {
  const size_t param_count = in.byte() % 4;
  std::vector<zf_tensor> params;
  std::vector<int32_t> param_groups;
  for (size_t i = 0; i < param_count; ++i) {
    params.push_back(descriptor(in, arena, ZF_DTYPE_F32, 1 + in.byte() % 2));
    param_groups.push_back(static_cast<int32_t>(in.byte() % 3) - (in.byte() % 16 == 0 ? 5 : 0));
  }
  const size_t group_count = 1 + in.byte() % 2;
  std::vector<zf_engine_group> groups(group_count);
  for (auto& g : groups) {
    g.lr = in.real();
    g.weight_decay = in.real();
    g.dense = in.byte() % 2;
  }
  zf_engine_config config = zf_engine_config_default();
  config.compute_threads = 1;
  config.host_threads = 1;
  config.bucket_bytes = 1 + in.u32() % 4096;
  config.staging_slots = static_cast<int32_t>(in.byte() % 5) - 1;
  config.topk_ratio = in.real();
  config.update_interval = static_cast<int64_t>(in.byte() % 5) - 1;
  config.overlap_step = in.byte() % 2;
  // From a byte already read, so that the corpus's inputs keep their meaning.
  config.release_gradients = config.bucket_bytes % 3 == 0 ? 1 : 0;
  config.window_scaling = static_cast<zf_window_scaling>((config.bucket_bytes / 3) % 3);
  if (in.byte() % 4 == 0) {
    config.select_strategy = static_cast<zf_select_strategy>(in.byte() % 4);
    config.select_interval = static_cast<int64_t>(in.byte() % 4) - 1;
    config.steps_per_epoch = static_cast<int64_t>(in.byte() % 4) - 1;
    config.loss_scaling = static_cast<zf_loss_scaling>(in.byte() % 3);
    config.selection_score = static_cast<zf_selection_score>(in.byte() % 3);
    config.master_weights = static_cast<zf_master_weights>(in.byte() % 3);
    config.max_grad_norm = in.real();
    config.beta1 = in.real();
    config.initial_scale = in.real();
    config.max_update_interval = static_cast<int64_t>(in.byte() % 4) - 1;
    config.update_lag = static_cast<int64_t>(in.byte() % 4) - 1;
  }
  zf_engine* engine = nullptr;
  if (zf_engine_create(param_count ? params.data() : nullptr, param_count ? param_groups.data() : nullptr, param_count,
                       groups.data(), group_count, &config, &engine) != ZF_SUCCESS) {
    return;
  }
  // A checkpoint: the engine's own layout with the input's changes and the input's contents.
  size_t entries = 0;
  zf_engine_state_layout(engine, nullptr, &entries);
  std::vector<zf_engine_state_entry> layout(entries);
  if (entries > 0) zf_engine_state_layout(engine, layout.data(), &entries);
  std::vector<zf_tensor> buffers;
  for (const zf_engine_state_entry& e : layout) {
    zf_tensor t;
    std::memset(&t, 0, sizeof(t));
    t.dtype = in.byte() % 16 == 0 ? static_cast<zf_dtype>(in.byte() % 6) : e.dtype;
    t.device.type = ZF_DEVICE_CPU;
    t.ndim = e.ndim;
    int64_t contiguous = 1;
    for (int32_t d = e.ndim - 1; d >= 0; --d) {
      t.shape[d] = e.shape[d] + (in.byte() % 16 == 0 ? 1 : 0);
      t.strides[d] = contiguous;
      contiguous *= t.shape[d];
    }
    place(t, in, arena);
    buffers.push_back(t);
  }
  // Small counters, and now and then one at or next to INT64_MAX (no room for another step).
  int64_t counters[ZF_ENGINE_STATE_COUNTERS];
  for (int64_t& c : counters) {
    const uint8_t b = in.byte();
    c = b % 32 == 31 ? INT64_MAX - (b / 32) % 2 : static_cast<int64_t>(b % 8) - 1;
  }
  const size_t load_count = in.byte() % 8 == 0 ? buffers.size() + 1 : buffers.size();
  std::vector<zf_tensor> padded = buffers;
  padded.resize(load_count, zf_tensor{});
  zf_engine_load_state(engine, padded.empty() ? nullptr : padded.data(), load_count, counters, in.real());
  // Then a step with gradients like the parameters (or not).
  std::vector<zf_tensor> grads;
  for (const zf_tensor& p : params) {
    zf_tensor g = p;
    if (in.byte() % 8 == 0) g.dtype = static_cast<zf_dtype>(in.byte() % 6);
    place(g, in, arena);
    grads.push_back(g);
  }
  // How the steps are driven (an input that ends here takes plain steps): plain; with
  // per-step hyper-parameters first; or split, the input marking parameters ready in its
  // own order (out of range, twice, some never) before end_step_with.
  const uint8_t mode = in.byte() % 3;
  for (int step = 0; step < 2; ++step) {
    if (mode == 1) {
      std::vector<double> decays(group_count);
      for (double& d : decays) d = in.real();
      const bool with_decays = in.byte() % 2 == 0;
      zf_engine_set_hyperparameters(engine, in.real(), in.real(), in.real(), with_decays ? decays.data() : nullptr,
                                    with_decays ? decays.size() + in.byte() % 2 : 0);
    }
    if (mode == 2) {
      zf_engine_begin_step(engine, nullptr, 0);
      const size_t marks = in.byte() % 8;
      std::vector<size_t> released;
      for (size_t k = 0; k < marks && !grads.empty(); ++k) {
        const size_t index = in.byte() % (grads.size() + 1);  // one past the end now and then
        zf_engine_mark_ready(engine, index, &grads[index % grads.size()]);
        size_t taken[4], count = 0;  // release_gradients: a capacity of 0 to 4
        if (zf_engine_take_released(engine, taken, index % 5, &count) == ZF_SUCCESS)
          released.insert(released.end(), taken, taken + count);
      }
      const size_t end_count = in.byte() % 8 == 0 ? grads.size() + 1 : grads.size();
      std::vector<zf_tensor> final_grads = grads;
      final_grads.resize(end_count, zf_tensor{});
      for (size_t index : released)  // not read again: handed over as NULL
        if (index < final_grads.size()) final_grads[index].data = nullptr;
      if (zf_engine_end_step_with(engine, final_grads.empty() ? nullptr : final_grads.data(), end_count) != ZF_SUCCESS)
        zf_engine_abort_step(engine);
      continue;
    }
    zf_engine_step(engine, grads.empty() ? nullptr : grads.data(), grads.size(), nullptr, 0);
  }
  zf_engine_flush(engine);
  zf_engine_destroy(engine);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Arena arena;
  switch (in.byte() % 3) {
    case 0:
      fuzz_column_stats(in, arena);
      break;
    case 1:
      fuzz_adamw_selected(in, arena);
      break;
    default:
      fuzz_engine(in, arena);
      break;
  }
  return 0;
}
