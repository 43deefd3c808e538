// The configuration table (config_table.hpp, engine.h: zf_engine_config_key). Each row is the
// one place a field's rules live: its default, its range, what 0 stands for, its meaning, the
// DeepSpeed key it comes from and why zenflow differs from DeepSpeed where it does. The
// checks below read the rows; only the rules that tie two fields together are code.
#include "engine/config_table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "common/tensor.hpp"
#include "common/thread_pool.hpp"

namespace zf {
namespace {

constexpr double kInf = HUGE_VAL;
// Integers up to 2^62: far past any real count, and exact in a double.
constexpr double kIntMax = 4611686018427387904.0;

struct Row {
  zf_engine_config_key key;
  double default_value;  // FLOAT, INT, BOOL: the value; CHOICE: the enum value
};

#define ZF_FIELD(f) offsetof(zf_engine_config, f), sizeof(static_cast<zf_engine_config*>(nullptr)->f)
#define ZF_ZENFLOW(k) "zero_optimization.zenflow." k

const Row kRows[] = {
    {{"topk_ratio", ZF_CONFIG_FLOAT, ZF_FIELD(topk_ratio), 0.0, 1.0, 0, 0, "", "", "0.1", "[0, 1]",
      "share of each matrix's columns updated on the device every step (k = floor(ratio * n), at least 1 unless "
      "0)",
      ZF_ZENFLOW("topk_ratio"), "", ""},
     0.1},
    {{"select_strategy", ZF_CONFIG_CHOICE, ZF_FIELD(select_strategy), 0, 0, 0, 0, "", "auto,step,epoch", "auto",
      "auto, step or epoch",
      "when the columns are reselected: auto = once per epoch (once at the first window without steps_per_epoch), "
      "step = every select_interval steps, epoch = every select_interval epochs",
      ZF_ZENFLOW("select_strategy"), "",
      "\"epoch\" without an epoch length: DeepSpeed never reselects, zenflow refuses it (it has no dataloader to "
      "measure the epoch: give steps_per_epoch)"},
     ZF_SELECT_AUTO},
    {{"select_interval", ZF_CONFIG_INT, ZF_FIELD(select_interval), 1, kIntMax, 0, 0, "auto", "", "auto",
      "auto, or >= 1 (steps or epochs); auto with select_strategy auto only, and a step interval no shorter than "
      "update_interval",
      "the reselection period of select_strategy step (steps) or epoch (epochs)", ZF_ZENFLOW("select_interval"), "",
      ""},
     0},
    {{"steps_per_epoch", ZF_CONFIG_INT, ZF_FIELD(steps_per_epoch), 1, kIntMax, 0, 0, "none", "", "none",
      "none, or >= 1 (required by select_strategy epoch)",
      "optimizer steps per epoch, for select_strategy auto and epoch", ZF_ZENFLOW("steps_per_epoch"), "null",
      "DeepSpeed measures it from its dataloader; zenflow is told (a keyword of from_config)"},
     0},
    {{"update_interval", ZF_CONFIG_INT, ZF_FIELD(update_interval), 1, kIntMax, 0, 0, "auto", "", "4", "auto, or >= 1",
      "steps per window: the deferred columns get the host AdamW once per window (auto: adaptive, see auto_ratio)",
      ZF_ZENFLOW("update_interval"), "\"auto\"",
      "default 4 in ZenFlowAdamW and the C API (a fixed window is reproducible across models); from_config keeps "
      "DeepSpeed's \"auto\""},
     4},
    {{"full_warm_up_rounds", ZF_CONFIG_INT, ZF_FIELD(full_warm_up_rounds), 0, kIntMax, 0, 0, "", "", "0", ">= 0",
      "first steps that run as synchronous offload: every column updated on the host after each step, waited for "
      "(no selection, no overlap)",
      ZF_ZENFLOW("full_warm_up_rounds"), "", ""},
     0},
    {{"overlap_step", ZF_CONFIG_BOOL, ZF_FIELD(overlap_step), 0, 1, 0, 0, "", "", "true", "true or false",
      "a window's host update runs beside the next window and lands at its close (one window late)",
      ZF_ZENFLOW("overlap_step"), "false",
      "default true in ZenFlowAdamW and the C API (the stall-free mode is the point of the engine); from_config "
      "keeps DeepSpeed's false"},
     1},
    {{"auto_ratio", ZF_CONFIG_FLOAT, ZF_FIELD(auto_ratio), 0.0, 1.0, 1, 0, "", "", "0.99", "(0, 1]",
      "update_interval auto: the share of due matrices that closes a window", ZF_ZENFLOW("auto_ratio"), "",
      "DeepSpeed also takes 0 (every step closes a window); zenflow refuses it: update_interval 1 says that"},
     0.99},
    {{"pt_reserved_cores_perc", ZF_CONFIG_FLOAT, ZF_FIELD(pt_reserved_cores_perc), 0.0, 1.0, 0, 0, "", "", "0.5",
      "[0, 1]",
      "share of this rank's cores reserved for the framework (ceil(cores * share)); the host lane takes the rest",
      ZF_ZENFLOW("pt_reserved_cores_perc"), "",
      "a reserve of 0 or of every core: DeepSpeed gives both sides every core, zenflow keeps at least one core "
      "apart from the other side where it can (spinning OpenMP workers beside the host update stall both)"},
     0.5},
    {{"max_update_interval", ZF_CONFIG_INT, ZF_FIELD(max_update_interval), 1, kIntMax, 0, 0, "", "", "16", ">= 1",
      "update_interval auto: the longest window", "", "",
      "DeepSpeed's auto windows have no bound; zenflow's do, so that a run that never meets auto_ratio still "
      "updates"},
     16},
    {{"master_weights", ZF_CONFIG_CHOICE, ZF_FIELD(master_weights), 0, 0, 0, 0, "", "fp32,none", "fp32", "fp32 or none",
      "bf16/fp16 parameters: fp32 keeps an fp32 master of the selected columns on the device, none updates the "
      "parameter itself",
      "", "", ""},
     ZF_MASTER_FP32},
    {{"selection_score", ZF_CONFIG_CHOICE, ZF_FIELD(selection_score), 0, 0, 0, 0, "", "step,window", "step",
      "step or window",
      "the column score of a selection: the selection step's gradient (step) or the previous window's (window)", "", "",
      ""},
     ZF_SCORE_STEP},
    {{"max_grad_norm", ZF_CONFIG_FLOAT, ZF_FIELD(max_grad_norm), 0.0, kInf, 1, 1, "none", "", "none", "none, or > 0",
      "clips the gradients by their global norm over every parameter", "gradient_clipping", "", ""},
     0.0},
    {{"beta1", ZF_CONFIG_FLOAT, ZF_FIELD(beta1), 0.0, 1.0, 0, 1, "", "", "0.9", "[0, 1)", "Adam's beta1",
      "optimizer.params.betas[0]", "", ""},
     0.9},
    {{"beta2", ZF_CONFIG_FLOAT, ZF_FIELD(beta2), 0.0, 1.0, 0, 1, "", "", "0.999", "[0, 1)", "Adam's beta2",
      "optimizer.params.betas[1]", "", ""},
     0.999},
    {{"eps", ZF_CONFIG_FLOAT, ZF_FIELD(eps), 0.0, kInf, 0, 1, "", "", "1e-08", ">= 0", "Adam's epsilon",
      "optimizer.params.eps", "", ""},
     1e-8},
    {{"loss_scaling", ZF_CONFIG_CHOICE, ZF_FIELD(loss_scaling), 0, 0, 0, 0, "", "none,dynamic", "none",
      "none or dynamic",
      "dynamic: the engine scales the loss (loss_scale()), skips overflow steps and adapts the scale", "fp16.enabled",
      "", "a static fp16.loss_scale is refused (only dynamic scaling)"},
     ZF_LOSS_SCALING_NONE},
    {{"initial_scale", ZF_CONFIG_FLOAT, ZF_FIELD(initial_scale), 0.0, kInf, 1, 1, "", "", "65536", "> 0",
      "dynamic loss scaling: the first loss scale", "fp16.initial_scale_power", "16",
      "DeepSpeed gives the power of two (2 ** initial_scale_power); from_config converts"},
     65536.0},
    {{"growth_factor", ZF_CONFIG_FLOAT, ZF_FIELD(growth_factor), 1.0, kInf, 1, 1, "", "", "2", "> 1",
      "dynamic loss scaling: the scale's factor after growth_interval good steps", "", "", ""},
     2.0},
    {{"backoff_factor", ZF_CONFIG_FLOAT, ZF_FIELD(backoff_factor), 0.0, 1.0, 1, 1, "", "", "0.5", "(0, 1)",
      "dynamic loss scaling: the scale's factor at an overflow that backs off", "", "", ""},
     0.5},
    {{"growth_interval", ZF_CONFIG_INT, ZF_FIELD(growth_interval), 1, kIntMax, 0, 0, "", "", "2000", ">= 1",
      "dynamic loss scaling: good steps in a row before the scale grows", "fp16.loss_scale_window", "1000",
      "the scale grows after loss_scale_window good steps (torch.amp.GradScaler's count); DeepSpeed grows it one "
      "step later after an overflow or the start (its window counts from the step after)"},
     2000},
    {{"bucket_bytes", ZF_CONFIG_INT, ZF_FIELD(bucket_bytes), 1, kIntMax, 0, 0, "", "", "64 MiB", ">= 1",
      "packed gradient bytes per staging bucket (the unit of the copies to the host)", "", "", ""},
     static_cast<double>(int64_t{64} << 20)},
    {{"staging_slots", ZF_CONFIG_INT, ZF_FIELD(staging_slots), 1, 2147483647.0, 0, 0, "", "", "4", ">= 1",
      "buckets in the staging ring (more: more gradients in flight to the host)", "", "", ""},
     4},
    {{"compute_threads", ZF_CONFIG_INT, ZF_FIELD(compute_threads), 1, 64, 0, 0, "auto", "", "auto",
      "auto, or [1, max(64, 4 x cores)]", "threads of the compute lane (auto: the framework's share of the cores)", "",
      "", ""},
     0},
    {{"host_threads", ZF_CONFIG_INT, ZF_FIELD(host_threads), 1, 64, 0, 0, "auto", "", "auto",
      "auto, or [1, max(64, 4 x cores)]", "threads of the host lane (auto: the cores the framework's share leaves)", "",
      "", ""},
     0},
    {{"ranks_per_host", ZF_CONFIG_INT, ZF_FIELD(ranks_per_host), 1, 65536, 0, 0, "1", "", "1",
      "[1, 65536] (0 counts as 1)", "processes of this job on this host: they share its cores", "", "", ""},
     1},
    {{"hysteresis", ZF_CONFIG_INT, ZF_FIELD(hysteresis), 1, 2147483647.0, 0, 0, "", "", "1", ">= 1",
      "dynamic loss scaling: the overflow that backs the scale off (1: every one; 2: the second, ...)",
      "fp16.hysteresis", "2", "default 1 in ZenFlowAdamW and the C API (torch.amp.GradScaler's rule)"},
     1},
    {{"consecutive_hysteresis", ZF_CONFIG_BOOL, ZF_FIELD(consecutive_hysteresis), 0, 1, 0, 0, "", "", "false",
      "true or false", "dynamic loss scaling: a good step refills the hysteresis (only overflows in a row count)",
      "fp16.consecutive_hysteresis", "", ""},
     0},
    {{"min_loss_scale", ZF_CONFIG_FLOAT, ZF_FIELD(min_loss_scale), 0.0, kInf, 1, 1, "none", "", "none", "none, or > 0",
      "dynamic loss scaling: the scale never backs off below it", "fp16.min_loss_scale", "1",
      "an overflow at the minimum: DeepSpeed raises, zenflow skips the step and keeps the minimum "
      "(stats skipped_steps counts it)"},
     0.0},
    {{"update_lag", ZF_CONFIG_INT, ZF_FIELD(update_lag), 1, kIntMax, 0, 0, "window", "", "1", "window, or >= 1 (steps)",
      "overlap_step: a window's host update lands after this many steps of the next window (window: at its "
      "close); shorter is fresher, and the step waits if the host has not finished the update by then",
      "", "",
      "DeepSpeed lands an overlapped update at the next window's close (update_lag \"window\"); zenflow one "
      "step into the next window, which measured closer to AdamW (benchmarks/results/2026-12-05-accuracy.md)"},
     1},
    {{"release_gradients", ZF_CONFIG_BOOL, ZF_FIELD(release_gradients), 0, 1, 0, 0, "", "", "false", "true or false",
      "overlap_backward: free each matrix's gradient during backward, once its bucket is consumed (statistics "
      "taken, deferred columns on their way to the host, selected columns copied); results unchanged",
      "", "", ""},
     0},
    {{"window_scaling", ZF_CONFIG_CHOICE, ZF_FIELD(window_scaling), 0, 0, 0, 0, "", "none,sqrt,linear", "sqrt",
      "none, sqrt or linear",
      "a window's host update of its deferred columns stands for the window's S steps: moments decayed by beta^S, "
      "step counts + S, AdamW's decay of S steps, lr * sqrt(S) (sqrt) or lr * S (linear); none: one plain Adam "
      "step per window",
      "", "",
      "DeepSpeed's ZenFlow takes one plain Adam step per window (none); zenflow's default sqrt measured closer to "
      "AdamW (benchmarks/results/2026-12-06-window-scaling.md)"},
     ZF_WINDOW_SCALING_SQRT},
    {{"auto_warm_up_rounds", ZF_CONFIG_INT, ZF_FIELD(auto_warm_up_rounds), 0, kIntMax, 0, 0, "", "", "200", ">= 0",
      "a synchronous start of this many steps when the first 8 steps' gradients look like training from scratch "
      "(their consistent share in Adam's moments at least 0.25), none when they look like fine-tuning; 0: no "
      "detection",
      "", "",
      "DeepSpeed's ZenFlow has no detection (as 0): its synchronous start is full_warm_up_rounds alone (default 0); "
      "zenflow's measured from scratch within 5% of AdamW with it, +3% to +17% without "
      "(benchmarks/results/2026-12-06-auto-warm-up.md)"},
     200},
};

#undef ZF_FIELD
#undef ZF_ZENFLOW

constexpr size_t kRowCount = sizeof(kRows) / sizeof(kRows[0]);

int64_t read_int(const zf_engine_config& c, const zf_engine_config_key& k) {
  const char* p = reinterpret_cast<const char*>(&c) + k.offset;
  if (k.size == sizeof(int32_t)) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  int64_t v;  // int64_t, or size_t read as its bits (a size past INT64_MAX reads negative: refused)
  std::memcpy(&v, p, sizeof v);
  return v;
}

double read_double(const zf_engine_config& c, const zf_engine_config_key& k) {
  double v;
  std::memcpy(&v, reinterpret_cast<const char*>(&c) + k.offset, sizeof v);
  return v;
}

void write(zf_engine_config& c, const zf_engine_config_key& k, double value) {
  char* p = reinterpret_cast<char*>(&c) + k.offset;
  if (k.type == ZF_CONFIG_FLOAT) {
    std::memcpy(p, &value, sizeof value);
  } else if (k.size == sizeof(int32_t)) {
    const auto v = static_cast<int32_t>(value);
    std::memcpy(p, &v, sizeof v);
  } else {
    const auto v = static_cast<int64_t>(value);
    std::memcpy(p, &v, sizeof v);
  }
}

int choice_count(const zf_engine_config_key& k) {
  return 1 + static_cast<int>(std::count(k.choices, k.choices + std::strlen(k.choices), ','));
}

bool in_range(double v, const zf_engine_config_key& k) {
  const bool low = k.minimum_open ? v > k.minimum : v >= k.minimum;
  const bool high = k.maximum_open ? v < k.maximum : v <= k.maximum;
  return low && high;
}

// A row as the C ABI shows it: the thread counts' bound is this machine's.
zf_engine_config_key public_key(size_t index) {
  zf_engine_config_key k = kRows[index].key;
  if (std::strcmp(k.name, "compute_threads") == 0 || std::strcmp(k.name, "host_threads") == 0)
    k.maximum = max_thread_count();  // per query: it depends on the machine
  return k;
}

void check_row(const zf_engine_config& c, const zf_engine_config_key& k) {
  switch (k.type) {
    case ZF_CONFIG_FLOAT: {
      const double v = read_double(c, k);
      if (*k.zero_means != '\0' && v == 0.0) return;
      require(std::isfinite(v) && in_range(v, k), ZF_ERROR_INVALID_VALUE, "config.", k.name, ": must be ", k.range_text,
              ", got ", v);
      return;
    }
    case ZF_CONFIG_INT: {
      const int64_t v = read_int(c, k);
      if (*k.zero_means != '\0' && v == 0) return;
      require(in_range(static_cast<double>(v), k), ZF_ERROR_INVALID_VALUE, "config.", k.name, ": must be ",
              k.range_text, ", got ", v);
      return;
    }
    case ZF_CONFIG_BOOL: {
      const int64_t v = read_int(c, k);
      require(v == 0 || v == 1, ZF_ERROR_INVALID_VALUE, "config.", k.name, ": must be 0 or 1, got ", v);
      return;
    }
    case ZF_CONFIG_CHOICE: {
      // Read as the int a C caller stored: loading an out-of-range value through the C++ enum
      // type would itself be undefined.
      const int64_t v = read_int(c, k);
      require(v >= 0 && v < choice_count(k), ZF_ERROR_INVALID_VALUE, "config.", k.name, ": unknown value ", v,
              " (0 to ", choice_count(k) - 1, ": ", k.choices, ")");
      return;
    }
  }
}

}  // namespace

zf_engine_config config_defaults() {
  zf_engine_config c;
  std::memset(&c, 0, sizeof c);  // padding too: configs compare bytewise in tests
  for (const Row& row : kRows) write(c, row.key, row.default_value);
  return c;
}

void check_config_table(const zf_engine_config& c) {
  for (size_t i = 0; i < kRowCount; ++i) check_row(c, public_key(i));
  // The rules that tie two fields together (DeepSpeed's zenflow rules among them).
  require(c.select_strategy != ZF_SELECT_AUTO || c.select_interval == 0, ZF_ERROR_INVALID_VALUE,
          "config.select_interval: select_strategy \"auto\" reselects once per epoch and takes no interval (auto), "
          "got ",
          c.select_interval);
  require(c.select_strategy != ZF_SELECT_EPOCH || c.steps_per_epoch > 0, ZF_ERROR_INVALID_VALUE,
          "config.steps_per_epoch: select_strategy \"epoch\" needs steps_per_epoch > 0");
}

void check_config_deepspeed(const zf_engine_config& c) {
  check_config_table(c);
  // DeepSpeed's zenflow rules (runtime/zenflow/engine.py: configure_zenflow) on top of the C
  // API's own, which gives both cases a meaning (0 acts as auto; a short period is rounded
  // up to whole windows); ZenFlowAdamW and from_config follow DeepSpeed.
  require(c.select_strategy == ZF_SELECT_AUTO || c.select_interval > 0, ZF_ERROR_INVALID_VALUE,
          "config.select_interval: select_strategy \"", c.select_strategy == ZF_SELECT_STEP ? "step" : "epoch",
          "\" needs an interval >= 1 (auto goes with select_strategy \"auto\")");
  if (c.update_interval > 0 && c.select_interval > 0) {
    const double period = c.select_strategy == ZF_SELECT_EPOCH
                              ? static_cast<double>(c.select_interval) * static_cast<double>(c.steps_per_epoch)
                              : static_cast<double>(c.select_interval);
    require(period >= static_cast<double>(c.update_interval), ZF_ERROR_INVALID_VALUE,
            "config.select_interval: ", c.select_interval, c.select_strategy == ZF_SELECT_EPOCH ? " epochs" : " steps",
            " is shorter than update_interval (", c.update_interval, " steps): a selection lasts at least one window");
  }
}

}  // namespace zf

extern "C" {

ZF_API size_t zf_engine_config_key_count(void) { return zf::kRowCount; }

ZF_API zf_status zf_engine_config_key_at(size_t index, zf_engine_config_key* out) {
  return zf::api_call([&] {
    zf::require(out != nullptr, ZF_ERROR_INVALID_VALUE, "out: NULL");
    zf::require(index < zf::kRowCount, ZF_ERROR_INVALID_VALUE, "index: ", index, " is not below the key count ",
                zf::kRowCount);
    *out = zf::public_key(index);
  });
}

ZF_API zf_status zf_engine_config_check_deepspeed(const zf_engine_config* config) {
  return zf::api_call([&] {
    zf::require(config != nullptr, ZF_ERROR_INVALID_VALUE, "config: NULL");
    zf::check_config_deepspeed(*config);
  });
}

}  // extern "C"
