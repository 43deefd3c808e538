// zenflow._C.Engine's state as Python: the checkpoint (state_dict / load_state_dict) as a
// dict of buffers and counters, its schema per parameter (param_state_layout) and the stats.
// The entries, their order, shapes and dtypes are the engine's (engine.h:
// zf_engine_state_layout, zf_engine_param_state_layout); this file only names them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bind_engine.hpp"
#include "tensor_convert.hpp"
#include "zenflow/engine.h"

namespace zf_py {

namespace {

// The schedule counters by name, in the order of engine.h's ZF_COUNTER_* positions.
constexpr const char* kScheduleKeys[] = {
    "step", "window", "window_steps", "since_selection", "selections", "has_previous_window"};

std::vector<zf_engine_state_entry> state_layout(zf_engine* engine) {
  size_t count = 0;
  check(zf_engine_state_layout(engine, nullptr, &count));
  std::vector<zf_engine_state_entry> entries(count);
  check(zf_engine_state_layout(engine, entries.data(), &count));
  entries.resize(count);
  return entries;
}

py::tuple shape_of(const zf_engine_state_entry& entry) {
  py::tuple shape(static_cast<size_t>(entry.ndim));
  for (int32_t d = 0; d < entry.ndim; ++d) shape[static_cast<size_t>(d)] = entry.shape[d];
  return shape;
}

const char* dtype_of(const zf_engine_state_entry& entry) { return entry.dtype == ZF_DTYPE_I32 ? "int32" : "float32"; }

// A buffer of the parameters' array family (torch or numpy) for one state entry.
py::object empty_buffer(const zf_engine_state_entry& entry, bool torch_params) {
  if (torch_params) {
    const py::module_ torch = py::module_::import("torch");
    return torch.attr("empty")(shape_of(entry), py::arg("dtype") = torch.attr(dtype_of(entry)));
  }
  return py::module_::import("numpy").attr("empty")(shape_of(entry), py::arg("dtype") = dtype_of(entry));
}

}  // namespace

py::dict save_state(zf_engine* engine, bool torch_params) {
  const std::vector<zf_engine_state_entry> entries = state_layout(engine);
  py::list buffers;
  for (const zf_engine_state_entry& entry : entries) buffers.append(empty_buffer(entry, torch_params));
  Converter conv;
  const std::vector<zf_tensor> tensors = conv.list(buffers, "state", Access::kWrite);
  std::vector<int64_t> counters(ZF_ENGINE_STATE_COUNTERS, 0);
  double scale = 0.0;
  call([&] { return zf_engine_save_state(engine, tensors.data(), tensors.size(), counters.data(), &scale); });

  py::list per_param;
  for (size_t i = 0; i < entries.size(); ++i) {
    const size_t param = static_cast<size_t>(entries[i].param);
    while (py::len(per_param) <= param) per_param.append(py::dict());
    py::dict entry = per_param[param];
    entry[zf_engine_state_kind_name(entries[i].kind)] = buffers[i];
  }
  py::dict schedule;
  for (size_t c = 0; c < sizeof(kScheduleKeys) / sizeof(kScheduleKeys[0]); ++c)
    schedule[kScheduleKeys[c]] = counters[c];
  schedule["skipped"] = counters[ZF_COUNTER_SKIPPED];
  schedule["steps_accumulated"] = counters[ZF_COUNTER_STEPS_ACCUMULATED];
  schedule["update_pending"] = counters[ZF_COUNTER_UPDATE_PENDING];
  schedule["warm_up_end"] = counters[ZF_COUNTER_WARM_UP_END];
  py::dict scaler;
  scaler["scale"] = scale;
  scaler["growth_tracker"] = counters[ZF_COUNTER_GROWTH_TRACKER];
  scaler["hysteresis"] = counters[ZF_COUNTER_HYSTERESIS];
  py::dict out;
  out["params"] = per_param;
  out["schedule"] = schedule;
  out["loss_scaler"] = scaler;
  return out;
}

void load_state(zf_engine* engine, const py::object& state, size_t param_count, bool torch_params) {
  if (!py::isinstance<py::dict>(state)) throw py::type_error("state: expected a dict from state_dict()");
  const py::dict d = py::reinterpret_borrow<py::dict>(state);
  for (const char* key : {"params", "schedule", "loss_scaler"}) {
    if (!d.contains(key)) throw py::value_error(std::string("state: missing \"") + key + "\"");
  }
  const std::vector<zf_engine_state_entry> entries = state_layout(engine);
  const py::object per_param = as_fast_sequence(d["params"], "state[\"params\"]");
  const size_t saved_params = static_cast<size_t>(PySequence_Fast_GET_SIZE(per_param.ptr()));
  if (saved_params != param_count) {
    throw py::value_error("state: holds " + std::to_string(saved_params) + " parameters, this engine has " +
                          std::to_string(param_count) + " (the state of another model)");
  }
  py::list buffers;
  for (const zf_engine_state_entry& entry : entries) {
    const std::string name = "state[\"params\"][" + std::to_string(entry.param) + "]";
    const py::handle saved = PySequence_Fast_GET_ITEM(per_param.ptr(), entry.param);
    if (!py::isinstance<py::dict>(saved)) throw py::type_error(name + ": expected a dict");
    const py::dict saved_dict = py::reinterpret_borrow<py::dict>(saved);
    const char* key = zf_engine_state_kind_name(entry.kind);
    if (!saved_dict.contains(key)) {
      if (entry.kind == ZF_STATE_ACCUMULATOR) {  // a state saved before it was one: a flushed one
        buffers.append(empty_buffer(entry, torch_params).attr("zero_")());
        continue;
      }
      throw py::value_error(name + ": missing \"" + key + "\" (the state of another model or configuration)");
    }
    buffers.append(saved_dict[key]);
  }
  Converter conv;
  const std::vector<zf_tensor> tensors = conv.list(buffers, "state", Access::kRead);
  std::vector<int64_t> counters(ZF_ENGINE_STATE_COUNTERS, 0);
  const py::dict schedule = d["schedule"].cast<py::dict>();
  for (size_t c = 0; c < sizeof(kScheduleKeys) / sizeof(kScheduleKeys[0]); ++c) {
    if (!schedule.contains(kScheduleKeys[c])) {
      throw py::value_error(std::string("state[\"schedule\"]: missing \"") + kScheduleKeys[c] + "\"");
    }
    counters[c] = integer(schedule[kScheduleKeys[c]], std::string("state[\"schedule\"][\"") + kScheduleKeys[c] + "\"]");
  }
  if (!schedule.contains("skipped")) throw py::value_error("state[\"schedule\"]: missing \"skipped\"");
  counters[ZF_COUNTER_SKIPPED] = integer(schedule["skipped"], "state[\"schedule\"][\"skipped\"]");
  // Absent from a state saved before they existed (a flushed state): 0.
  if (schedule.contains("steps_accumulated"))
    counters[ZF_COUNTER_STEPS_ACCUMULATED] =
        integer(schedule["steps_accumulated"], "state[\"schedule\"][\"steps_accumulated\"]");
  if (schedule.contains("update_pending"))
    counters[ZF_COUNTER_UPDATE_PENDING] =
        integer(schedule["update_pending"], "state[\"schedule\"][\"update_pending\"]");
  // Absent from a state saved before it existed: undecided (-1), which an engine with
  // auto_warm_up_rounds decides from the loaded moments unless windows have run.
  counters[ZF_COUNTER_WARM_UP_END] =
      schedule.contains("warm_up_end") ? integer(schedule["warm_up_end"], "state[\"schedule\"][\"warm_up_end\"]") : -1;
  const py::dict scaler = d["loss_scaler"].cast<py::dict>();
  if (!scaler.contains("scale") || !scaler.contains("growth_tracker")) {
    throw py::value_error("state[\"loss_scaler\"]: needs \"scale\" and \"growth_tracker\"");
  }
  counters[ZF_COUNTER_GROWTH_TRACKER] = integer(scaler["growth_tracker"], "state[\"loss_scaler\"][\"growth_tracker\"]");
  // Absent from a state saved before the counter existed: no overflow absorbed.
  if (scaler.contains("hysteresis"))
    counters[ZF_COUNTER_HYSTERESIS] = integer(scaler["hysteresis"], "state[\"loss_scaler\"][\"hysteresis\"]");
  const double scale = number(scaler["scale"], "state[\"loss_scaler\"][\"scale\"]");
  call([&] { return zf_engine_load_state(engine, tensors.data(), tensors.size(), counters.data(), scale); });
}

py::dict stats_dict(const zf_engine_stats& s) {
  py::dict out;
  out["steps"] = s.steps;
  out["windows"] = s.windows;
  out["reselections"] = s.reselections;
  out["skipped_steps"] = s.skipped_steps;
  out["last_global_norm"] = s.last_global_norm;
  out["stall_seconds_window_close"] = s.stall_seconds_window_close;
  out["stall_seconds_back_pressure"] = s.stall_seconds_back_pressure;
  out["stall_seconds_flush"] = s.stall_seconds_flush;
  out["host_update_seconds"] = s.host_update_seconds;
  out["accumulate_seconds"] = s.accumulate_seconds;
  out["bytes_down"] = s.bytes_down;
  out["bytes_up"] = s.bytes_up;
  out["selected_fraction"] = s.selected_fraction;
  out["device_state_bytes"] = s.device_state_bytes;
  out["host_state_bytes"] = s.host_state_bytes;
  out["stall_seconds_readback"] = s.stall_seconds_readback;
  out["device_bytes"] = s.device_bytes;
  out["pinned_host_bytes"] = s.pinned_host_bytes;
  out["collective_bytes_statistics"] = s.collective_bytes_statistics;
  out["collective_bytes_gradients"] = s.collective_bytes_gradients;
  out["collective_bytes_upload"] = s.collective_bytes_upload;
  out["host_lane_bytes_read"] = s.host_lane_bytes_read;
  out["host_lane_bytes_written"] = s.host_lane_bytes_written;
  out["held_gradient_bytes_peak"] = s.held_gradient_bytes_peak;
  out["synchronous_start_steps"] = s.synchronous_start_steps;
  out["host_lane_wait_seconds"] = s.host_lane_wait_seconds;
  return out;
}

void register_engine_state(py::module_& m) {
  m.def(
      "param_state_layout",
      [](const py::handle& param, bool dense_group) {
        Converter conv;
        const zf_tensor tensor = conv.tensor(param, ArgName{"param"}, Access::kRead);
        size_t count = 0;
        check(zf_engine_param_state_layout(&tensor, dense_group ? 1 : 0, nullptr, &count));
        std::vector<zf_engine_state_entry> entries(count);
        check(zf_engine_param_state_layout(&tensor, dense_group ? 1 : 0, entries.data(), &count));
        py::list out;
        for (const zf_engine_state_entry& e : entries)
          out.append(py::make_tuple(zf_engine_state_kind_name(e.kind), dtype_of(e), shape_of(e)));
        return out;
      },
      py::arg("param"), py::arg("dense_group"),
      "The engine's state entries of one parameter (engine.h: zf_engine_param_state_layout): a list of (name, "
      "dtype name, shape), 4 for a dense parameter, 8 for a matrix; the checkpoint schema, from the engine.");
}

}  // namespace zf_py
