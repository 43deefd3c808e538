// What the files of zenflow._C.Engine's binding share. bind_engine.cpp holds the Engine
// class and its registration; the other files each translate one kind of argument or result:
//   bind_config.cpp       config dicts (through the engine's configuration table) and groups
//   bind_devices.cpp      the devices by index, the device memory a caller attaches
//   bind_collectives.cpp  the Python callables behind the engine's data-parallel collectives
//   bind_state.cpp        checkpoints (state_dict / load_state_dict), their schema, stats
// Every rule is the engine's (engine.h); these files only convert.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor_convert.hpp"
#include "zenflow/engine.h"
#include "zenflow/zenflow.hpp"

namespace zf_py {

// ---- Python scalars, the argument named in errors (bind_config.cpp) ----
double number(py::handle value, const std::string& name);
int64_t integer(py::handle value, const std::string& name);
bool flag(py::handle value, const std::string& name);
std::string type_name(py::handle value);

// ---- construction arguments (bind_config.cpp) ----

// A config dict (engine field names; "betas" sets beta1 and beta2) over the defaults. Unknown
// keys and wrong types raise here, naming the key; then the engine checks every range.
zf_engine_config parse_config(const py::dict& config, bool deepspeed_rules = false);

// The groups argument of Engine() (a list or tuple of dicts) for zf_engine_create: each
// parameter's group and each group's settings; every parameter in exactly one group.
struct EngineGroups {
  std::vector<int32_t> param_groups;  // by parameter
  std::vector<zf_engine_group> groups;
};
EngineGroups parse_groups(const py::object& group_list, size_t param_count);

// config_keys, check_config and engine_thread_plan.
void register_engine_config(py::module_& m);

// ---- calls into the engine ----

template <typename Fn>
zf_status release_gil(Fn&& fn) {
  py::gil_scoped_release release;
  return fn();
}

// Runs the engine call `fn` with the GIL released and raises on failure.
template <typename Fn>
void call(Fn&& fn) {
  check(release_gil(std::forward<Fn>(fn)));
}

// A call of the C++ layer (zenflow.hpp): the zenflow::Error it threw, if any.
struct Outcome {
  zf_status status = ZF_SUCCESS;
  std::string message;
  // Raises it as Python's (ValueError, TypeError, ...); nothing when the call succeeded.
  void raise() const {
    if (status != ZF_SUCCESS) throw_error(status, message);
  }
};

// Runs `fn` (calls of zenflow::Engine) with the GIL released and catches its error, to be
// raised once the GIL is back.
template <typename Fn>
Outcome attempt(Fn&& fn) {
  Outcome outcome;
  py::gil_scoped_release release;
  try {
    fn();
  } catch (const zenflow::Error& e) {
    outcome.status = e.status();
    outcome.message = e.what();
  }
  return outcome;
}

template <typename Fn>
void run(Fn&& fn) {
  attempt(std::forward<Fn>(fn)).raise();
}

// ---- the engine's devices (bind_devices.cpp) ----

struct EngineDevice {  // zf_engine_device_at
  zf_device device{};
  size_t memory_bytes = 0;  // the device memory the engine needs there
};
EngineDevice device_at(zf_engine* engine, size_t d);
size_t device_count(zf_engine* engine);
// As torch names it: "cpu", "cuda:1".
std::string device_name(const zf_device& device);
// The index argument of the per-device calls: None for the only device, else in
// [0, device_count) (ValueError otherwise).
size_t device_index(zf_engine* engine, const py::object& index);
// The memory argument of attach_device_memory(memory, index = d): a contiguous torch.uint8
// tensor on device d of at least the bytes it needs; returns its address and size (*bytes).
void* device_memory(zf_engine* engine, size_t d, const py::object& memory, size_t* bytes);

// ---- data parallel (bind_collectives.cpp) ----

// The Python callables behind the engine's collectives (engine.h: zf_engine_collectives).
// The engine calls them from inside calls that released the GIL, on the calling thread; each
// trampoline takes the GIL back, passes plain integers and a dtype name, and turns any Python
// exception into an error status whose text last_error returns (the engine's error message
// then carries it).
class PyCollectives {
 public:
  // Checks rank (in [0, world_size)), world_size (>= 1) and that the three are callable:
  // ValueError / TypeError naming the argument.
  PyCollectives(const py::object& rank, const py::object& world_size, py::object all_reduce_sum,
                py::object reduce_scatter_sum, py::object all_gather);
  PyCollectives(const PyCollectives&) = delete;  // the table points at this object
  PyCollectives& operator=(const PyCollectives&) = delete;

  // The table for zf_engine_set_collectives; valid while this object lives.
  const zf_engine_collectives& table() const { return table_; }

 private:
  template <typename Fn>
  zf_status invoke(const char* which, Fn&& fn) noexcept;

  static zf_status all_reduce_trampoline(void* user, void* data, size_t count, zf_dtype dtype, zf_stream stream);
  static zf_status reduce_scatter_trampoline(void* user, const void* in, void* out, size_t count, zf_dtype dtype,
                                             zf_stream stream);
  static zf_status all_gather_trampoline(void* user, const void* in, void* out, size_t count, zf_dtype dtype,
                                         zf_stream stream);
  static const char* last_error_trampoline(void* user);

  py::object all_reduce_sum_, reduce_scatter_sum_, all_gather_;
  std::string error_;
  zf_engine_collectives table_{};
};

// ---- the engine's state as Python (bind_state.cpp) ----

// The engine's state (nothing flushed: engine.h, zf_engine_save_state) as {"params": [one
// dict per parameter, state kind name -> buffer], "schedule": {...}, "loss_scaler": {...}};
// the buffers are CPU torch tensors when the parameters are torch tensors (`torch_params`),
// else numpy arrays.
py::dict save_state(zf_engine* engine, bool torch_params);

// Loads a dict from save_state into the engine, which has `param_count` parameters; names
// what is missing or of the wrong type.
void load_state(zf_engine* engine, const py::object& state, size_t param_count, bool torch_params);

// zf_engine_get_stats as a dict.
py::dict stats_dict(const zf_engine_stats& s);

// param_state_layout: the checkpoint schema of one parameter, from the engine.
void register_engine_state(py::module_& m);

}  // namespace zf_py
